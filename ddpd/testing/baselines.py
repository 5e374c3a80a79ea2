"""Plain-torch draws that ddpd's ops are timed against: the usual torch code (softmax +
torch.multinomial, torch.bernoulli, truncation by masking all V logits) and the fastest
torch code for the same law, written once for the benchmarks (benchmarks/bench_*.py,
benchmarks/gpu_timings.py). tests/tools/test_benchmark_baselines.py checks that each draws the
law it stands for, so a baseline cannot be fast by drawing something else.

The fast draws avoid torch.multinomial, whose CPU path draws an exponential variate per
category (slow), and never mask or sort more than they must:
- Gumbel-argmax: argmax(logits / T + G), G = -log(-log U);
- inverse CDF: one uniform per draw scaled to the row's total, searchsorted in the
  cumulative sum of unnormalised weights (exp(y - max) for logits);
- Gumbel-top-k without replacement, as an exponential race: the k smallest of E / w,
  E = -log U standard exponential (the k largest of log U / w, one logarithm a weight
  where log w + G takes three), the law of k sequential draws without replacement;
- truncation by the kept tokens only: torch.topk then a draw among k; sort + cumsum, cut
  at top-p and draw in sorted order; min-p as the logit threshold max + T log(min_p).
Compaction (the rows a sampler keeps): nonzero + index_select, as usual code packs them
(as many rows as are active, a host sync on CUDA), and the job of ddpd.ops.compact_fixed
without a sync (a stable sort, index_select and torch.where).
Ties at a truncation boundary: torch.topk and the sorted cut keep a subset of the tied
tokens where ddpd keeps them all; with continuous logits (the benchmarks') no tie occurs.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

EPS = 0.01  # planner: a row stops when every p < EPS
TORCH = "torch: "  # the benchmarks name a torch variant by this prefix and the candidate's name
# Torch code for a related but different job (less work, other outputs): shown apart, never the
# fastest torch code for ddpd's job
RELATED = "related: "


def _check_temperature(draw: str, temperature: float) -> None:
    """Refuse T <= 0 or NaN: logits / T would be inf or NaN, and some draws still return tokens."""
    if not temperature > 0:
        raise ValueError(f"{draw}: temperature must be > 0, got {temperature}")


def gumbel_like(x: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise shaped like x, -log(-log U) (torch's exponential_ is slower on CPU).

    Args:
        x: any tensor; its shape and device are used.

    Returns:
        Float32 noise of x's shape, on x's device.
    """
    return torch.rand(x.shape, device=x.device).log_().neg_().log_().neg_()


