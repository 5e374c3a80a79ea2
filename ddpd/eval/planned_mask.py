"""The mask denoiser driven by the planner's mask (prop:draw_with_maskD).

p(x_1^d | x_t, z^d = N) = E_{z~}[p_mask(x_1^d | x_t masked at z~)] with z~^d = N and
z~^e ~ Bernoulli(p(z^e = N | x_t)) for e != d. One draw z~ of the whole mask serves
every position d where z~^d = N; a position d that must be scored although the draw
left it unmasked is run again with d masked as well (its other positions keep the
draw, which is still a draw from the right law for d). The denoiser's time is
t = alpha^{-1}(1 - #masked / D), as in the sampler.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ddpd.eval.checks import log_probs
from ddpd.process import Schedule


def planned_mask_log_probs(denoiser: Callable, x: Tensor, z_planned: Tensor, extra: Tensor, mask_id: int,
                           schedule: Schedule, vocab_size: int) -> Tensor:
    """Float[B, D, V] log p_mask(. | x masked at z_planned), and at the positions `extra`
    (Bool[B, D], where z_planned is False) log p_mask(. | x masked at z_planned and d).

    The extra rows run in chunks of the batch size B.

    Args:
        denoiser: the mask denoiser.
        x: Long[B, D] tokens.
        z_planned: Bool[B, D], the planned mask.
        extra: Bool[B, D], positions to score with their own mask.
        mask_id: the mask id.
        schedule: the schedule (the denoiser's time from the masked fraction).
        vocab_size: V.

    Returns:
        Float[B, D, V] log-probabilities.
    """
    log_q = masked_log_probs(denoiser, x, z_planned, mask_id, schedule, vocab_size)
    b, d = (extra & ~z_planned).nonzero(as_tuple=True)
    for start in range(0, b.numel(), x.shape[0]):
        bb, dd = b[start:start + x.shape[0]], d[start:start + x.shape[0]]
        rows = torch.arange(bb.numel(), device=x.device)
        mask = z_planned[bb].clone()
        mask[rows, dd] = True
        more = masked_log_probs(denoiser, x[bb], mask, mask_id, schedule, vocab_size)
        log_q = log_q.index_put((bb, dd), more[rows, dd])
    return log_q


def masked_log_probs(denoiser: Callable, x: Tensor, mask: Tensor, mask_id: int, schedule: Schedule,
                     vocab_size: int) -> Tensor:
    """Float[B, D, V] log p_mask(. | x masked at `mask`), at the time of its masked share.

    Args:
        denoiser: the mask denoiser.
        x: Long[B, D] tokens.
        mask: Bool[B, D] the positions masked.
        mask_id: the mask id.
        schedule: the schedule (the denoiser's time from the masked share).
        vocab_size: V.

    Returns:
        Float[B, D, V] log-probabilities.
    """
    masked = torch.where(mask, torch.full_like(x, mask_id), x)
    t = schedule.inverse(1.0 - mask.float().mean(-1)).float()
    return log_probs(denoiser, masked, t, vocab_size, "denoiser")
