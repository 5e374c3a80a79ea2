"""The running batch of a sampler: the rows still being sampled and the forward-pass bookkeeping.

Rows are kept by row id, so a row keeps its noise stream (ddpd.sampling.noise) whatever else is
in the batch. `RunningBatch` (the reference run) removes a row the step it stops; `FusedBatch`
(the fused run) records stops on the device and lets finished rows go at every `sync_every`-th
stop check, in one host synchronisation. Both carry per-row state, count forward passes and
row-evaluations, and check the networks' outputs for shape and NaN.

docs/sampling.md, section "Internals: the running batch", says how and why.
"""
from __future__ import annotations

import contextlib
import inspect
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ddpd.ops.compact import compact_fixed, scatter_back
from ddpd.ops.sample_from_hidden import HEAD_DTYPES
from ddpd.validation import caller_level


@dataclass
class SampleResult:
    """What a sampler returns.

    tokens: Long[B, D] final sequences. steps: the step the last row stopped at (a fused run may
    loop on to its next stop check).
    stop_step: Long[B], the iteration at which each row stopped (its number of steps).
    planner_calls / denoiser_calls: forward passes (calls, whatever their batch size).
    planner_rows / denoiser_rows: sequences evaluated (row-evaluations), summed over
    those calls. planner_rows_saved / denoiser_rows_saved: the row-evaluations that
    early stopping saved: at each pass, the rows that had stopped and left the batch (twice
    under guidance, as denoiser_rows counts; not the rows a reference run leaves out of a pass
    because they draw nothing).
    planner_passes / denoiser_passes: Long[B], the network passes each row took part in
    (a pass counts for a row whose output the step used; a guided step, w not 0 or 1,
    evaluates the denoiser twice a row, conditional and unconditional: two passes); commits:
    Long[B], the tokens a denoiser draw wrote in each row (a position written again counts
    again); tokens_per_pass: commits over all passes, the parallelism of a run
    (ddpd.sampling.policies).
    planner_nan_passes / denoiser_nan_passes: the passes whose output held a NaN in a row the
    step used (a denoiser's logits also +inf, an overflow; a denoiser run through its head:
    a NaN or infinite hidden state, which makes such logits); every draw reads NaN as -inf
    (a planner position is taken as clean, a token is never drawn, a position with no other
    logit draws token 0); the run warns (NaNOutputWarning) when either is not 0. The
    reference and the fused run count the same passes in float32, except for finite hidden
    states whose logits overflow float32 in the head (|logit| > 3.4e38), which only the
    reference sees.
    """

    tokens: Tensor
    steps: int
    stop_step: Tensor
    planner_calls: int = 0
    denoiser_calls: int = 0
    planner_rows: int = 0
    denoiser_rows: int = 0
    planner_rows_saved: int = 0
    denoiser_rows_saved: int = 0
    planner_nan_passes: int = 0
    denoiser_nan_passes: int = 0
    planner_passes: Optional[Tensor] = None
    denoiser_passes: Optional[Tensor] = None
    commits: Optional[Tensor] = None

    @property
    def passes(self) -> Tensor:
        """Long[B]: network passes per row, planner and denoiser together."""
        return self.planner_passes + self.denoiser_passes

    @property
    def tokens_per_pass(self) -> float:
        """Tokens committed per network pass, over the whole batch."""
        return float(self.commits.sum()) / max(1, int(self.passes.sum()))


class NaNOutputWarning(RuntimeWarning):
    """A network returned NaN during a sampling run (SampleResult.planner_nan_passes,
    denoiser_nan_passes)."""


