"""Sampler options as validated, immutable objects, one per concern.

`Temperature` (the logit temperature, fixed or annealed), `DDPDOptions` (how Algorithm 1
plans, stops and keeps time), `Truncation` (top-k / top-p / min-p cuts of every token draw),
`Execution` (reference or fused run, stop checks, precision, CUDA graphs), `Prompt`
(prompts and infilling) and `Guidance` (class labels and classifier-free guidance).

Each object checks its own fields when built; `DDPDOptions.check` and `Prompt.check` add the
checks that need the run's shape. The samplers take these objects under one keyword each
(`ddpd=`, `truncation=`, `execution=`, `prompt=`, `guidance=`, `temperature=`); what
each field means is in docs/sampling.md.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.models.precision import resolve_dtype
from ddpd.ops.sample_categorical import MAX_TEMPERATURE, float32
from ddpd.sampling.policies import ErrorBudget
from ddpd.validation import check_bool, check_choice, check_float, check_int, check_tensor

SELECTIONS = ("sigmoid", "softmax")
STOPS = ("eps", "budget")
CLOCKS = ("planner", "exact")
DTYPES = ("auto", "float32", "bfloat16", "float16")
GRAPHS = ("auto", "off", "emulate")
T_END = 1.0 - 1e-4  # DDPDOptions.t_end's default


def check_temperature(name: str, value) -> float:
    """A logit temperature: a number in [0, MAX_TEMPERATURE] (0 = argmax), the range in
    which the ops' float32 draws are exact.

    Args:
        name: the argument's name, for the message.
        value: the value given.

    Returns:
        The temperature, a float.

    Raises:
        TypeError: not a number.
        ValueError: out of range.
    """
    return check_float(name, value, 0.0, MAX_TEMPERATURE)


@dataclass(frozen=True)
class Temperature:
    """The denoiser's logit temperature, fixed or annealed linearly.

    `start` at the first step, linearly to `end` at the last (`at`), or from time 0 to `end` at the
    run's final time (`over`, per row); docs/sampling.md#temperature says which a sampler uses.

    Attributes:
        start: The temperature at the start, in [0, MAX_TEMPERATURE]; 0 means argmax.
        end: The temperature at the end; None: `start` (a fixed temperature).
    """

    start: float = 1.0
    end: Optional[float] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", check_temperature("temperature", self.start))
        end = self.start if self.end is None else check_temperature("temperature_end", self.end)
        object.__setattr__(self, "end", end)

    def at(self, step: int, steps: int) -> float:
        """The temperature at `step` of `steps`: start at the first step, linearly to end at the last.

        Args:
            step: the step index.
            steps: the run's step budget.

        Returns:
            The temperature, a float.
        """
        if steps <= 1:
            return self.start
        if step >= steps - 1:  # exactly the end: rounding gave 1.7 to 0 in 42 steps -2.2e-16 there
            return self.end
        value = self.start + (self.end - self.start) * step / (steps - 1)
        return min(max(value, min(self.start, self.end)), max(self.start, self.end))  # never past either end

    def over(self, fraction: Tensor) -> Union[float, Tensor]:
        """The temperature of each row at `fraction` of the run's time: a number when fixed, so
        that a fixed temperature takes the ops' scalar path (and CUDA graphs).

        Args:
            fraction: Float[B], clamped to [0, 1].

        Returns:
            A float when the temperature is fixed, else Float32[B].
        """
        if self.start == self.end:
            return self.start
        value = self.start + (self.end - self.start) * fraction.float().clamp(0.0, 1.0)
        value = value.clamp(min(self.start, self.end), max(self.start, self.end))  # never past either end
        return torch.where(fraction >= 1.0, self.end, value)  # exactly the end there, as `at` is at the last step


@dataclass(frozen=True)
class DDPDOptions:
    """Plan, stop and clock of the DDPD sampler (appendix 'Implementation details': A, +B, +C).

    Attributes:
        selection: "sigmoid" (option A: weights sigmoid(planner logit)) or "softmax" (option C;
            on the exact clock it picks the accepted event's position, so the chain is no
            longer the CTMC of prop:self-loop-jumps and is not exact even with exact networks).
        stop: "eps" (A: a row stops once p(z^d = N | x_t) < eps everywhere) or "budget" (B: the
            whole step budget); None: eps on the planner clock, budget on the exact clock. Under
            a policy's plan_every > 1, eps reads the plan held between planner passes (positions
            committed since counted clean), so a row can stop before the planner sees its last tokens.
        eps: The threshold of the eps stop, in (0, 1).
        clock: "planner" (the time estimated from the planner, the paper's) or "exact" (the
            self-loop CTMC simulated exactly up to t_end).
        t_end: The exact clock's final time, in (0, 1); with clock="planner" only its default.
        k: Positions denoised per step during the first parallel_steps steps (k > 1 needs
            parallel_steps > 0, so no policy).
        parallel_steps: Steps of the parallel stage (> 0 needs k > 1); then one position per step.
        policy: An ErrorBudget commit policy (ddpd.sampling.policies), or None (commit every draw).
        one_pass: (ddpd_sample_uniform on the planner clock) the step's draws read its planning
            pass, the model at the previous step's time estimate, instead of a second pass at the
            new one: one pass a step where the paper's listing takes two (docs/sampling.md).
    """

    selection: str = "sigmoid"
    stop: Optional[str] = None  # eps with the planner clock, budget with the exact clock
    eps: float = 0.01
    clock: str = "planner"
    t_end: float = T_END
    k: int = 1
    parallel_steps: int = 0
    policy: Optional[ErrorBudget] = None
    one_pass: bool = False

    def __post_init__(self) -> None:
        check_choice("selection", self.selection, SELECTIONS)
        check_choice("clock", self.clock, CLOCKS)
        stop = ("eps" if self.clock == "planner" else "budget") if self.stop is None else self.stop
        object.__setattr__(self, "stop", check_choice("stop", stop, STOPS))
        object.__setattr__(self, "eps", check_float("eps", self.eps, 0.0, 1.0, open_min=True, open_max=True))
        object.__setattr__(self, "t_end", check_float("t_end", self.t_end, 0.0, 1.0, open_min=True, open_max=True))
        object.__setattr__(self, "k", check_int("k", self.k, 1))
        object.__setattr__(self, "parallel_steps", check_int("parallel_steps", self.parallel_steps, 0))
        if self.k > 1 and self.parallel_steps == 0:  # it would never be read
            raise ValueError(f"k={self.k} acts in the parallel stage only: give parallel_steps > 0 too (not with a "
                             "policy, which decides how many positions a step denoises)")
        if self.k == 1 and self.parallel_steps > 0:  # a parallel stage of k = 1 is every step's one position
            raise ValueError(f"parallel_steps={self.parallel_steps} is a stage of k positions a step, and k=1 is "
                             "every step's one: give k=2 or more")
        if self.policy is not None:
            if not isinstance(self.policy, ErrorBudget):
                raise TypeError(f"policy must be an ErrorBudget (ddpd.sampling.policies) or None, "
                                f"got {type(self.policy).__name__}")
            if self.clock == "exact":
                raise ValueError("policy needs clock='planner': the exact clock simulates one jump at a time")
            if self.parallel_steps > 0:
                raise ValueError("policy needs parallel_steps=0: the policy decides how many positions a step "
                                 "denoises")
        check_bool("one_pass", self.one_pass)
        if self.one_pass and self.clock == "exact":  # its one pass a step serves both already
            raise ValueError("one_pass is the planner clock's: the exact clock plans and denoises from one pass "
                             "already")
        if self.clock != "exact" and self.t_end != T_END:  # read nowhere else: refused rather than ignored
            raise ValueError(f"t_end={self.t_end} is read by clock='exact' only; the planner clock stops on eps "
                             "or the step budget")
        if self.clock == "exact":
            if self.stop == "eps":
                raise ValueError("stop='eps' is not available with clock='exact', which runs to t_end; "
                                 "use stop='budget' or clock='planner'")
            if self.k > 1 and self.parallel_steps > 0:
                raise ValueError("k > 1 (parallel steps) is not available with clock='exact', "
                                 "which simulates one jump at a time")

    def check(self, length: int, steps: int) -> DDPDOptions:
        """Checks the fields that depend on the run's shape.

        Args:
            length: The sequence length D (k may not exceed it).
            steps: The step budget (parallel_steps may not exceed it).

        Returns:
            self.

        Raises:
            ValueError: k or parallel_steps out of range.
        """
        check_int("k", self.k, 1, length)
        check_int("parallel_steps", self.parallel_steps, 0, steps)
        return self

    def positions_at(self, step: int) -> int:
        """Positions denoised at `step`: k in the parallel stage, then one.

        Args:
            step: the step index.

        Returns:
            The number of positions.
        """
        return self.k if step < self.parallel_steps else 1


@dataclass(frozen=True)
class Truncation:
    """Which tokens a denoiser draw may take; the draw is from the tempered law renormalised over
    what is kept (ddpd.ops.sample_categorical). Each cut None: no such cut; several: all apply.

    Attributes:
        top_k: Keep the top_k most probable tokens.
        top_p: Keep the smallest set of most probable tokens whose probability reaches top_p
            (over what top_k keeps).
        min_p: Keep the tokens with at least min_p times the top probability.
    """

    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None

    def __post_init__(self) -> None:
        if self.top_k is not None:
            object.__setattr__(self, "top_k", check_int("top_k", self.top_k, 1))
        if self.top_p is not None:
            object.__setattr__(self, "top_p", check_float("top_p", self.top_p, 0.0, 1.0, open_min=True))
        if self.min_p is not None:
            object.__setattr__(self, "min_p", check_float("min_p", self.min_p, 0.0, 1.0))

    def controls(self) -> dict:
        """The keywords of the ops' draws (sample_categorical, sample_from_hidden): the cuts set.

        Returns:
            A dict of top_k, top_p and min_p, those that are not None.
        """
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}


@dataclass(frozen=True)
class Execution:
    """How a run is carried out, not what it draws (docs/sampling.md#execution).

    Attributes:
        fused: Run the per-step draws in the ddpd.ops kernels with no host synchronisation inside
            a step (same draws from the same noise in float32); False: the plain-torch reference.
        sync_every: Steps between the fused run's stop checks, where finished rows leave the batch.
        compaction: Whether finished rows leave the batch at all (same samples either way).
        dtype: The networks' precision: "auto" (bfloat16 on CUDA, float32 on the CPU), "float32",
            "bfloat16" or "float16" (torch.autocast; the sampler's own arithmetic stays float32);
            the torch dtype of one of the last three is kept as its name.
        graphs: "auto" replays the fused steps between stop checks from CUDA graphs where the run
            allows it, "off" never does, "emulate" runs the capture and replay logic without CUDA.
    """

    fused: bool = False
    sync_every: int = 8
    compaction: bool = True
    dtype: str = "auto"
    graphs: str = "auto"

    def __post_init__(self) -> None:
        check_bool("fused", self.fused)
        object.__setattr__(self, "sync_every", check_int("sync_every", self.sync_every, 1))
        check_bool("compaction", self.compaction)
        if isinstance(self.dtype, torch.dtype):  # as prepare_for_sampling takes it; a name compares alike
            object.__setattr__(self, "dtype", str(resolve_dtype(self.dtype)).removeprefix("torch."))
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("graphs", self.graphs, GRAPHS)


@dataclass(frozen=True, eq=False)  # tensors: compared by identity
class Prompt:
    """Prompts and infilling: the values a run starts from, and the positions that keep them.

    A frozen position is data, not noise, at every t: it is never noised, selected or masked
    (docs/sampling.md#prompts-and-infilling says how each sampler treats it).

    Attributes:
        x_init: Long[B, D] starting values, -1 where the run starts from its own noise (uniform
            noise, or the mask for the mask-diffusion samplers).
        frozen: Bool[B, D] positions that keep their x_init value throughout, or None.

    Raises:
        TypeError: x_init not a Long tensor, frozen not a Bool tensor (or either not dense).
        ValueError: x_init not 2-d, frozen not of its shape, either off the cpu and cuda, or a
            frozen position without a value (-1).
    """

    x_init: Tensor
    frozen: Optional[Tensor] = None

    def __post_init__(self) -> None:
        check_tensor("x_init", self.x_init, (torch.long,), dim=2)
        if self.frozen is None:
            return
        shape = tuple(self.x_init.shape)
        check_tensor("frozen", self.frozen, (torch.bool,))
        if tuple(self.frozen.shape) != shape:
            raise ValueError(f"frozen must be a Bool tensor of shape {list(shape)}, got {described(self.frozen)}")
        if bool((self.frozen.to(self.x_init.device) & (self.x_init < 0)).any()):
            raise ValueError("x_init must give a value (not -1) at every frozen position")

    def check(self, batch_size: int, length: int, vocab_size: int, device=None) -> Optional[Prompt]:
        """Checks the prompt against the run's shape and vocabulary.

        Args:
            batch_size: B, the rows of the run.
            length: D, the sequence length.
            vocab_size: V; x_init's values must lie in [-1, V).
            device: Where the run's tensors live (None: where x_init is).

        Returns:
            The prompt on `device`, or None for one that gives no value (every x_init -1): the
            run is then the unprompted one, which skips a plan that a prompt would need.

        Raises:
            ValueError: x_init's shape is not [batch_size, length], or a value lies outside [-1, V).
        """
        shape = (batch_size, length)
        if tuple(self.x_init.shape) != shape:
            raise ValueError(f"x_init must be a Long tensor of shape {list(shape)}, got {described(self.x_init)}")
        x_init = self.x_init.to(device) if device is not None else self.x_init
        low, high = int(x_init.min()), int(x_init.max())  # once, before the loop
        if low < -1 or high >= vocab_size:
            raise ValueError(f"x_init values must be in [-1, {vocab_size}) (-1: start from noise), got range "
                             f"[{low}, {high}]")
        if high == -1:  # nothing given, nothing frozen (a frozen position holds a value)
            return None
        frozen = None if self.frozen is None else self.frozen.to(x_init.device)
        if x_init is self.x_init and frozen is self.frozen:  # already checked when built
            return self
        return Prompt(x_init, frozen)


@dataclass(frozen=True, eq=False)  # tensors: compared by identity
class Guidance:
    """Class labels and classifier-free guidance of the denoiser (docs/conditional.md).

    The denoiser is called as denoiser(x, t, labels=...) and, with scale w != 1, also with
    labels=None (unconditional; at w = 0 with labels=None alone): guidance u + w (c - u) on
    its logits, or on its hidden states in the fused run (exact through the linear head).

    Attributes:
        labels: Long[B] class ids (>= 0), one per row.
        scale: The guidance scale w >= 0: 1 the conditional model, 0 the unconditional one.
        conditional_planner: Whether the planner is called with the labels too (samplers that
            run a planner network only).

    Raises:
        TypeError: labels not a dense Long tensor, or conditional_planner not a bool.
        ValueError: labels not 1-d ids >= 0 on the cpu or cuda, or scale out of range.
    """

    labels: Tensor
    scale: float = 1.0
    conditional_planner: bool = False

    def __post_init__(self) -> None:
        check_tensor("labels", self.labels, (torch.long,), dim=1)
        if self.labels.numel() and int(self.labels.min()) < 0:  # once, before the loop
            raise ValueError(f"labels must be >= 0 (class ids; the null label is passed as None), "
                             f"got {int(self.labels.min())}")
        # it multiplies float32 logits: a scale beyond float32's range would make every guided logit infinite
        scale = check_float("scale", self.scale, 0.0, torch.finfo(torch.float32).max)
        object.__setattr__(self, "scale", 0.0 if float32(scale) == 0.0 else scale)  # 0 * -inf would be NaN
        check_bool("conditional_planner", self.conditional_planner)


def check_option(sampler: str, name: str, value, kind: type, optional: bool = False):
    """`value` if it is a `kind` (or None where optional), else a TypeError naming the keyword.

    Args:
        sampler: The sampler's name, for the message.
        name: The keyword the value was passed under.
        value: The value passed.
        kind: The options class expected.
        optional: Whether None is accepted.

    Returns:
        value.

    Raises:
        TypeError: value is not a `kind`.
    """
    if (value is None and optional) or isinstance(value, kind):
        return value
    article = "an" if kind.__name__[0] in "AEIOU" else "a"
    expected = f"{article} {kind.__name__}" + (" or None" if optional else "")
    raise TypeError(f"{sampler}: {name} must be {expected} (ddpd.sampling.options), got {type(value).__name__}")


def described(value) -> str:
    """How an error message names a value it refuses: a tensor's dtype and shape, else its type.

    Args:
        value: the value.

    Returns:
        The description.
    """
    if isinstance(value, Tensor):
        return f"{value.dtype} of shape {tuple(value.shape)}"
    return type(value).__name__


def _fields(kind: type) -> list[str]:
    return [field.name for field in dataclasses.fields(kind)]


# Where each keyword the samplers once took flat now goes.
MOVED = {
    **{name: f"ddpd=DDPDOptions({name}=...)" for name in _fields(DDPDOptions)},
    **{name: f"execution=Execution({name}=...)" for name in _fields(Execution)},
    **{name: f"truncation=Truncation({name}=...)" for name in _fields(Truncation)},
    "x_init": "prompt=Prompt(x_init, frozen)", "frozen": "prompt=Prompt(x_init, frozen)",
    "labels": "guidance=Guidance(labels, ...)", "guidance_scale": "guidance=Guidance(labels, scale=...)",
    "conditional_planner": "guidance=Guidance(labels, conditional_planner=...)",
    "temperature_end": "temperature=Temperature(start, end)",
}


def moved_hint(sampler: str, name: str, accepted) -> str:
    """How a sampler's error names a keyword it does not take: with the option object that holds
    it now, where the sampler takes that object.

    Args:
        sampler: the sampler's name.
        name: the keyword passed.
        accepted: the keywords the sampler takes.

    Returns:
        The keyword, with where it went.
    """
    if name not in MOVED:
        return name
    keyword = MOVED[name].split("=")[0]
    if keyword in accepted:
        return f"{name} (now {MOVED[name]})"
    # a DDPDOptions field given to a sampler without ddpd=: following the hint would fail again
    return f"{name} ({MOVED[name]} of other samplers; {sampler} takes no {keyword}=)"


def explains_moved_keywords(sampler: Callable) -> Callable:
    """Decorate a public sampler so that a keyword it does not take raises a TypeError naming the
    option object that holds it now (`fused=True` -> `execution=Execution(fused=...)`).

    Args:
        sampler: the sampler function.

    Returns:
        The same function, its signature and docstring kept (functools.wraps).
    """
    accepted = inspect.signature(sampler).parameters

    @functools.wraps(sampler)
    def checked(*args, **kwargs):
        unknown = [name for name in kwargs if name not in accepted]
        if unknown:
            hints = [moved_hint(sampler.__name__, name, accepted) for name in unknown]
            raise TypeError(f"{sampler.__name__}() got unexpected keyword argument(s): {', '.join(hints)}; "
                            f"its keywords are {sorted(name for name in accepted)}")
        return sampler(*args, **kwargs)

    return checked
