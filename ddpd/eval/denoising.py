"""Denoising performance at a fixed corruption level (the paper's table 'Denoising
performance in bits-per-character', accuracy at alpha = 0.85).

Clean tokens are corrupted once at level alpha (the same z for every denoiser, so the
comparison is paired), and each denoiser ('uniform', 'uniform-denoiser',
'mask-denoiser', 'mask-denoiser-planner') is scored at the noisy positions: summed
cross-entropy in nats, the number of noisy positions and how many its argmax gets right.

docs/evaluation.md ("Denoising at a fixed level") describes each denoiser."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.eval import corruption as C
from ddpd.eval.checks import (
    at,
    check_callable,
    check_choice,
    check_int,
    check_row_ids,
    check_tokens,
    log_probs,
    planner_logits,
)
from ddpd.eval.planned_mask import planned_mask_log_probs
from ddpd.ops.rng import happens
from ddpd.process import Schedule, denoiser_log_prob_from_uniform, get_schedule
from ddpd.validation import check_float

KINDS = ("uniform", "uniform-denoiser", "mask-denoiser", "mask-denoiser-planner")
DEFAULT_ALPHA = 0.85


@dataclass
class DenoisingStats:
    """Per sequence, Float[B] each: nats = sum of -log p(x_1^d | .) over the noisy
    positions, noisy = their number, correct = how many the argmax gets right."""

    nats: Tensor
    noisy: Tensor
    correct: Tensor


def denoising_stats(
    kind: str,
    denoiser: Callable,
    x1: Tensor,
    vocab_size: int,
    *,
    alpha: float = DEFAULT_ALPHA,
    planner: Optional[Callable] = None,
    mask_id: Optional[int] = None,
    schedule: Union[str, Schedule] = "linear",
    seed: int = 0,
    row_ids: Optional[Tensor] = None,
) -> DenoisingStats:
    """Cross-entropy and accuracy of a denoiser at the noisy positions of x1 corrupted at alpha.

    kind: one of KINDS; denoiser(x, t) -> Float[B, D, V] logits (the uniform model for
    'uniform'); planner(x) -> Float[B, D] logits, needed for 'mask-denoiser-planner'.
    The denoiser's time input is t = alpha^{-1}(alpha) (for the planner's mask:
    alpha^{-1}(1 - #masked / D), as in the sampler).

    Args:
        kind: one of KINDS.
        denoiser: the denoiser (the uniform model for "uniform").
        x1: Long[B, D] clean tokens in [0, vocab_size).
        vocab_size: V.
        alpha: the corruption level.
        planner: the planner, for "mask-denoiser-planner".
        mask_id: the mask denoiser's mask id; None: V.
        schedule: "linear", "cosine" or a Schedule.
        seed: the seed of every uniform.
        row_ids: Long[B] random-stream ids; None: 0..B-1.

    Returns:
        DenoisingStats: per sequence, the summed cross-entropy in nats, the noisy
        positions and the correct argmaxes.

    Raises:
        ValueError, TypeError: an unknown kind, a missing planner, invalid tokens or alpha.
    """
    check_choice("kind", kind, KINDS)
    check_callable("denoiser", denoiser)
    vocab_size = check_int("vocab_size", vocab_size, 2)
    check_tokens("x1", x1, vocab_size)
    alpha = check_float("alpha", alpha, 0.0, 1.0, open_min=True, open_max=True)
    if kind == "mask-denoiser-planner":
        check_callable("planner", planner)
    mask_id = vocab_size if mask_id is None else check_int("mask_id", mask_id, vocab_size)
    schedule = get_schedule(schedule)
    rows = check_row_ids(row_ids, x1.shape[0], x1.device)
    noise = C.EvalNoise(seed)
    length = x1.shape[1]
    a = torch.full((x1.shape[0],), alpha, device=x1.device)
    x_t, z = C.marginal_corruption(x1, a, noise.uniform(0, C.NOISE, rows, length),
                                   noise.uniform(0, C.VALUE, rows, length), "uniform", vocab_size)
    t = schedule.inverse(a).float()
    if kind == "uniform":
        log_q = denoiser_log_prob_from_uniform(log_probs(denoiser, x_t, t, vocab_size, "denoiser"), x_t, a)
    elif kind == "uniform-denoiser":
        log_q = log_probs(denoiser, x_t, t, vocab_size, "denoiser")
    elif kind == "mask-denoiser":
        masked = torch.where(z, torch.full_like(x_t, mask_id), x_t)
        log_q = log_probs(denoiser, masked, t, vocab_size, "denoiser")
    else:
        p_z = torch.sigmoid(planner_logits(planner, x_t, None))
        z_planned = happens(noise.uniform(0, C.PLANNED_MASK, rows, length), p_z)  # p = 1 masks at u = 1 too
        log_q = planned_mask_log_probs(denoiser, x_t, z_planned, z, mask_id, schedule, vocab_size)
    return _stats(log_q, x1, z)


def _stats(log_q: Tensor, x1: Tensor, z: Tensor) -> DenoisingStats:
    zero = torch.zeros_like(x1, dtype=torch.float32)
    nats = torch.where(z, -at(log_q, x1), zero).sum(-1)
    correct = torch.where(z, (log_q.argmax(-1) == x1).float(), zero).sum(-1)
    return DenoisingStats(nats, z.float().sum(-1), correct)
