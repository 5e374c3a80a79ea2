"""The running batch of the fused samplers: stops recorded on the device, rows leave at stop checks.

The reference `RunningBatch` removes a finished row at once, which reads the stop
flags on the host every step. Here a stop is only recorded (`stop_step`, on the
device) and the batch looks at the flags every `sync_every`-th stop check: one
host synchronisation, after which the finished rows are written back to their
places in the output (ddpd.ops.scatter_back) and the running ones packed to the
front (ddpd.ops.compact_fixed), so that later planner and denoiser passes run on
the running rows only. Between checks a finished row stays in the batch, frozen
by the sampler; with compaction=False it stays until the end (the uncompacted run,
for comparison). Rows keep their row ids, hence their noise streams: a compacted
and an uncompacted run draw the same samples.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ddpd.ops.compact import compact_fixed, scatter_back
from ddpd.sampling.common import RunningBatch, SampleResult, check_bool, check_int


def check_fused_options(fused, sync_every, compaction) -> None:
    check_bool("fused", fused)
    check_int("sync_every", sync_every, 1)
    check_bool("compaction", compaction)


class FusedBatch(RunningBatch):
    """Rows in the batch (running, or finished since the last stop check) and their bookkeeping."""

    def __init__(self, x: Tensor, sync_every: int = 1, compaction: bool = True):
        super().__init__(x)
        self.sync_every = sync_every
        self.compaction = compaction
        self.running_rows = x.shape[0]  # as of the last stop check (a host count)
        self._checks = 0

    @property
    def finished(self) -> bool:
        return self.running_rows == 0

    def running(self) -> Tensor:
        """Bool[len]: the rows in the batch that have not stopped (no host sync)."""
        return self.stop_step[self.rows] < 0

    def hidden(self, model, x: Tensor, t: Tensor, vocab_size: int) -> Tensor:
        """model.hidden(x, t) Float[B, D, H], counted as a denoiser pass; its head must give vocab_size logits."""
        head = model.head
        if head.out_features != vocab_size:
            raise ValueError(f"denoiser.head must have {vocab_size} outputs, got {head.out_features}")
        h = model.hidden(x, t)
        if not isinstance(h, Tensor) or h.dim() != 3 or tuple(h.shape[:2]) != tuple(x.shape) \
                or h.shape[2] != head.in_features:
            shape = list(h.shape) if isinstance(h, Tensor) else type(h).__name__
            raise ValueError(f"denoiser.hidden must return hidden states of shape "
                             f"{[*x.shape, head.in_features]}, got {shape}")
        self.denoiser_calls += 1
        self.denoiser_rows += x.shape[0]
        return h

    def finish(self, done: Tensor, step: int, *carried: Optional[Tensor]):
        """Record that the rows where done (Bool[len]) stopped at `step` (unless they already had).

        Every sync_every-th call is a stop check: the finished rows leave the batch
        and each of `carried` (per-row tensors of this step, or None) is packed like
        the batch. Returns `carried`, packed or not.
        """
        rows_stop = self.stop_step[self.rows]
        self.stop_step[self.rows] = torch.where(done & (rows_stop < 0), step, rows_stop)
        self._checks += 1
        if self._checks % self.sync_every:
            return carried
        return self._check(carried)

    def _check(self, carried: tuple) -> tuple:
        running = self.running()
        self.running_rows = int(running.sum())  # the host synchronisation of the stop check
        if not self.compaction or self.running_rows == len(self):
            return carried
        scatter_back(torch.where(running, -1, self.rows), self.x, self.out)
        present = [c for c in carried if c is not None]
        packed, _, _ = compact_fixed(running, self.running_rows, self.x, self.rows, *present)
        self.x, self.rows, rest = packed[0], packed[1], iter(packed[2:])
        return tuple(None if c is None else next(rest) for c in carried)

    def result(self, steps: int) -> SampleResult:
        """Rows still running stop at `steps`; `steps` of the result is the last stop step."""
        rows_stop = self.stop_step[self.rows]
        self.stop_step[self.rows] = torch.where(rows_stop < 0, steps, rows_stop)
        scatter_back(self.rows, self.x, self.out)
        last = int(self.stop_step.max())
        return SampleResult(self.out, last, self.stop_step, self.planner_calls, self.denoiser_calls,
                            self.planner_rows, self.denoiser_rows)


def make_batch(x: Tensor, fused: bool, sync_every: int, compaction: bool) -> RunningBatch:
    """The reference RunningBatch, or a FusedBatch on the fused path."""
    return FusedBatch(x, sync_every, compaction) if fused else RunningBatch(x)


def has_head(model: Callable) -> bool:
    """True for a network exposing hidden(x, t) and an nn.Linear output head (ddpd.models)."""
    return callable(getattr(model, "hidden", None)) and isinstance(getattr(model, "head", None), torch.nn.Linear)
