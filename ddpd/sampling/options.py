"""Sampler options as validated, immutable objects, one per concern.

- `Temperature`: the denoiser logit temperature, fixed or annealed linearly from `start`
  to `end` over the run: over its steps (first to last of the budget), or over its time
  where the run's length is a time, not a step count (`Temperature.over`); shared by every
  sampler. 0 means argmax.
- `DDPDOptions`: how Algorithm 1 (alg:sampling) plans, stops and keeps time: `selection`
  (sigmoid = option A, softmax = option C), `stop` (eps = A, budget = B) and `eps`,
  `clock` (planner: the paper's time estimate; exact: the self-loop CTMC simulated
  exactly, ending at `t_end`), `k` positions per step during the first `parallel_steps`,
  and whether the planner takes the time (`time_conditioned_planner`, exact clock only).
- `Truncation`: top-k / top-p / min-p truncation of every token draw's law (the tempered
  denoiser distribution renormalised over the kept tokens), applied inside the ops in both
  runs; shared by every sampler. Nothing set: the untruncated law.
- `Execution`: how a run is carried out, not what it draws: `fused` (the ddpd.ops kernels,
  no host synchronisation inside a step), `sync_every` (steps between the stop checks where
  finished rows leave the batch), `compaction` (whether they leave it at all) and `dtype`,
  the precision the networks run in ("auto": bfloat16 on CUDA, float32 on the CPU).

Each object checks its own fields when built; `DDPDOptions.check` adds the checks that need
the run's length and step budget. The public samplers take these objects, or their fields
as keyword arguments (`ddpd_sample(..., selection="softmax", eps=0.05, fused=True)`), and
resolve them once with `resolve`; everything below the public boundary receives validated
objects and checks nothing again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from ddpd.ops.sample_categorical import MAX_TEMPERATURE
from ddpd.sampling.policies import ErrorBudget
from ddpd.validation import check_bool, check_choice, check_float, check_int

SELECTIONS = ("sigmoid", "softmax")
STOPS = ("eps", "budget")
CLOCKS = ("planner", "exact")
DTYPES = ("auto", "float32", "bfloat16", "float16")
GRAPHS = ("auto", "off", "emulate")


def check_temperature(name: str, value) -> float:
    """A logit temperature: a number in [0, MAX_TEMPERATURE] (0 = argmax), the range in
    which the ops' float32 draws are exact."""
    return check_float(name, value, 0.0, MAX_TEMPERATURE)


@dataclass(frozen=True)
class Temperature:
    """Logit temperature `start` at the first step, linearly to `end` (default: start) at the last
    (`at`), or at time 0 to `end` at the run's final time (`over`, per row)."""

    start: float = 1.0
    end: Optional[float] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", check_temperature("temperature", self.start))
        end = self.start if self.end is None else check_temperature("temperature_end", self.end)
        object.__setattr__(self, "end", end)

    def at(self, step: int, steps: int) -> float:
        """The temperature at `step` of `steps`."""
        if steps <= 1:
            return self.start
        if step >= steps - 1:  # exactly the end: rounding gave 1.7 to 0 in 42 steps -2.2e-16 there
            return self.end
        value = self.start + (self.end - self.start) * step / (steps - 1)
        return min(max(value, min(self.start, self.end)), max(self.start, self.end))  # never past either end

    def over(self, fraction: Tensor) -> Union[float, Tensor]:
        """The temperature of each row at `fraction` (Float[B], clamped to [0, 1]) of the run's time:
        a number when fixed, so that a fixed temperature takes the ops' scalar path (and CUDA graphs)."""
        if self.start == self.end:
            return self.start
        value = self.start + (self.end - self.start) * fraction.float().clamp(0.0, 1.0)
        value = value.clamp(min(self.start, self.end), max(self.start, self.end))  # never past either end
        return torch.where(fraction >= 1.0, self.end, value)  # exactly the end there, as `at` is at the last step