def gumbel_argmax(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """One token per row drawn from softmax(logits / T) by Gumbel-argmax.

    Args:
        logits: [N, V] logits.
        temperature: T > 0.

    Returns:
        Long[N] tokens.

    Raises:
        ValueError: temperature <= 0 or NaN.
    """
    _check_temperature("gumbel_argmax", temperature)
    return (scaled(logits, temperature) + gumbel_like(logits)).argmax(-1)


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T in float32, without the division at T = 1 (ddpd's ops skip it there too).

    Args:
        logits: [N, V] logits.
        temperature: T > 0.

    Returns:
        Float32 [N, V] logits / T (logits itself when it is float32 and T = 1).
    """
    return logits.float() if temperature == 1 else logits.float() / temperature


def inverse_cdf(weights: torch.Tensor, k: int = 1) -> torch.Tensor:
    """k draws with replacement from unnormalised weights: uniforms scaled to each row's
    total, located in the cumulative sum.

    Args:
        weights: [N, V] weights >= 0, a positive total a row.
        k: draws a row.

    Returns:
        Long[N, k] categories.
    """
    cumulative = weights.float().cumsum(-1)
    u = torch.rand(weights.shape[0], k, device=weights.device) * cumulative[:, -1:]
    # u can round up to the total: clamp to the last category (cumulative rounding only)
    return torch.searchsorted(cumulative, u, right=True).clamp_(max=weights.shape[-1] - 1)


def softmax_weights(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Softmax's weights without the division: exp(y - max y), y = logits / T.

    Args:
        logits: [N, V] logits.
        temperature: T > 0.

    Returns:
        Float32 [N, V] weights in (0, 1], 1 at each row's maximum.
    """
    y = scaled(logits, temperature)
    return (y - y.amax(-1, keepdim=True)).exp_()


def softmax_inverse_cdf(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """One token per row from softmax(logits / T) by the inverse CDF.

    Args:
        logits: [N, V] logits.
        temperature: T > 0.

    Returns:
        Long[N] tokens.

    Raises:
        ValueError: temperature <= 0 or NaN.
    """
    _check_temperature("softmax_inverse_cdf", temperature)
    return inverse_cdf(softmax_weights(logits, temperature)).squeeze(-1)


def softmax_multinomial(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """One token per row from softmax(logits / T), as the usual code draws it: softmax +
    torch.multinomial.

    Args:
        logits: [N, V] logits.
        temperature: T > 0.

    Returns:
        Long[N] tokens.

    Raises:
        ValueError: temperature <= 0 or NaN.
    """
    _check_temperature("softmax_multinomial", temperature)
    return torch.multinomial(torch.softmax(scaled(logits, temperature), -1), 1).squeeze(-1)


def gumbel_top_k(weights: torch.Tensor, k: int) -> torch.Tensor:
    """k draws without replacement by the Gumbel-top-k trick written as an exponential race
    (the k smallest of E / w, E = -log U; a zero weight's key is infinite, drawn only when
    fewer than k weights are positive), in the order sequential draws would make them.

    Args:
        weights: [N, V] weights >= 0, at least k positive a row.
        k: draws a row.

    Returns:
        Long[N, k] distinct categories a row.
    """
    # the k largest of log U / w: the race's keys negated, one logarithm a weight
    race = torch.rand(weights.shape, device=weights.device).log_().div_(weights.float())
    return race.topk(k, dim=-1).indices


CATEGORICAL = {  # name -> draw(logits, temperature) of one token per row
    "softmax + torch.multinomial": softmax_multinomial,
    "Gumbel-argmax": gumbel_argmax,
    "inverse CDF": softmax_inverse_cdf,
}


def masked_truncation_multinomial(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                                  top_p: Optional[float] = None, min_p: Optional[float] = None) -> torch.Tensor:
    """A truncated draw as the usual code makes it (Hugging Face's warpers, in their order):
    every V logit divided by T, masked by top-k (torch.topk), top-p (sort + cumsum + mask,
    scattered back) and min-p (softmax threshold), then softmax + torch.multinomial.

    Args:
        logits: [N, V] logits.
        temperature: T > 0.
        top_k: keep the k largest logits (None or 0: no cut).
        top_p: keep the smallest prefix by probability whose mass reaches top_p (None: no cut).
        min_p: keep the tokens of probability >= min_p x the largest (None or 0: no cut).

    Returns:
        Long[N] tokens.

    Raises:
        ValueError: temperature <= 0 or NaN.
    """
    _check_temperature("masked_truncation_multinomial", temperature)
    logits = scaled(logits, temperature)
    if top_k:
        # k >= V is no cut, as Hugging Face's warper clamps it (torch.topk refuses k > V)
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        remove = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(remove, float("-inf")))
    if min_p is not None:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1).squeeze(-1)


def kept_token_draw(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                    top_p: Optional[float] = None, min_p: Optional[float] = None) -> torch.Tensor:
    """The law of masked_truncation_multinomial, drawn among the kept tokens only: top-k
    keeps torch.topk's k candidates (sorted), top-p sorts them (or the row) and keeps the
    prefix whose mass strictly above is < p, min-p keeps y >= max y + log(min_p). In
    sorted order each cut keeps a prefix, so one cumulative sum serves the cuts and the
    draw; min-p alone needs no order, only a threshold.

    Args:
        logits, temperature, top_k, top_p, min_p: as masked_truncation_multinomial's.

    Returns:
        Long[N] tokens.

    Raises:
        ValueError: temperature <= 0 or NaN.
    """
    _check_temperature("kept_token_draw", temperature)
    y = scaled(logits, temperature)
    if not top_k and top_p is None:
        if min_p:  # 0 is no cut, as in ddpd's ops (and log 0 is undefined)
            y = y.masked_fill(y < y.amax(-1, keepdim=True) + math.log(min_p), float("-inf"))
        return inverse_cdf(softmax_weights(y)).squeeze(-1)
    y, ids = y.topk(min(top_k, y.shape[-1]), dim=-1) if top_k else y.sort(dim=-1, descending=True)
    w = softmax_weights(y)
    cumulative = w.cumsum(-1)
    kept = torch.full((y.shape[0], 1), y.shape[-1], device=y.device)
    if top_p is not None:  # over what top-k keeps (renormalised), as Hugging Face and ddpd do
        kept = (cumulative - w < top_p * cumulative[:, -1:]).sum(-1, keepdim=True)
    if min_p:
        kept = torch.minimum(kept, (y >= y[:, :1] + math.log(min_p)).sum(-1, keepdim=True))
    u = torch.rand(kept.shape, device=y.device) * cumulative.gather(-1, kept - 1)
    # at most the last kept token: u at the top of its range would pass the cut
    j = torch.minimum(torch.searchsorted(cumulative, u, right=True), kept - 1)
    return ids.gather(-1, j).squeeze(-1)


TRUNCATED = {  # name -> draw(logits, temperature, top_k=, top_p=, min_p=) of one token per row
    "masked V + torch.multinomial": masked_truncation_multinomial,
    "kept tokens + inverse CDF": kept_token_draw,
}


# Planner draws: a position with probability p_d / sum p (p = sigmoid(planner logits)),
# and the mask coins z_d ~ Bernoulli(p_d).
SELECT: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {  # (logits, p) -> positions [N]
    "torch.multinomial": lambda logits, p: torch.multinomial(p, 1).squeeze(-1),
    "inverse CDF": lambda logits, p: inverse_cdf(p).squeeze(-1),
    "Gumbel-argmax": lambda logits, p: gumbel_argmax(F.logsigmoid(logits)),
}
COIN: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # p -> bool z
    "torch.bernoulli": lambda p: torch.bernoulli(p).bool(),
    "rand < p": lambda p: torch.rand_like(p) < p,
}


def planner_select(logits: torch.Tensor, select: str) -> tuple:
    """The planner's draw of one position a row, p = sigmoid(logits), as ddpd.ops.planner_select.

    Args:
        logits: [N, D] planner logits.
        select: a name of SELECT, the torch code that draws the position.

    Returns:
        (positions Long[N, 1], sum p Float[N], stop Bool[N]: every p below EPS).
    """
    return _selected(logits, torch.sigmoid(logits), select)


def _selected(logits: torch.Tensor, p: torch.Tensor, select: str) -> tuple:
    # p passed in: planner_select_mask's torch code computes the sigmoid once, as ddpd's op does
    return SELECT[select](logits, p)[:, None], p.sum(-1), (p < EPS).all(-1)


def planner_select_mask(logits: torch.Tensor, x: torch.Tensor, mask_id: int, select: str, coin: str) -> tuple:
    """planner_select's draw, then the mask of prop:draw_with_maskD (z_d ~ Bernoulli(p_d), the
    chosen position always masked), as ddpd.ops.planner_select_mask.

    Args:
        logits: [N, D] planner logits.
        x: Long[N, D] tokens.
        mask_id: the mask token.
        select: a name of SELECT (the position's draw).
        coin: a name of COIN (the mask coins' draw).

    Returns:
        (positions, sum p, stop, masked x, z Bool[N, D], count Long[N] of z).
    """
    p = torch.sigmoid(logits)
    selected = _selected(logits, p, select)
    return (*selected, *planner_mask(logits, x, selected[0], mask_id, coin, p))


def planner_mask(logits: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, mask_id: int, coin: str,
                 p: Optional[torch.Tensor] = None) -> tuple:
    """The mask of prop:draw_with_maskD for given positions, as ddpd.ops.planner_mask: z_d ~
    Bernoulli(p_d), p = sigmoid(logits), each row's chosen positions always masked.

    Args:
        logits: [N, D] planner logits.
        x: Long[N, D] tokens.
        positions: Long[N, k] the chosen positions.
        mask_id: the mask token.
        coin: a name of COIN (the coins' draw).
        p: sigmoid(logits), where the caller has it.

    Returns:
        (masked x, z Bool[N, D], count Long[N] of z).
    """
    z = COIN[coin](torch.sigmoid(logits) if p is None else p).scatter_(1, positions, True)
    return torch.where(z, mask_id, x), z, z.sum(-1)


PLANNER_MASK = {  # name -> (select, coin)
    "torch.multinomial + torch.bernoulli": ("torch.multinomial", "torch.bernoulli"),
    "inverse CDF + rand < p": ("inverse CDF", "rand < p"),
    "Gumbel-argmax + rand < p": ("Gumbel-argmax", "rand < p"),
}


def gathered_step(planner_logits: torch.Tensor, x: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                  bias: Optional[torch.Tensor], mask_id: int, draw: Callable) -> tuple:
    """One DDPD step with a mask denoiser in plain torch, the head applied only at the
    chosen positions: planner draw and mask, the chosen rows of the hidden states,
    linear + draw, scatter. The draw has no default: which of CATEGORICAL's is fastest
    depends on the device, so the benchmarks time each.

    Args:
        planner_logits: [B, D] planner logits.
        x: Long[B, D] tokens.
        hidden: [B, D, H] the denoiser's final hidden states.
        weight, bias: the output head, [V, H] and [V] (or None).
        mask_id: the mask token.
        draw: the draw of one token a row from [B, V] logits (a value of CATEGORICAL).

    Returns:
        (x with the new tokens, masked x, stop).
    """
    positions, _, stop, masked, _, _ = planner_select_mask(planner_logits, x, mask_id, "inverse CDF", "rand < p")
    chosen = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden.shape[2])).squeeze(1)
    tokens = draw(F.linear(chosen, weight, bias))
    return x.scatter(1, positions, tokens[:, None]), masked, stop


