"""Seeded draws of the forward process for evaluation, and the forced-noise corruption.

Every uniform is a pure function of (seed, Monte-Carlo sample, stream, sequence id,
column), so an estimate does not depend on the batch. `marginal_corruption` draws the
forward marginal at level alpha (eq. corruption_flow); `forced_corruption` also forces
one uniformly drawn position to be noise, which bounds the ELBO's integrand
(ddpd.eval.elbo).

docs/evaluation.md ("Seeded corruption") has the law and why."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ddpd.ops.rng import check_seed, philox_uniform
from ddpd.process import uniform_token

# Streams of one Monte-Carlo sample; the offset of a draw is sample * NUM_STREAMS + stream.
ALPHA = 0  # the corruption level alpha (stratified over the samples)
POSITION = 1  # the forced noisy position d*
NOISE = 2  # z^d ~ Bernoulli(1 - alpha)
VALUE = 3  # the uniform values at noisy positions
PLANNED_MASK = 4  # the planner-drawn mask of prop:draw_with_maskD
CLEAN_TIME = 5  # the time of the all-clean part of the rate-matching term
FINAL_NOISE = 6  # the corruption at t_max for the final emission
FINAL_VALUE = 7
FINAL_MASK = 8
NUM_STREAMS = 16  # room for more streams without moving existing offsets

NOISE_KINDS = ("uniform", "mask")


class EvalNoise:
    """Uniforms in (0, 1] (as philox_uniform draws them) for evaluation, deterministic in (seed,
    sample, stream, row id, column)."""

    def __init__(self, seed: int):
        self.seed, _ = check_seed(seed, 0)

    def uniform(self, sample: int, stream: int, rows: Tensor, cols: int) -> Tensor:
        """Float32[len(rows), cols].

        Args:
            sample: the Monte-Carlo sample.
            stream: the stream (what the uniforms are for).
            rows: Long[R] sequence ids.
            cols: uniforms a row.

        Returns:
            Float32[len(rows), cols].
        """
        offset = (sample * NUM_STREAMS + stream) % 2**64
        return philox_uniform(self.seed, offset, rows, cols, device=rows.device)

    def stratified(self, sample: int, samples: int, stream: int, rows: Tensor) -> Tensor:
        """Float32[len(rows)] in the stratum ((sample + u) / samples): over `samples`
        draws each row covers (0, 1] evenly, a variance reduction for integrals over it.

        Args:
            sample: the Monte-Carlo sample, in [0, samples).
            samples: the number of Monte-Carlo samples.
            stream: the stream.
            rows: Long[R] sequence ids.

        Returns:
            Float32[len(rows)].
        """
        u = self.uniform(sample, stream, rows, 1)[:, 0]
        return (sample + u) / samples

    def __repr__(self) -> str:
        return f"EvalNoise(seed={self.seed})"


def _noisy_values(x1: Tensor, z: Tensor, u_value: Tensor, noise: str, vocab_size: int,
                  mask_id: Optional[int]) -> Tensor:
    if noise == "mask":
        fill = torch.full_like(x1, vocab_size if mask_id is None else mask_id)
    else:
        fill = uniform_token(u_value, vocab_size)
    return torch.where(z, fill, x1)


def marginal_corruption(x1: Tensor, alpha: Tensor, u_noise: Tensor, u_value: Tensor, noise: str,
                        vocab_size: int, mask_id: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """(x_t, z_t) ~ p_{t|1}: z^d = N iff u_noise^d >= alpha (the convention of ddpd.process.corrupt).

    Args:
        x1: Long[B, D] clean tokens.
        alpha: Float[B] corruption levels.
        u_noise: Float[B, D] uniforms deciding z.
        u_value: Float[B, D] uniforms of the noise values.
        noise: "uniform" or "mask".
        vocab_size: V.
        mask_id: the mask id of mask noise; None: V.

    Returns:
        (x_t Long[B, D], z_t Bool[B, D]).
    """
    z = u_noise >= alpha[:, None]
    return _noisy_values(x1, z, u_value, noise, vocab_size, mask_id), z


def forced_corruption(x1: Tensor, alpha: Tensor, u_position: Tensor, u_noise: Tensor, u_value: Tensor,
                      noise: str, vocab_size: int,
                      mask_id: Optional[int] = None) -> tuple[Tensor, Tensor, Tensor]:
    """(x_t, z_t, k): the marginal corruption with position d* = floor(u_position * D)
    forced to be noise; k = Long[B] number of noisy positions (>= 1).

    Args:
        x1: Long[B, D] clean tokens.
        alpha: Float[B] corruption levels.
        u_position: Float[B] uniforms of the forced position.
        u_noise: Float[B, D] uniforms deciding z.
        u_value: Float[B, D] uniforms of the noise values.
        noise: "uniform" or "mask".
        vocab_size: V.
        mask_id: the mask id of mask noise; None: V.

    Returns:
        (x_t Long[B, D], z_t Bool[B, D], k Long[B]).
    """
    length = x1.shape[1]
    forced = (u_position * length).long().clamp_(max=length - 1)
    z = (u_noise >= alpha[:, None]).scatter(1, forced[:, None], True)
    return _noisy_values(x1, z, u_value, noise, vocab_size, mask_id), z, z.sum(-1)
