"""What every sampler shares: argument checks, checked model calls, the running batch.

`RunningBatch` holds the rows still being sampled (by row id, so a row keeps its
noise stream, see ddpd.sampling.noise) and counts forward passes; finished rows
leave the batch and are written back to the output tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ddpd.sampling.noise import INIT, NoiseSource
from ddpd.validation import check_bool, check_callable, check_choice, check_float, check_int  # noqa: F401


@dataclass
class SampleResult:
    """What a sampler returns.

    tokens: Long[B, D] final sequences. steps: loop iterations the batch ran.
    stop_step: Long[B], the iteration at which each row stopped (its number of steps).
    planner_calls / denoiser_calls: forward passes (calls, whatever their batch size).
    planner_rows / denoiser_rows: sequences evaluated (row-evaluations), summed over
    those calls. planner_rows_saved / denoiser_rows_saved: the row-evaluations that
    rows leaving the batch saved, against the whole batch at every call.
    """

    tokens: Tensor
    steps: int
    stop_step: Tensor
    planner_calls: int = 0
    denoiser_calls: int = 0
    planner_rows: int = 0
    denoiser_rows: int = 0

    @property
    def planner_rows_saved(self) -> int:
        return self.tokens.shape[0] * self.planner_calls - self.planner_rows

    @property
    def denoiser_rows_saved(self) -> int:
        return self.tokens.shape[0] * self.denoiser_calls - self.denoiser_rows




def check_temperatures(temperature, temperature_end) -> tuple[float, float]:
    """(start, end) of the logit temperature; end defaults to start (fixed)."""
    start = check_float("temperature", temperature, 0.0)
    end = start if temperature_end is None else check_float("temperature_end", temperature_end, 0.0)
    return start, end


def check_shape(batch_size, length, vocab_size) -> None:
    check_int("batch_size", batch_size, 1)
    check_int("length", length, 1)
    check_int("vocab_size", vocab_size, 2)


class RunningBatch:
    """Rows still being sampled, their tokens, and forward-pass bookkeeping."""

    def __init__(self, x: Tensor):
        self.out = x.clone()
        self.rows = torch.arange(x.shape[0], device=x.device)
        self.x = x
        self.stop_step = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
        self.planner_calls = self.denoiser_calls = 0
        self.planner_rows = self.denoiser_rows = 0

    def __len__(self) -> int:
        return self.rows.numel()

    @property
    def finished(self) -> bool:
        """True once every row has stopped."""
        return len(self) == 0

    def planner(self, model: Callable, x: Tensor, *args) -> Tensor:
        """Planner logits Float[B, D] for x (time passed when given), shape-checked."""
        logits = model(x, *args)
        _check_output("planner", logits, tuple(x.shape))
        self.planner_calls += 1
        self.planner_rows += x.shape[0]
        return logits.float()

    def denoiser(self, model: Callable, x: Tensor, t: Tensor, vocab_size: int, name: str = "denoiser") -> Tensor:
        """Denoiser logits Float[B, D, V] for (x, t), shape-checked (name: for errors)."""
        logits = model(x, t)
        _check_output(name, logits, (*x.shape, vocab_size))
        self.denoiser_calls += 1
        self.denoiser_rows += x.shape[0]
        return logits.float()

    def finish(self, done: Tensor, step: int) -> Tensor:
        """Retire the rows where done (Bool[len]) at `step`; returns the mask of rows kept."""
        if bool(done.any()):
            ids = self.rows[done]
            self.out[ids] = self.x[done]
            self.stop_step[ids] = step
            keep = ~done
            self.rows, self.x = self.rows[keep], self.x[keep]
            return keep
        return torch.ones_like(done)

    def result(self, steps: int) -> SampleResult:
        self.finish(torch.ones(len(self), dtype=torch.bool, device=self.x.device), steps)
        return SampleResult(self.out, steps, self.stop_step, self.planner_calls, self.denoiser_calls,
                            self.planner_rows, self.denoiser_rows)


def _check_output(name: str, out, shape: tuple) -> None:
    if not isinstance(out, Tensor):
        raise TypeError(f"{name} must return a tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape or not out.is_floating_point():
        raise ValueError(f"{name} must return floating logits of shape {list(shape)}, "
                         f"got {out.dtype} of shape {list(out.shape)}")


def initial_noise(noise: NoiseSource, batch_size: int, length: int, vocab_size: int, device) -> Tensor:
    """x_0 ~ uniform over the vocabulary (p_noise^unif), from the INIT stream."""
    u = noise.uniform(0, INIT, torch.arange(batch_size, device=device), length)
    return (u * vocab_size).long().clamp_(max=vocab_size - 1)