def nonzero_compact(active: torch.Tensor, *tensors: torch.Tensor) -> tuple:
    """The active rows of each tensor by nonzero + index_select, as the usual code packs them:
    as many rows as are active, a count that a CUDA device must send to the host (a sync).

    Args:
        active: Bool[B] the rows to keep.
        *tensors: tensors of B rows.

    Returns:
        (tuple of the [n, ...] active rows in order, Long[n] their source rows).
    """
    index = active.nonzero().squeeze(1)
    return tuple(t.index_select(0, index) for t in tensors), index


def sorted_compact(active: torch.Tensor, capacity: int, *tensors: torch.Tensor) -> tuple:
    """ddpd.ops.compact_fixed's job in plain torch without a host sync: a stable sort of
    ~active puts the active rows first, index_select takes the first capacity rows and
    torch.where zeroes the slots past the count.

    Args:
        active: Bool[B] the rows to keep, B >= 1.
        capacity: rows of the outputs, 1 <= capacity <= B.
        *tensors: tensors of B rows on active's device.

    Returns:
        (tuple of [capacity, ...] packed rows, zeros past the count; index Long[capacity],
        -1 past the count; count Long[]), as compact_fixed returns them.
    """
    count = active.sum()
    source = torch.sort((~active).to(torch.uint8), stable=True).indices[:capacity]
    taken = torch.arange(capacity, device=active.device) < count
    packed = tuple(torch.where(taken.view(-1, *[1] * (t.dim() - 1)), t.index_select(0, source), 0)
                   for t in tensors)
    return packed, torch.where(taken, source, -1), count


COMPACT = {  # name -> compact(active, capacity, *tensors): compact_fixed's job
    "sort + index_select": sorted_compact,
}
# the usual code compact_fixed replaces: only the active rows, no count, a host sync on CUDA
COMPACT_RELATED = {
    "nonzero + index_select": lambda active, capacity, *tensors: nonzero_compact(active, *tensors),
}
