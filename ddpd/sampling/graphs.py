"""CUDA graphs for the fused sampler steps between stop checks.

Between two stop checks a fused step does the same work on tensors of the same shapes, so it is
captured once into a CUDA graph and replayed; a stop check runs eagerly. What a replay must not
bake in (the step counter, hence every Philox offset) is read from device tensors, and the step
writes its results in place.

Modes (Execution.graphs): "auto" captures on CUDA when the run allows it, "off" never captures,
"emulate" runs the same capture/replay logic without CUDA (what the tests check on the CPU),
and refuses a replayed step that reads the step tensor back to the host or makes a tensor of
Python numbers, which a capture cannot do.
docs/sampling.md, section "Internals: CUDA graphs", says how.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Callable, Optional

import torch

from ddpd.ops import Watcher

COUNTS = ("planner_calls", "denoiser_calls", "planner_rows", "denoiser_rows", "planner_rows_saved",
          "denoiser_rows_saved")


class StepGraphs:
    """Captured steps of one batch, by (batch generation, key)."""

    def __init__(self, batch, device: torch.device, emulate: bool):
        self.batch, self.emulate = batch, emulate
        self.step = torch.zeros((), dtype=torch.int64, device=device)
        self.graphs: dict[tuple[int, Hashable], _Captured] = {}
        self.warm: set = set()
        self.captures = self.replays = 0

    def run(self, key: Hashable, step_fn: Callable, i: int) -> None:
        """Step i by step_fn(step): eagerly the first time for (generation, key), then from the
        captured graph.

        Args:
            key: what tells apart the kinds of step of a run (a graph is kept per generation and key).
            step_fn: the step, a function of the step index (an int, or the step tensor when captured).
            i: the step index.
        """
        slot = (self.batch.generation, key)
        if slot not in self.warm:  # warm-up: lazy initialisation (compiles, caches) happens eagerly
            self.warm.add(slot)
            step_fn(i)
            return
        self.step.fill_(i)
        captured = self.graphs.get(slot)
        if captured is None:
            self.graphs = {s: g for s, g in self.graphs.items() if s[0] == self.batch.generation}
            captured = self.graphs[slot] = self._capture(step_fn)
            self.captures += 1
        captured.replay(self.batch)
        self.replays += 1

    def _capture(self, step_fn: Callable) -> _Captured:
        if self.emulate:  # the function of the capture, with whatever it closed over then
            return _Captured(lambda: _no_step_reads(step_fn, self.step), None)
        before = _counts(self.batch)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step_fn(self.step)
        # Capturing recorded the step's kernels but ran none of them: its counts come back with
        # every replay instead.
        counts = {name: _counts(self.batch)[name] - before[name] for name in COUNTS}
        _add(self.batch, {name: -value for name, value in counts.items()})
        return _Captured(graph.replay, counts)


class _Captured:
    """A captured step: replay() runs it; `counts` are the forward passes one replay adds
    (None when replaying calls the step function itself, which counts them)."""

    def __init__(self, replay: Callable, counts: Optional[dict[str, int]]):
        self._replay, self.counts = replay, counts

    def replay(self, batch) -> None:
        self._replay()
        if self.counts is not None:
            _add(batch, self.counts)


# the ops that read a tensor's value to the host (item under inference mode, _local_scalar_dense else)
_HOST_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default,
               torch.ops.aten.is_nonzero.default)


class _StepReadError(Watcher):
    """Raises where an op reads the step tensor itself (or a view of it) back to the host, or
    makes any tensor of Python numbers (torch.tensor, torch.as_tensor; on a GPU, on the device,
    a copy). Not seen: reads of tensors computed from the step (a CPU run reads its tensors in
    checks a CUDA run skips, so a taint would flag those) and tolist() / numpy()."""

    def __init__(self, step: torch.Tensor):
        super().__init__()
        self.step = step

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _HOST_READS and args[0].data_ptr() == self.step.data_ptr():
            raise RuntimeError("a replayed step read its step tensor back to the host (an index, int() or "
                               "bool() of it): a CUDA graph cannot capture that; compute with the tensor")
        if func is torch.ops.aten.lift_fresh.default:
            raise RuntimeError("a replayed step made a tensor of Python numbers (torch.tensor, torch.as_tensor), "
                               "a copy to the device that a CUDA graph cannot capture; make it before the run")
        return func(*args, **(kwargs or {}))


def _no_step_reads(step_fn: Callable, step: torch.Tensor) -> None:
    """step_fn(step), refusing reads of the step tensor: on a GPU they would stop the capture."""
    with _StepReadError(step):
        step_fn(step)


def _counts(batch) -> dict[str, int]:
    return {name: getattr(batch, name) for name in COUNTS}


def _add(batch, delta: dict[str, int]) -> None:
    for name, value in delta.items():
        setattr(batch, name, getattr(batch, name) + value)


def step_graphs(batch, run, execution, philox: bool) -> Optional[StepGraphs]:
    """The StepGraphs of a fused run, or None where its steps run eagerly (see the modes).
    With graphs the batch keeps power-of-two sizes (FusedBatch.buckets), so that a graph
    captured on it lasts across the stop checks that do not halve it.

    Args:
        batch: the run's FusedBatch.
        run: the run's checked settings (ddpd.sampling.common.Run).
        execution: the run's Execution.
        philox: whether the noise source is a PhiloxNoise.

    Returns:
        The StepGraphs, or None.
    """
    if not execution.fused or execution.graphs == "off":
        return None
    # A replay draws at the temperature it was captured with, from offsets it computes on the device.
    if not philox or run.temperature.start != run.temperature.end:
        return None
    if execution.graphs == "emulate":
        emulate = True
    elif batch.x.device.type == "cuda":
        emulate = False
    else:
        return None
    batch.buckets = True
    return StepGraphs(batch, batch.x.device, emulate=emulate)
