"""How well a planner tells wrong tokens from right ones, on its own corruption and on a
parallel decoder's.

The planner is trained on uniform noise (a position replaced by a uniformly drawn token).
A parallel decoder's mistakes are of another kind: every masked position drawn at once
from the mask denoiser, each plausible on its own. `error_detection` corrupts held-out
text both ways at one fraction and scores the planner's noise logits as a detector of the
wrong positions (area under the ROC curve), beside the detector a confidence policy
already has: the denoiser's own probability of the token it drew. docs/parallel.md
reports it for the bundled networks.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.eval.checks import check_tokens, planner_logits
from ddpd.eval.planned_mask import masked_log_probs
from ddpd.eval.report import markdown_table
from ddpd.ops.rng import gumbel
from ddpd.process import Schedule, get_schedule
from ddpd.validation import check_float, check_int, check_shape, check_tensor


@dataclass(frozen=True)
class Detection:
    """The areas under the ROC curve (0.5: chance, 1: perfect) at one corruption fraction.

    uniform: the planner on uniform noise, every position scored.
    drawn: the positions drawn in parallel; parallel_wrong: the share of them that differ
        from the text.
    parallel: the planner on the parallel draws, among the drawn positions.
    confidence: the denoiser's probability of its draw, low first, among the drawn positions.
    combined: both read as log-odds of a wrong draw and summed, the planner's logit plus
        log((1 - c) / c) for the draw's probability c: what a policy using both would rank by.
    confident_wrong: the wrong draws among the more confident half of the draws, those a
        confidence policy commits first; confident_planner, confident_confidence,
        confident_combined: the three detectors there.
    """

    fraction: float
    uniform: float
    drawn: int
    parallel_wrong: float
    parallel: float
    confidence: float
    combined: float
    confident_wrong: int
    confident_planner: float
    confident_confidence: float
    confident_combined: float


def auc(score: Tensor, positive: Tensor) -> float:
    """Area under the ROC curve of `score` as a detector of `positive`: the chance that a
    positive entry scores above a negative one, ties counting half (Mann-Whitney U).

    Args:
        score: Float[...] scores, higher for positive.
        positive: Bool[...] the labels, same shape.

    Returns:
        The area in [0, 1]; NaN without a positive or a negative entry.

    Raises:
        TypeError: score not a floating tensor, or positive not a bool tensor.
        ValueError: positive of another shape than score, or a NaN score.
    """
    check_tensor("score", score, (torch.float16, torch.bfloat16, torch.float32, torch.float64))
    check_tensor("positive", positive, (torch.bool,))
    check_shape("positive", positive, score.shape)
    if bool(score.isnan().any()):  # a NaN would rank above every score and pass for a detection
        raise ValueError("score must not hold NaN")
    score, positive = score.flatten().double(), positive.flatten()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = torch.unique(score, return_inverse=True, return_counts=True)
    counts = counts.double()
    rank = (counts.cumsum(0) - (counts - 1.0) / 2.0)[inverse]  # average rank of tied scores, from 1
    return float((rank[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def parallel_draws(denoiser: Callable, x: Tensor, chosen: Tensor, mask_id: int, schedule: Union[str, Schedule],
                   vocab_size: int, generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor]:
    """One draw of the mask denoiser at every position of `chosen` at once, all of them masked:
    a parallel decoder's step from x.

    Args:
        denoiser: the mask denoiser, denoiser(x, t) -> Float[B, D, V].
        x: Long[B, D] tokens.
        chosen: Bool[B, D] the positions masked and drawn.
        mask_id: the mask token, V or above.
        schedule: the denoiser's schedule (its time from the masked share), a Schedule or its name.
        vocab_size: V.
        generator: the draws' randomness.

    Returns:
        (Long[B, D] a token drawn at every position, read where `chosen`; Float[B, D, V] the
        laws they were drawn from, as log-probabilities).

    Raises:
        TypeError: x not a Long tensor, chosen not a Bool tensor, vocab_size or mask_id not an int,
            or schedule neither a name nor a Schedule.
        ValueError: x not [B, D], chosen of another shape, an unknown schedule, or a mask_id below V
            (a token read as the mask would mask that token).
    """
    mask_id = check_int("mask_id", mask_id, check_int("vocab_size", vocab_size, 1))
    check_tokens("x", x, None)
    check_tensor("chosen", chosen, (torch.bool,))
    check_shape("chosen", chosen, x.shape)
    schedule = get_schedule(schedule)
    log_q = masked_log_probs(denoiser, x, chosen, mask_id, schedule, vocab_size)
    u = 1.0 - torch.rand(log_q.shape, generator=generator, device=x.device, dtype=log_q.dtype)  # in (0, 1]
    return (log_q + gumbel(u)).argmax(-1), log_q  # Gumbel-max: one draw of each position's law


def error_detection(planner: Callable, denoiser: Callable, x1: Tensor, fraction: float, mask_id: int,
                    schedule: Union[str, Schedule], vocab_size: int,
                    generator: Optional[torch.Generator] = None) -> Detection:
    """Corrupt x1 at `fraction` of its positions (chosen at random) with uniform noise, and
    apart with one parallel draw of the mask denoiser at those positions, and score the
    planner and the denoiser's confidence as detectors of the positions left wrong.

    Args:
        planner: planner(x) -> Float[B, D] logits of z^d = N (time-free).
        denoiser: the mask denoiser, denoiser(x, t) -> Float[B, D, V].
        x1: Long[B, D] clean text.
        fraction: the share of positions corrupted, in (0, 1).
        mask_id: the mask token, V or above.
        schedule: the denoiser's schedule (its time from the masked share), a Schedule or its name.
        vocab_size: V.
        generator: the randomness (positions, noise, draws).

    Returns:
        The Detection.

    Raises:
        TypeError: x1 not a Long tensor, fraction not a number, vocab_size or mask_id not an int, or
            schedule neither a name nor a Schedule.
        ValueError: a fraction outside (0, 1), a mask_id below V, x1 not [B, D] or its tokens outside
            [0, V), or an unknown schedule.
    """
    fraction = check_float("fraction", fraction, 0.0, 1.0, open_min=True, open_max=True)
    mask_id = check_int("mask_id", mask_id, check_int("vocab_size", vocab_size, 1))
    x1 = check_tokens("x1", x1, vocab_size)
    schedule = get_schedule(schedule)  # before the planner runs
    rand = torch.rand(x1.shape, generator=generator, device=x1.device)
    chosen = rand < fraction
    noise = torch.randint(0, vocab_size, x1.shape, generator=generator, device=x1.device)
    uniform = torch.where(chosen, noise, x1)
    uniform_auc = auc(planner_logits(planner, uniform, None), uniform != x1)

    drawn, log_q = parallel_draws(denoiser, x1, chosen, mask_id, schedule, vocab_size, generator)
    parallel = torch.where(chosen, drawn, x1)
    wrong = (parallel != x1)[chosen]
    planned = planner_logits(planner, parallel, None)[chosen]
    log_c = log_q.gather(-1, drawn[..., None]).squeeze(-1)[chosen]
    doubt = torch.log(-torch.expm1(log_c).clamp(max=-torch.finfo(log_c.dtype).tiny)) - log_c  # log((1 - c) / c)
    combined = planned + doubt
    confident = doubt <= doubt.median()
    return Detection(fraction, uniform_auc, wrong.numel(), float(wrong.double().mean()), auc(planned, wrong),
                     auc(doubt, wrong), auc(combined, wrong), int(wrong[confident].sum()),
                     auc(planned[confident], wrong[confident]), auc(doubt[confident], wrong[confident]),
                     auc(combined[confident], wrong[confident]))


def detection_rows(planner: Callable, denoiser: Callable, x1: Tensor, fractions: Sequence[float], mask_id: int,
                   schedule: Union[str, Schedule], vocab_size: int, seed: int) -> list[dict]:
    """error_detection at each fraction in turn, without gradients, from one generator seeded by
    `seed`: the same seed gives the same corruption and draws to any planner.

    Args:
        planner, denoiser, x1, mask_id, schedule, vocab_size: as error_detection.
        fractions: the shares of positions corrupted.
        seed: the generator's seed.

    Returns:
        A row a fraction, Detection's fields by name.

    Raises:
        TypeError, ValueError: as error_detection, or a seed that is not an int in [0, 2**64).
    """
    check_tokens("x1", x1, None)  # before its device is read
    generator = torch.Generator(device=x1.device).manual_seed(check_int("seed", seed, 0, 2**64 - 1))
    with torch.no_grad():
        return [asdict(error_detection(planner, denoiser, x1, fraction, mask_id, schedule, vocab_size,
                                                   generator)) for fraction in fractions]


def detection_table(rows: Sequence[dict]) -> str:
    """A markdown table of detection rows (and any columns added to them): counts as integers,
    areas and shares to three digits.

    Args:
        rows: dicts of equal keys, as detection_rows gives.

    Returns:
        The table.

    Raises:
        ValueError: no row (the columns are the first row's keys).
    """
    if len(rows) == 0:  # rows[0] raised a bare IndexError
        raise ValueError("rows must hold at least one detection row (the columns are its keys), got none")
    return markdown_table(rows, [(name, name, "d" if isinstance(value, int) else ".3f")
                                 for name, value in rows[0].items()])