@dataclass(frozen=True)
class DDPDOptions:
    """Plan, stop and clock of the DDPD sampler (appendix 'Implementation details': A, +B, +C)."""

    selection: str = "sigmoid"
    stop: Optional[str] = None  # eps with the planner clock, budget with the exact clock
    eps: float = 0.01
    clock: str = "planner"
    t_end: float = 1.0 - 1e-4
    k: int = 1
    parallel_steps: int = 0
    time_conditioned_planner: bool = False
    policy: Optional[ErrorBudget] = None

    def __post_init__(self) -> None:
        check_choice("selection", self.selection, SELECTIONS)
        check_choice("clock", self.clock, CLOCKS)
        stop = ("eps" if self.clock == "planner" else "budget") if self.stop is None else self.stop
        object.__setattr__(self, "stop", check_choice("stop", stop, STOPS))
        object.__setattr__(self, "eps", check_float("eps", self.eps, 0.0, 1.0, open_min=True, open_max=True))
        object.__setattr__(self, "t_end", check_float("t_end", self.t_end, 0.0, 1.0, open_min=True, open_max=True))
        check_int("k", self.k, 1)
        check_int("parallel_steps", self.parallel_steps, 0)
        check_bool("time_conditioned_planner", self.time_conditioned_planner)
        if self.policy is not None:
            if not isinstance(self.policy, ErrorBudget):
                raise TypeError(f"policy must be an ErrorBudget (ddpd.sampling.policies) or None, "
                                f"got {type(self.policy).__name__}")
            if self.clock == "exact" or self.parallel_steps > 0:
                raise ValueError("policy= needs clock='planner' and no fixed parallel stage (parallel_steps=0): "
                                 "the exact clock simulates one jump at a time")
        if self.clock == "exact":
            if self.stop == "eps":
                raise ValueError("stop='eps' is not available with clock='exact', which runs to t_end; "
                                 "use stop='budget' or clock='planner'")
            if self.k > 1 and self.parallel_steps > 0:
                raise ValueError("k > 1 (parallel steps) is not available with clock='exact', "
                                 "which simulates one jump at a time")
        elif self.time_conditioned_planner:
            raise ValueError("time_conditioned_planner=True needs clock='exact': the planner clock estimates "
                             "the time from a time-free planner")

    def check(self, length: int, steps: int) -> DDPDOptions:
        """The checks that need the sequence length and the step budget; returns self."""
        check_int("k", self.k, 1, length)
        check_int("parallel_steps", self.parallel_steps, 0, steps)
        return self

    def positions_at(self, step: int) -> int:
        """Positions denoised at `step`: k in the parallel stage, then one."""
        return self.k if step < self.parallel_steps else 1


@dataclass(frozen=True)
class Truncation:
    """Which tokens a denoiser draw may take: the `top_k` most probable, the smallest set of
    most probable tokens whose probability reaches `top_p`, those with at least `min_p`
    times the top probability (each None: no such cut; several: all apply). The draw is from
    the tempered law renormalised over what is kept (ddpd.ops.sample_categorical)."""

    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None

    def __post_init__(self) -> None:
        if self.top_k is not None:
            check_int("top_k", self.top_k, 1)
        if self.top_p is not None:
            object.__setattr__(self, "top_p", check_float("top_p", self.top_p, 0.0, 1.0, open_min=True))
        if self.min_p is not None:
            object.__setattr__(self, "min_p", check_float("min_p", self.min_p, 0.0, 1.0))

    def controls(self) -> dict:
        """The keywords of the ops' draws (sample_categorical, sample_from_hidden): the cuts set."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}


@dataclass(frozen=True)
class Execution:
    """Reference or fused run; for the fused run, the stop-check interval and compaction; the
    precision of the networks.

    dtype: "auto" (bfloat16 on CUDA, float32 on the CPU), "float32", "bfloat16" or "float16".
    Below float32 the networks run under torch.autocast in that precision (a network whose
    weights are already cast, ddpd.models.prepare_for_sampling, runs as it is); the sampler's
    own arithmetic (planner probabilities, time estimates, Gumbel keys) stays float32.
    graphs: "auto" replays the fused DDPD steps between stop checks from CUDA graphs where the
    run allows it (CUDA, a PhiloxNoise source, a fixed temperature), "off" never does,
    "emulate" runs the capture and replay logic without CUDA where a run allows it (a
    PhiloxNoise source, a fixed temperature; ddpd.sampling.graphs).
    """

    fused: bool = False
    sync_every: int = 8
    compaction: bool = True
    dtype: str = "auto"
    graphs: str = "auto"

    def __post_init__(self) -> None:
        check_bool("fused", self.fused)
        check_int("sync_every", self.sync_every, 1)
        check_bool("compaction", self.compaction)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("graphs", self.graphs, GRAPHS)


def _field_names(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


def resolve(sampler: str, options: dict, *kinds: type) -> tuple:
    """One validated object per kind in `kinds`, from the keyword arguments of a sampler call.

    Each kind is given either as an object under its keyword (`ddpd=DDPDOptions(...)`,
    `execution=Execution(...)`) or field by field (`selection=...`, `fused=...`), not both.
    Unknown keywords raise a TypeError that lists the ones `sampler` accepts.
    """
    options = dict(options)
    resolved = []
    for kind in kinds:
        key, fields = KEYWORDS[kind], _field_names(kind)
        given = {name: options.pop(name) for name in fields if name in options}
        whole = options.pop(key, None)
        if whole is not None:
            if not isinstance(whole, kind):
                raise TypeError(f"{sampler}: {key} must be a {kind.__name__}, got {type(whole).__name__}")
            if given:
                raise TypeError(f"{sampler}: pass {key}= or its fields {sorted(given)}, not both")
            resolved.append(whole)
        else:
            resolved.append(kind(**given))
    if options:
        accepted = sorted(name for kind in kinds for name in (KEYWORDS[kind],) + _field_names(kind))
        raise TypeError(f"{sampler}() got unexpected keyword argument(s) {sorted(options)}; "
                        f"its options are {accepted}")
    return tuple(resolved)


KEYWORDS = {DDPDOptions: "ddpd", Execution: "execution", Truncation: "truncation"}
