"""The per-step pieces every sampler is built from, each taking its noise explicitly.

A fused implementation of a sampler can be checked against these functions draw for
draw: they are pure functions of model outputs and uniforms from a NoiseSource.

- `select_positions`: the Plan step of Algorithm 1 (alg:sampling): k positions drawn
  without replacement with probability proportional to the selection weights, by
  Gumbel-top-k (k = 1 is the Gumbel-max draw d' ~ Cat(weights)).
- `selection_log_weights`: the weights of prop:self-loop-jumps, p(z^d = N | x_t)
  (option A, sigmoid of the planner logit) or the listing's option C, softmax of
  the logits over positions.
- `draw_mask`: z ~ prod_d Bernoulli(p(z^d = N | x_t)) with the chosen positions
  always masked, the approximation of p(z | x_t, z^d = N) below prop:draw_with_maskD.
- `sample_categorical`: Gumbel-max draw from softmax(logits / temperature),
  temperature 0 is the argmax; for more than TILE tokens the two-level (tile, then
  token) Gumbel-max of ddpd.ops.sample_categorical, so that the op drawing from the
  same uniforms draws the same token. `token_noise_width`: the uniforms one draw
  reads. `denoise_positions`: the Denoise step of Algorithm 1, a draw at each
  chosen position.
- `planner_time`, `mask_time`: the time estimates t = alpha^{-1}(1 - sum_d p_d / D)
  (section 'Adaptive Time Correction') and t = alpha^{-1}(1 - #masked / D).
- `temperature_at`: a fixed or linearly annealed logit temperature.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ddpd.ops.sample_categorical import TILE, draw_from_logits, noise_width
from ddpd.process import Schedule
from ddpd.sampling.noise import gumbel

SELECTIONS = ("sigmoid", "softmax")


def selection_log_weights(planner_logits: Tensor, selection: str) -> Tensor:
    """Log of the (unnormalised) weights with which positions are chosen, [B, D].

    'sigmoid' (option A): weight p(z^d = N | x_t) = sigmoid(logit), as in
    prop:self-loop-jumps. 'softmax' (option C): weight softmax over positions of the
    logits; softmax and exp(logit) differ by a per-row constant, which a draw ignores.
    """
    if selection == "sigmoid":
        return F.logsigmoid(planner_logits)
    if selection == "softmax":
        return planner_logits
    raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")


def select_positions(log_weights: Tensor, u: Tensor, k: int = 1) -> tuple[Tensor, Tensor]:
    """k positions per row without replacement, P proportional to exp(log_weights).

    Gumbel-top-k: the k largest log_weights + Gumbel(u) are an ordered draw without
    replacement (successive sampling). log_weights, u: [B, D].
    Returns (positions Long[B, k], valid Bool[B, k]); a position is invalid when its
    weight is zero, which happens only when fewer than k positions have weight; an
    invalid choice must change nothing.
    """
    scores = log_weights + gumbel(u)
    positions = scores.topk(k, dim=-1).indices
    valid = log_weights.gather(-1, positions) > float("-inf")
    return positions, valid


def draw_mask(planner_p: Tensor, u: Tensor, positions: Tensor) -> Tensor:
    """z (True = noise, to be masked) for the mask denoiser of prop:draw_with_maskD.

    z^d ~ Bernoulli(p(z^d = N | x_t)) independently (z^d = N iff u^d < p^d), and the
    positions being denoised are always masked: they are noise by the premise
    z^{d'} = N of the proposition. planner_p, u: [B, D]; positions: Long[B, k].
    """
    z = u < planner_p
    return z.scatter(-1, positions, True)


def token_noise_width(vocab_size: int) -> int:
    """Uniforms one categorical draw over vocab_size tokens reads (the last axis of its u).

    Column j drives token j; with more than TILE tokens, column V + t drives tile t
    (the layout of ddpd.ops.sample_categorical). A single tile needs no tile uniform.
    """
    return vocab_size if vocab_size <= TILE else noise_width(vocab_size)


def sample_categorical(logits: Tensor, u: Tensor, temperature: float = 1.0) -> Tensor:
    """One draw per row of softmax(logits / temperature) over the last axis.

    Gumbel-max: argmax_j (logits_j / T + G_j) with G_j = gumbel(u_j); temperature 0
    is the argmax of the logits. Logits of -inf are never drawn. u: [..., W] with
    W = token_noise_width(V). Above TILE tokens the race is two-level: tile t wins
    with key logsumexp(tile t) + G'_t (G'_t from column V + t), then the token wins
    inside that tile; P(j) = P(tile of j) P(j | tile) = softmax_j, exactly.
    """
    if temperature == 0:
        return logits.argmax(-1)
    x = logits / temperature
    vocab = x.shape[-1]
    if vocab <= TILE:
        return (x + gumbel(u)).argmax(-1)
    tokens, _ = draw_from_logits(x.reshape(-1, vocab), u.reshape(-1, u.shape[-1]))
    return tokens.view(x.shape[:-1])


def denoise_positions(x: Tensor, logits: Tensor, positions: Tensor, valid: Tensor, u: Tensor,
                      temperature: float = 1.0) -> Tensor:
    """The Denoise step: x with each chosen position redrawn from its logits.

    x: Long[B, D]; logits: Float[B, D, V] (only the chosen positions are read);
    positions, valid: [B, k] from select_positions; u: [B, k, token_noise_width(V)] uniforms.
    The k draws are independent given x, each from its own position's distribution.
    """
    picked = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))
    tokens = sample_categorical(picked, u, temperature)
    tokens = torch.where(valid, tokens, x.gather(1, positions))
    return x.scatter(1, positions, tokens)


def planner_time(planner_p: Tensor, schedule: Schedule) -> Tensor:
    """t = alpha^{-1}(1 - sum_d p(z^d = N | x_t) / D): the planner's estimate of the time."""
    return schedule.inverse((1.0 - planner_p.mean(-1)).clamp(0.0, 1.0))


def mask_time(z: Tensor, schedule: Schedule) -> Tensor:
    """t = alpha^{-1}(1 - #masked / D): the time of a masked sequence with mask pattern z."""
    return schedule.inverse(1.0 - z.to(torch.float32).mean(-1))


def temperature_at(step: int, steps: int, start: float, end: float) -> float:
    """Logit temperature at `step` of `steps`: linear from start (first step) to end (last)."""
    if steps <= 1:
        return start
    return start + (end - start) * step / (steps - 1)
