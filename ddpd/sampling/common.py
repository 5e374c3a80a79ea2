"""What every sampler shares: the checked settings of a run and the write of drawn tokens.

`setup` is the public boundary of every sampler: it checks the shape, step budget,
temperature, schedule, mask id, prompt and randomness, resolves the option objects of
ddpd.sampling.options from the call's keywords, and returns a `Run`; nothing below it
checks again. `start` gives the first state of a run (noise, with a prompt's given
values); `write` puts drawn tokens in place; `subset` / `expand` restrict a pass to
some rows and put its results back.

Prompts and infilling (every sampler): `x_init` Long[B, D] gives starting values, -1
where the sampler's own noise starts (uniform noise, or the mask for the mask-diffusion
samplers); `frozen` Bool[B, D] marks positions that keep their x_init value throughout:
they are never noised, never selected, never masked (each sampler says how).

Class labels (every sampler): `labels` Long[B] calls the denoiser as denoiser(x, t,
labels=...) and, with `guidance_scale` w != 1, also with labels=None (unconditional):
classifier-free guidance u + w (c - u) on its logits, or on its hidden states in the fused
run (exact through the linear head). `conditional_planner=True` passes the labels to the
planner too (ddpd.sampling.batch.Condition).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ddpd.models.precision import resolve_dtype
from ddpd.ops.sample_categorical import float32
from ddpd.process import Schedule, get_schedule, uniform_token
from ddpd.sampling.batch import Condition
from ddpd.sampling.draws import Draws, make_draws
from ddpd.sampling.noise import INIT, NoiseSource, make_noise
from ddpd.sampling.options import Execution, Temperature, Truncation, resolve
from ddpd.validation import check_bool, check_device, check_float, check_int


@dataclass(frozen=True)
class Run:
    """The checked settings of one sampler call."""

    batch_size: int
    length: int
    vocab_size: int
    steps: int
    temperature: Temperature
    schedule: Schedule
    mask_id: Optional[int]
    noise: NoiseSource
    device: Optional[torch.device]
    x_init: Optional[Tensor] = None
    frozen: Optional[Tensor] = None
    condition: Optional[Condition] = None
    truncation: Truncation = Truncation()

    def temperature_at(self, step: int) -> float:
        return self.temperature.at(step, self.steps)


def setup(sampler: str, batch_size, length, vocab_size, steps, temperature, seed, noise, device, options: dict,
          *kinds, masks: bool = False, planner: bool = False) -> tuple[Run, Draws, tuple]:
    """Check a sampler call; returns (run, its Draws strategy, one option object per kind).

    options: the call's remaining keywords: `temperature_end`, `schedule`, `generator`,
    `x_init`, `frozen`, `mask_id` (samplers with a mask, masks=True), `labels`,
    `guidance_scale`, `conditional_planner` (samplers with a planner network,
    planner=True), and the fields of Execution, Truncation and of each kind (or the
    objects themselves, see ddpd.sampling.options.resolve).
    """
    check_int("batch_size", batch_size, 1)
    check_int("length", length, 1)
    check_int("vocab_size", vocab_size, 2)
    check_int("steps", steps, 1, 2**61)  # noise offsets step * 8 + stream stay distinct mod 2**64
    options = dict(options)
    end = options.pop("temperature_end", None)
    if isinstance(temperature, Temperature):
        if end is not None:
            raise TypeError(f"{sampler}: pass temperature=Temperature(start, end) or temperature_end, not both")
    else:
        temperature = Temperature(temperature, end)
    schedule = get_schedule(options.pop("schedule", "linear"))
    mask_id = options.pop("mask_id", None) if masks else None
    if masks:
        mask_id = vocab_size if mask_id is None else check_int("mask_id", mask_id, vocab_size)
    noise = make_noise(seed, options.pop("generator", None), noise)
    if device is not None:
        device = check_device("device", device)
    x_init, frozen = check_prompt(options.pop("x_init", None), options.pop("frozen", None), batch_size, length,
                                  vocab_size, device)
    conditional_planner = options.pop("conditional_planner", False)
    if conditional_planner is not False and not planner:  # ignoring it would hide a mistake
        raise TypeError(f"{sampler}: conditional_planner does not apply (this sampler runs no planner network)")
    condition = check_condition(options.pop("labels", None), options.pop("guidance_scale", 1.0),
                                conditional_planner, batch_size, device)
    execution, truncation, *objects = resolve(sampler, options, Execution, Truncation, *kinds)
    dtype = resolve_dtype(execution.dtype, device)
    run = Run(batch_size, length, vocab_size, steps, temperature, schedule, mask_id, noise, device, x_init, frozen,
              condition, truncation)
    return run, make_draws(noise, execution, dtype, truncation), tuple(objects)


def check_prompt(x_init, frozen, batch_size: int, length: int, vocab_size: int, device) -> tuple:
    """(x_init, frozen) checked: Long[B, D] with values in [-1, V), Bool[B, D] where x_init holds values."""
    if x_init is None:
        if frozen is not None:
            raise ValueError("frozen needs x_init: the values the frozen positions keep")
        return None, None
    shape = (batch_size, length)
    if not isinstance(x_init, Tensor) or x_init.dtype != torch.long or tuple(x_init.shape) != shape:
        got = f"{x_init.dtype} of shape {tuple(x_init.shape)}" if isinstance(x_init, Tensor) else type(x_init).__name__
        raise ValueError(f"x_init must be a Long tensor of shape {list(shape)}, got {got}")
    x_init = x_init.to(device) if device is not None else x_init
    low, high = int(x_init.min()), int(x_init.max())  # once, before the loop
    if low < -1 or high >= vocab_size:
        raise ValueError(f"x_init values must be in [-1, {vocab_size}) (-1: start from noise), got range "
                         f"[{low}, {high}]")
    if frozen is None:
        return x_init, None
    if not isinstance(frozen, Tensor) or frozen.dtype != torch.bool or tuple(frozen.shape) != shape:
        got = f"{frozen.dtype} of shape {tuple(frozen.shape)}" if isinstance(frozen, Tensor) else type(frozen).__name__
        raise ValueError(f"frozen must be a Bool tensor of shape {list(shape)}, got {got}")
    frozen = frozen.to(x_init.device)
    if bool((frozen & (x_init < 0)).any()):
        raise ValueError("x_init must give a value (not -1) at every frozen position")
    return x_init, frozen


def check_condition(labels, guidance_scale, conditional_planner, batch_size: int, device) -> Optional[Condition]:
    """The class condition of a run: labels Long[B] (>= 0), guidance_scale >= 0 (1: none), or None."""
    if labels is None:
        if guidance_scale != 1.0 or conditional_planner:
            raise ValueError("guidance_scale and conditional_planner need labels (Long[B], one class per row)")
        return None
    if not isinstance(labels, Tensor) or labels.dtype != torch.long or tuple(labels.shape) != (batch_size,):
        got = f"{labels.dtype} of shape {tuple(labels.shape)}" if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be a Long tensor of shape [{batch_size}], got {got}")
    if labels.numel() and int(labels.min()) < 0:  # once, before the loop
        raise ValueError(f"labels must be >= 0 (class ids; the null label is passed as None), got {int(labels.min())}")
    # it multiplies float32 logits: a scale beyond float32's range would make every guided logit infinite
    scale = check_float("guidance_scale", guidance_scale, 0.0, torch.finfo(torch.float32).max)
    scale = 0.0 if float32(scale) == 0.0 else scale  # 0 in float32 (1e-46): 0 * -inf would be NaN
    check_bool("conditional_planner", conditional_planner)
    return Condition(labels.to(device) if device is not None else labels, scale, conditional_planner)


def start(run: Run, draws: Draws, masks: bool = False, **state: Tensor):
    """The running batch at the start of a run: x_0 ~ uniform over the vocabulary
    (p_noise^unif, from the INIT stream), or the all-mask sequence (masks=True), with the
    values x_init gives; the frozen positions (if any) in its state as "frozen"."""
    if masks:
        x0 = torch.full((run.batch_size, run.length), run.mask_id, dtype=torch.long, device=run.device)
    else:
        u = run.noise.uniform(0, INIT, torch.arange(run.batch_size, device=run.device), run.length)
        x0 = uniform_token(u, run.vocab_size)
    if run.x_init is not None:
        x0 = torch.where(run.x_init >= 0, run.x_init.to(x0.device), x0)
    if run.frozen is not None:
        state["frozen"] = run.frozen.to(x0.device)
    return draws.batch(x0, state, run.condition)


def free(batch, x: Tensor) -> Tensor:
    """Bool[B, D]: the positions a sampler may change (not frozen by a prompt)."""
    frozen = batch.state.get("frozen")
    return torch.ones_like(x, dtype=torch.bool) if frozen is None else ~frozen


def write(x: Tensor, positions: Tensor, tokens: Tensor, change: Tensor) -> Tensor:
    """x with tokens (Long[B, k]) at positions (Long[B, k]) where change (Bool[B, k]), else unchanged."""
    return x.scatter(1, positions, torch.where(change, tokens, x.gather(1, positions)))


def subset(index: Optional[Tensor], *tensors: Tensor) -> tuple:
    """The rows `index` of each tensor (all rows when index is None)."""
    return tensors if index is None else tuple(t[index] for t in tensors)


def expand(index: Optional[Tensor], part: Tensor, full: Tensor) -> Tensor:
    """`full` with its rows `index` replaced by `part` (`part` itself when index is None)."""
    if index is None:
        return part
    full = full.clone()
    full[index] = part
    return full