class RunningBatch:
    """Rows still being sampled (reference run: a row leaves the step it stops).

    x: Long[B, D] the current sequences; rows: their row ids; state: named per-row tensors
    ([B, ...]) that follow the rows.
    """

    def __init__(self, x: Tensor, state: Optional[dict[str, Tensor]] = None,
                 condition: Optional[Condition] = None, dtype: torch.dtype = torch.float32):
        self.out = x.clone()
        self.rows = torch.arange(x.shape[0], device=x.device)
        self.x = x
        self.state: dict[str, Tensor] = dict(state or {})
        self.condition = condition
        self.dtype = dtype
        self.stop_step = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
        self.planner_calls = self.denoiser_calls = 0
        self.planner_rows = self.denoiser_rows = 0
        self.planner_rows_saved = self.denoiser_rows_saved = 0
        self.batch_size = x.shape[0]  # the rows of the run; those that left the batch are saved
        # passes with a NaN output, planner then denoiser: device counters, updated in place
        # (a CUDA graph replays the update), read at the end
        self.nan_passes = torch.zeros(2, dtype=torch.long, device=x.device)
        # per row id: planner passes, denoiser passes, commits (device counters, like nan_passes)
        self.per_row = torch.zeros(x.shape[0], 3, dtype=torch.long, device=x.device)

    def __len__(self) -> int:
        return self.rows.numel()

    @property
    def finished(self) -> bool:
        """True once every row has stopped."""
        return len(self) == 0

    generation = 0  # a new generation begins when rows leave at a stop check (fused run)

    def check_due(self, step: int) -> bool:
        """Whether the stop flags recorded at loop step `step` are looked at on the host: every
        step for the reference run.

        Args:
            step: the loop step.

        Returns:
            True.
        """
        return True

    def running(self) -> Optional[Tensor]:
        """Bool[len] of the rows that have not stopped, or None when that is every row."""
        return None

    # ---- the networks, counted and checked

    def planner(self, model: Callable, x: Tensor, *args, rows: Optional[Tensor] = None) -> Tensor:
        """Planner logits for x (time passed when given), shape-checked and counted; with a
        class-conditional planner, called with the labels of `rows` (default: the batch).

        Args:
            model: the planner network.
            x: Long[B, D] the sequences.
            *args: the further arguments of the planner (the time, when it takes one).
            rows: Long[B] the row ids of x, or None for the batch's.

        Returns:
            Float32[B, D] the planner logits.

        Raises:
            TypeError: the planner returns no tensor.
            ValueError: the planner returns another shape, no floating logits, or logits on another device.
        """
        with self._precision():
            if self.condition is not None and self.condition.conditional_planner:
                logits = model(x, *args, labels=self.condition.labels_of(self._rows(rows)))
            else:
                logits = model(x, *args)
        _check_output("planner", logits, tuple(x.shape), x.device)
        self._count_nan(0, torch.isnan(logits))
        self._count_rows(0, None)
        self.planner_calls += 1
        self.planner_rows += x.shape[0]
        self.planner_rows_saved += self.batch_size - len(self)
        return logits.float()

    def denoiser(self, model: Callable, x: Tensor, t: Tensor, vocab_size: int, name: str = "denoiser",
                 rows: Optional[Tensor] = None, used: Optional[Tensor] = None) -> Tensor:
        """Denoiser logits for (x, t), shape-checked and counted; with labels, the guided logits
        of `rows` (default: the batch), see Condition.

        Args:
            model: the denoiser network.
            x: Long[B, D] the sequences.
            t: Float[B] the times.
            vocab_size: V.
            name: the network's name, for errors.
            rows: Long[B] the row ids of x, or None for the batch's.
            used: Bool[B], the rows whose logits the step uses, or None for every running row.

        Returns:
            Float32[B, D, V] the logits.

        Raises:
            TypeError: the network returns no tensor.
            ValueError: the network returns another shape, no floating logits, or logits on another device.
        """
        network = _Call(model, "__call__")
        outputs = self._evaluate(network, x, t, rows)
        for output in outputs:
            _check_output(name, output, (*x.shape, vocab_size), x.device)
        # The networks' own outputs (guidance gives +inf by design where only the conditional
        # network allows a token); +inf too: an overflow (float16), where the fused run sees an
        # infinite hidden state.
        self._count_denoiser_pass(x, [torch.isnan(out) | (out == float("inf")) for out in outputs], used, rows,
                                  network)
        return self._guided(outputs).float()

    def hidden(self, model, x: Tensor, t: Tensor, vocab_size: int, rows: Optional[Tensor] = None,
               used: Optional[Tensor] = None) -> Tensor:
        """model.hidden(x, t), counted as a denoiser pass; its head must give vocab_size logits.
        With labels, the guided hidden states (exact through a linear head).

        Args:
            model: a denoiser with hidden(x, t) and an nn.Linear `head`.
            x: Long[B, D] the sequences.
            t: Float[B] the times.
            vocab_size: V.
            rows: Long[B] the row ids of x, or None for the batch's.
            used: as for denoiser.

        Returns:
            Float[B, D, H] the hidden states.

        Raises:
            ValueError: a head without vocab_size outputs, or hidden states of another shape or device.
        """
        head = model.head
        if head.out_features != vocab_size:
            raise ValueError(f"denoiser.head must have {vocab_size} outputs, got {head.out_features}")
        network = _Call(model, "hidden")
        outputs = self._evaluate(network, x, t, rows)
        h = self._guided(outputs)
        if not isinstance(h, Tensor) or h.dim() != 3 or tuple(h.shape[:2]) != tuple(x.shape) \
                or h.shape[2] != head.in_features:
            shape = list(h.shape) if isinstance(h, Tensor) else type(h).__name__
            raise ValueError(f"denoiser.hidden must return hidden states of shape "
                             f"{[*x.shape, head.in_features]}, got {shape}")
        _check_device("denoiser.hidden", h, x.device)
        # NaN or inf in a hidden state: NaN or +inf logits (inf times weights of both signs)
        self._count_denoiser_pass(x, [~torch.isfinite(out) for out in outputs], used, rows, network)
        return h

    def _evaluate(self, network: _Call, x: Tensor, t: Tensor, rows: Optional[Tensor]) -> list[Tensor]:
        """The network's outputs at (x, t): [output], or under guidance (w not 0 or 1) [conditional,
        unconditional] at the labels of `rows` (Condition.outputs), which _guided combines."""
        with self._precision():
            if self.condition is None:
                return [network.fn(x, t)]
            return [out for out in self.condition.outputs(network, x, t, self._rows(rows)) if out is not None]

    def _guided(self, outputs: list[Tensor]) -> Tensor:
        return outputs[0] if len(outputs) == 1 else guided(outputs[1], outputs[0], self.condition.guidance_scale)

    def _count_denoiser_pass(self, x: Tensor, bad: list[Tensor], used: Optional[Tensor], rows: Optional[Tensor],
                             network: _Call) -> None:
        """Count a step's denoiser evaluations; `bad` marks the non-finite outputs of each (one
        call of 2B rows, a network with a null label, counts its two outputs as one call)."""
        # guidance evaluates each row twice, conditional and unconditional: two passes
        evaluations = 1 if self.condition is None else self.condition.evaluations
        calls = 1 if self.condition is None else self.condition.calls(network)
        for bad_of_call in ([bad[0] | bad[1]] if calls < len(bad) else bad):
            self._count_nan(1, bad_of_call, used)
        self._count_rows(1, used, rows, evaluations)
        self.denoiser_calls += calls
        self.denoiser_rows += evaluations * x.shape[0]
        self.denoiser_rows_saved += evaluations * (self.batch_size - len(self))

    def _count_nan(self, network: int, bad: Tensor, used: Optional[Tensor] = None) -> None:
        """Count a pass of `network` (0 planner, 1 denoiser) whose `bad` (Bool[B, ...]) holds a
        True in a row it uses: `used` and running. In place on the device, no host sync."""
        bad = bad.flatten(1).any(1) if bad.dim() > 1 else bad
        running = self.running()
        for rows in (used, running):
            if rows is not None and rows.shape == bad.shape:
                bad = bad & rows
        self.nan_passes.select(0, network).add_(bad.any())

    def _count_rows(self, column: int, used: Optional[Tensor], rows: Optional[Tensor] = None,
                    passes: int = 1) -> None:
        """Add `passes` to `column` of per_row for each running row (and `used`, when given); a
        pass on some rows only (the reference run's `rows`) counts for those."""
        if rows is not None and rows.shape != self.rows.shape:
            self.per_row.select(1, column).index_add_(0, rows, torch.full_like(rows, passes))
            return
        add = torch.full_like(self.rows, passes)
        for rows in (used, self.running()):
            if rows is not None and rows.shape == add.shape:
                add = add * rows
        self.per_row.select(1, column).index_add_(0, self.rows, add)

    def count_commits(self, n: Tensor) -> None:
        """Add the tokens each row's draws wrote this step to the rows' commits.

        Args:
            n: Long[B], per row.
        """
        running = self.running()
        n = n if running is None else n * running
        self.per_row.select(1, 2).index_add_(0, self.rows, n.long())

    def _rows(self, rows: Optional[Tensor]) -> Tensor:
        return self.rows if rows is None else rows

    def _precision(self):
        """The networks' precision: autocast below float32, else nothing."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.x.device.type, dtype=self.dtype)

    # ---- rows leaving

    def finish(self, done: Tensor, step, *carried: Optional[Tensor], check: bool = True) -> tuple:
        """Retire the rows where done at `step`.

        Args:
            done: Bool[len] the rows that stop.
            step: the step they stop at.
            *carried: per-row tensors of this step, or None.
            check: unused here (see FusedBatch.finish).

        Returns:
            `carried` restricted to the rows kept.
        """
        if not bool(done.any()):
            return carried
        ids = self.rows[done]
        self.out[ids] = self.x[done]
        self.stop_step[ids] = step
        keep = ~done
        self.rows, self.x = self.rows[keep], self.x[keep]
        self.state = {name: value[keep] for name, value in self.state.items()}
        return tuple(None if c is None else c[keep] for c in carried)

    def result(self, steps: int) -> SampleResult:
        """The run's SampleResult: rows still running stop at `steps`; `steps` of the result is the
        last stop step. Warns (NaNOutputWarning) when a network returned NaN.

        Args:
            steps: the step budget.

        Returns:
            The SampleResult.
        """
        self.finish(torch.ones(len(self), dtype=torch.bool, device=self.x.device), steps)
        return self._result()

    def _result(self) -> SampleResult:
        with _sync_allowed():  # the run is over: its step count and NaN counts are read once
            steps = int(self.stop_step.max())
            nan_passes = self.nan_passes.tolist()
        per_row = self.per_row[:self.batch_size]
        result = SampleResult(self.out, steps, self.stop_step, self.planner_calls, self.denoiser_calls,
                              self.planner_rows, self.denoiser_rows, self.planner_rows_saved,
                              self.denoiser_rows_saved, *nan_passes, *per_row.unbind(1))
        message = nan_warning(result.planner_nan_passes, result.planner_calls, result.denoiser_nan_passes,
                              result.denoiser_calls)
        if message:
            warnings.warn(message, NaNOutputWarning, stacklevel=caller_level())
        return result


class FusedBatch(RunningBatch):
    """Rows in the batch (running, or finished since the last stop check) and their bookkeeping.

    buckets: rows leave the batch only when the running rows fit a smaller power of two, and
    the batch keeps that many rows (finished rows stay frozen, padding rows are stopped
    rows with the row id `size`, a slot past the output's rows), so that its shape, and a
    CUDA graph captured on it, last from one stop check to the next (ddpd.sampling.graphs).
    `generation` counts the times the batch was packed into new tensors.
    """

    def __init__(self, x: Tensor, state: Optional[dict[str, Tensor]] = None,
                 condition: Optional[Condition] = None, dtype: torch.dtype = torch.float32, sync_every: int = 1,
                 compaction: bool = True, buckets: bool = False):
        super().__init__(x, state, condition, dtype)
        self.sync_every = sync_every
        self.compaction = compaction
        self.buckets = buckets
        self.size = x.shape[0]
        self.running_rows = x.shape[0]  # as of the last stop check (a host count)
        self.generation = 0
        # a padding slot past the rows: always stopped, its output row dropped at the end
        self.out = torch.cat([self.out, self.out[:1]])
        self.stop_step = torch.cat([self.stop_step, torch.zeros_like(self.stop_step[:1])])
        self.per_row = torch.cat([self.per_row, torch.zeros_like(self.per_row[:1])])

    @property
    def finished(self) -> bool:
        return self.running_rows == 0

    def running(self) -> Tensor:
        """The rows in the batch that have not stopped (no host sync).

        Returns:
            Bool[len].
        """
        return self.stop_step[self.rows] < 0

    def check_due(self, step: int) -> bool:
        """Every sync_every-th loop step is a stop check.

        Args:
            step: the loop step.

        Returns:
            Whether `step` is a stop check.
        """
        return (step + 1) % self.sync_every == 0

    def finish(self, done: Tensor, step, *carried: Optional[Tensor], check: bool = True) -> tuple:
        """Record that the rows where done stopped at `step` (unless they already had). At a stop
        check the finished rows leave the batch and each of `carried` is packed like the batch.

        Args:
            done: Bool[len] the rows that stop.
            step: an int, or the step tensor of a CUDA graph.
            *carried: per-row tensors of this step, or None.
            check: whether this is a stop check (see check_due).

        Returns:
            `carried`, packed or not.
        """
        rows_stop = self.stop_step[self.rows]
        self.stop_step[self.rows] = torch.where(done & (rows_stop < 0), step, rows_stop)
        if not check:
            return carried
        return self._check(carried)

    def _check(self, carried: tuple) -> tuple:
        running = self.running()
        with _sync_allowed():
            self.running_rows = int(running.sum())  # the host synchronisation of the stop check
        capacity = _bucket(self.running_rows) if self.buckets else self.running_rows
        if not self.compaction or capacity >= len(self):
            return carried
        self.generation += 1
        scatter_back(self._out_index(running), self.x, self.out)
        present = [c for c in carried if c is not None]
        names = list(self.state)
        packed, index, _ = compact_fixed(running, capacity, self.x, self.rows, *(self.state[n] for n in names),
                                         *present)
        self.x, rest = packed[0], iter(packed[2:])
        self.rows = torch.where(index >= 0, packed[1], self.size)  # padding rows: the stopped slot
        self.state = {name: next(rest) for name in names}
        return tuple(None if c is None else next(rest) for c in carried)

    def _out_index(self, skip: Optional[Tensor] = None) -> Tensor:
        """Output rows of the batch's rows for scatter_back: -1 (skipped) for padding and `skip`."""
        skip = self.rows == self.size if skip is None else skip | (self.rows == self.size)
        return torch.where(skip, -1, self.rows)

    def result(self, steps: int) -> SampleResult:
        """The run's SampleResult: rows still running stop at `steps`, every row is written back
        to its place in the output.

        Args:
            steps: the step budget.

        Returns:
            The SampleResult.
        """
        rows_stop = self.stop_step[self.rows]
        self.stop_step[self.rows] = torch.where(rows_stop < 0, steps, rows_stop)
        scatter_back(self._out_index(), self.x, self.out)
        self.out, self.stop_step = self.out[:self.size], self.stop_step[:self.size]
        return self._result()


def nan_warning(planner_nan: int, planner_calls: int, denoiser_nan: int, denoiser_calls: int,
                denoiser: str = "denoiser") -> str:
    """What a run's NaN counts (SampleResult's) say, or '' when there were none.

    Args:
        planner_nan: planner passes with a NaN output.
        planner_calls: planner passes.
        denoiser_nan: denoiser passes with a NaN or +inf output.
        denoiser_calls: denoiser passes.
        denoiser: what the message calls the network of the denoiser passes (a single uniform
            model's are all counted there).

    Returns:
        The warning's message, or ''.
    """
    parts = [f"the {name} returned NaN{' or +inf' if plus_inf else ''} in {bad} of {calls} passes"
             for name, plus_inf, bad, calls in (("planner", False, planner_nan, planner_calls),
                                                (denoiser, True, denoiser_nan, denoiser_calls)) if bad]
    if not parts:
        return ""
    return (" and ".join(parts) + ": NaN is read as -inf (a planner position as clean, a token as never drawn, token "
            "0 where nothing else is left), so these samples are not the model's; run the networks in float32 "
            "(dtype / --dtype) or check their weights")


def _bucket(rows: int) -> int:
    """The batch size kept for `rows` running rows with buckets: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length() if rows else 0


@dataclass(frozen=True)
class Condition:
    """Class labels of a run and classifier-free guidance.

    labels: Long[B], the label of each row id. The denoiser is called as model(x, t,
    labels=...) and, for guidance_scale w != 1, also with labels=None (the null label,
    unconditional; at w = 0 with labels=None alone); its output is the guided u + w (c - u),
    applied to the logits (w = 1: the conditional model, w = 0: the unconditional one, each
    one evaluation a row). For hidden states the same combination is exact: a linear head
    maps u + w (c - u) of hidden states to the same combination of logits. The planner gets
    the labels when conditional_planner is set.
    """

    labels: Tensor
    guidance_scale: float = 1.0
    conditional_planner: bool = False

    @property
    def evaluations(self) -> int:
        """The denoiser's evaluations of a row a step: 2 under guidance (w not 0 or 1), else 1."""
        return 1 if self.guidance_scale in (0.0, 1.0) else 2

    def calls(self, network: _Call) -> int:
        """The calls `outputs` makes of network: one batch of 2B rows where it names its null
        label, else one call per evaluation.

        Args:
            network: the network as Condition.outputs calls it.

        Returns:
            1 or 2.
        """
        return 1 if isinstance(network.null_label, int) else self.evaluations

    def labels_of(self, rows: Tensor) -> Tensor:
        """The labels of row ids. A bucket's padding rows (FusedBatch: id B, one past the
        last) take row B - 1's: their outputs are discarded.

        Args:
            rows: Long row ids.

        Returns:
            Long labels, shaped like rows.
        """
        return self.labels[rows.clamp(max=self.labels.shape[0] - 1)]

    def outputs(self, network: Callable, x: Tensor, t: Tensor, rows: Tensor):
        """The conditional and unconditional outputs of network at the labels of rows. A network
        that names its null label (`null_label`, the ddpd.models networks) runs both passes as
        one batch of 2B rows.

        Args:
            network: a function of (x, t, labels).
            x: Long[B, D] the sequences.
            t: Float[B] the times.
            rows: Long[B] the row ids.

        Returns:
            (conditional, unconditional); the one a guidance scale of 1 or 0 does not use is
            None, and not evaluated.
        """
        if self.guidance_scale == 0.0:
            return None, network(x, t, None)
        labels = self.labels_of(rows)
        if self.guidance_scale == 1.0:
            return network(x, t, labels), None
        null = getattr(network, "null_label", None)
        if isinstance(null, int):
            both = network(torch.cat([x, x]), torch.cat([t, t]), torch.cat([labels, torch.full_like(labels, null)]))
            return both.chunk(2)
        return network(x, t, labels), network(x, t, None)


def guided(unconditional: Tensor, conditional: Tensor, scale: float) -> Tensor:
    """u + w (c - u) = (1 - w) u + w c, classifier-free guidance, with its limits where a
    network forbids a token (logit -inf), where the formula alone gives NaN: u exactly at
    w = 0; -inf where both are; where only u is, -inf for w < 1 and +inf for w > 1.

    Args:
        unconditional: u, the unconditional output.
        conditional: c, the conditional output.
        scale: w.

    Returns:
        The guided output.
    """
    if scale == 0.0 or scale == 1.0:
        return unconditional if scale == 0.0 else conditional
    mixed = unconditional + scale * (conditional - unconditional)
    forbidden = unconditional == float("-inf")
    if scale < 1.0:
        return mixed.masked_fill(forbidden, float("-inf"))
    return torch.where(forbidden, conditional.masked_fill(conditional > float("-inf"), float("inf")), mixed)


def extended_softmax(logits: Tensor, log: bool = False) -> Tensor:
    """softmax (or log_softmax) over the last dimension in the extended reals: a row holding
    +inf (guidance beyond scale 1 where only the conditional network allows a token; a float16
    overflow) is the uniform law over its +inf entries, as every draw reads it, where softmax
    alone gives NaN. Rows of finite logits get softmax's own values, bit for bit.

    Args:
        logits: Float[..., V].
        log: log-probabilities instead of probabilities.

    Returns:
        Float[..., V].
    """
    infinite = logits == float("inf")
    count = infinite.sum(-1, keepdim=True).to(logits.dtype)
    if log:
        return torch.where(count > 0, torch.where(infinite, -count.log(), float("-inf")), logits.log_softmax(-1))
    return torch.where(count > 0, infinite.to(logits.dtype) / count, logits.softmax(-1))


class _Call:
    """network.method(x, t, labels=...) as a function of (x, t, labels), exposing the
    network's null label (if it has one) to Condition.outputs."""

    def __init__(self, network: Callable, method: str):
        self.fn = getattr(network, method) if method != "__call__" else network
        self.null_label = getattr(network, "null_label", None)

    def __call__(self, x: Tensor, t: Tensor, labels: Optional[Tensor]) -> Tensor:
        return self.fn(x, t, labels=labels)


@contextlib.contextmanager
def _sync_allowed():
    """The stop check's synchronisation is the one a fused run makes: allowed under
    torch.cuda.set_sync_debug_mode("error"), which catches any other. The mode is left alone
    where it is off: setting it warns once a process that the mode is a prototype."""
    mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
    if mode == 0:
        yield
        return
    torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(mode)


def _check_output(name: str, out, shape: tuple, device: torch.device) -> None:
    if not isinstance(out, Tensor):
        raise TypeError(f"{name} must return a tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape or not out.is_floating_point():
        raise ValueError(f"{name} must return floating logits of shape {list(shape)}, "
                         f"got {out.dtype} of shape {list(out.shape)}")
    _check_device(name, out, device)


def _check_device(name: str, out: Tensor, device: torch.device) -> None:
    # a network that moves its input (x.to("cuda") inside a CPU run) would otherwise fail in a draw
    if out.device != device:
        raise ValueError(f"{name} must return its output on the run's device {device} (where x is), "
                         f"got {out.device}")


def has_head(model: Callable) -> bool:
    """True for a network exposing hidden(x, t) and an nn.Linear output head (ddpd.models) in a
    dtype the fused head (ddpd.ops.sample_from_hidden) takes: a float64 network runs whole,
    its logits drawn as the reference draws them.

    Args:
        model: the denoiser.

    Returns:
        Whether the fused head applies.
    """
    head = getattr(model, "head", None)
    return (callable(getattr(model, "hidden", None)) and isinstance(head, torch.nn.Linear)
            and head.weight.dtype in HEAD_DTYPES)


def check_hidden(name: str, model: Callable, labels: bool) -> None:
    """Check, before the first step, that the fused run can call a network with a head (has_head)
    as it will: hidden(x, t), with labels=... under guidance. Reads the signature of
    `hidden` once; the network is not called.

    Args:
        name: the network's argument name, for the message.
        model: the denoiser.
        labels: whether the run passes labels= (guidance).

    Raises:
        TypeError: `hidden` takes no such call (it takes only x, or no labels), naming the
            network and what it must define.
    """
    if not has_head(model):
        return
    hidden = model.hidden
    try:  # a layer's signature is its forward's (its __call__ takes *args)
        signature = inspect.signature(hidden.forward if isinstance(hidden, torch.nn.Module) else hidden)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read, the call will say
        return
    call = "hidden(x, t, labels=...)" if labels else "hidden(x, t)"
    try:
        signature.bind(None, None, **({"labels": None} if labels else {}))
    except TypeError as error:
        raise TypeError(f"{name} ({type(model).__name__}) has an nn.Linear head, so the fused run calls its {call}, "
                        f"but its hidden{signature} cannot be called so ({error}): define {call} returning "
                        f"the hidden states Float[B, D, H] that head maps to the logits (see docs/api.md), "
                        f"or name them otherwise for the run to call {name}(x, t) whole") from None
