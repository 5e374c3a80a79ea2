"""The random draws of a sampler step done by the ddpd.ops sampling ops, from the sampler's noise source.

The ops draw exactly what the reference step functions (ddpd.sampling.steps) draw
from the same uniforms; what this module adds is where the uniforms come from, so
that a fused step reads the very uniforms the reference step reads:

- with a PhiloxNoise source, an op whose uniforms are one Philox row per sampler
  row (the plan step, and the token draw of one position per row) generates them
  in the kernel from (seed, offset of the step and stream, row id + first_row),
  the counters PhiloxNoise.uniform uses; nothing is written to memory;
- otherwise (another source, or k > 1 token draws per row, whose k * W uniforms sit
  in one row of the stream) the uniforms are drawn from the source, in the
  reference's order and shapes, and passed to the op as explicit `noise`.

Token draws: `draw_at` draws the tokens at chosen positions, through the
denoiser's output head at those positions only (ddpd.ops.sample_from_hidden) when
the denoiser exposes hidden(x, t) and head, else from the gathered rows of its
logits (ddpd.ops.sample_categorical); `draw_everywhere` draws at every position
from full logits (the baselines).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ddpd.ops.planner_mask import planner_select_mask
from ddpd.ops.planner_select import planner_select
from ddpd.ops.sample_categorical import noise_width, sample_categorical
from ddpd.ops.sample_from_hidden import sample_from_hidden
from ddpd.sampling.common import RunningBatch
from ddpd.sampling.fused_batch import FusedBatch, has_head
from ddpd.sampling.noise import MASK, NUM_STREAMS, SELECT, TOKEN, NoiseSource, PhiloxNoise
from ddpd.sampling.steps import token_noise_width


class OpDraws:
    """Keyword arguments that make an op read a step's uniforms from `noise`."""

    def __init__(self, noise: NoiseSource):
        self.noise = noise
        self.philox = isinstance(noise, PhiloxNoise)

    def _stream(self, step: int, stream: int, rows: Tensor) -> dict:
        """The counters of PhiloxNoise.uniform(step, stream, rows, .) as an op's seed, offset and row ids."""
        offset = (self.noise.offset + step * NUM_STREAMS + stream) % 2**64
        return dict(seed=self.noise.seed, offset=offset, row_ids=rows + self.noise.first_row)

    def plan(self, step: int, logits: Tensor, rows: Tensor, k: int, selection: str, eps: float):
        """planner_select on the step's SELECT uniforms: (positions [B, k], sum_p [B], stop [B])."""
        if self.philox:
            stream = self._stream(step, SELECT, rows)
        else:
            stream = dict(noise=self.noise.uniform(step, SELECT, rows, logits.shape[1]))
        return planner_select(logits, k, selection, eps=eps, **stream)

    def plan_mask(self, step: int, logits: Tensor, x: Tensor, mask_id: int, rows: Tensor, k: int, selection: str,
                  eps: float):
        """planner_select_mask on the SELECT and MASK uniforms:
        (positions, sum_p, stop, masked x [B, D], z [B, D], count [B])."""
        if self.philox:  # the op reads the mask at offset + 1, the MASK stream (MASK = SELECT + 1)
            stream = self._stream(step, SELECT, rows)
        else:
            length = logits.shape[1]
            stream = dict(noise=self.noise.uniform(step, SELECT, rows, length),
                          mask_noise=self.noise.uniform(step, MASK, rows, length))
        return planner_select_mask(logits, x, mask_id, k, selection, eps=eps, **stream)

    def tokens(self, step: int, rows: Tensor, per_row: int, vocab_size: int) -> dict:
        """The TOKEN uniforms of `per_row` draws in each row, as op arguments for len(rows) * per_row op rows."""
        if self.philox and per_row == 1:
            return self._stream(step, TOKEN, rows)
        width = token_noise_width(vocab_size)
        u = self.noise.uniform(step, TOKEN, rows, per_row * width).view(-1, width)
        if width < noise_width(vocab_size):
            # A single tile: the op's tile column takes part in a race of one, any value will do.
            u = torch.cat([u, torch.full_like(u[:, :1], 0.5)], 1)
        return dict(noise=u)


def draw_at(batch: FusedBatch, denoiser: Callable, x: Tensor, t: Tensor, positions: Tensor, vocab_size: int,
            temperature: float, stream: dict) -> Tensor:
    """Long[B, k]: a token from the denoiser's p(x_1^d | x, t) at each of positions (Long[B, k]).

    With hidden(x, t) and head, the head runs at the B * k chosen positions only;
    a plain callable's logits [B, D, V] are gathered at the positions instead.
    Temperature 0 takes the argmax (no uniform is read).
    """
    rows, k = positions.shape
    if has_head(denoiser):
        h = batch.hidden(denoiser, x, t, vocab_size)
        picked = h.gather(1, positions[..., None].expand(-1, -1, h.shape[-1])).reshape(rows * k, -1)
        if temperature == 0:
            return denoiser.head(picked).argmax(-1).view(rows, k)
        head = denoiser.head
        tokens, _ = sample_from_hidden(picked, head.weight, head.bias, temperature, **stream)
        return tokens.view(rows, k)
    logits = batch.denoiser(denoiser, x, t, vocab_size)
    picked = logits.gather(1, positions[..., None].expand(-1, -1, vocab_size)).reshape(rows * k, vocab_size)
    return categorical(picked, temperature, stream).view(rows, k)


def categorical(logits: Tensor, temperature: float, stream: dict, exclude: Optional[Tensor] = None) -> Tensor:
    """Long[N]: one draw per row of logits [N, V] by sample_categorical (argmax at temperature 0),
    never the token exclude[n] (Long[N]) when given."""
    if temperature == 0:
        if exclude is not None:
            logits = logits.scatter(1, exclude[:, None], float("-inf"))
        return logits.argmax(-1)
    tokens, _ = sample_categorical(logits, temperature, exclude_per_row=exclude, **stream)
    return tokens


def draw_everywhere(draws: OpDraws, step: int, rows: Tensor, logits: Tensor, temperature: float,
                    exclude: Optional[Tensor] = None) -> Tensor:
    """Long[B, D]: a draw at every position from logits [B, D, V] (exclude: Long[B, D] token barred per position)."""
    n, length, vocab = logits.shape
    stream = draws.tokens(step, rows, length, vocab)
    flat_exclude = None if exclude is None else exclude.reshape(-1)
    return categorical(logits.reshape(n * length, vocab), temperature, stream, flat_exclude).view(n, length)


def draw_where(batch: RunningBatch, denoiser: Callable, step: int, x: Tensor, x_in: Tensor, where: Tensor, t: Tensor,
               noise: NoiseSource, vocab_size: int, temperature: float) -> Tensor:
    """x with the positions `where` (Bool[B, D]) drawn from denoiser(x_in, t).

    The fused counterpart of the tau-leaping baselines' draw: which rows have a draw
    is not known on the host without a synchronisation, so the denoiser runs on
    every row of the batch.
    """
    logits = batch.denoiser(denoiser, x_in, t, vocab_size)
    return torch.where(where, draw_everywhere(OpDraws(noise), step, batch.rows, logits, temperature), x)
