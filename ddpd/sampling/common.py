"""What every sampler shares: the checked settings of a run and the write of drawn tokens.

`setup` is the public boundary of every sampler: it checks the shape, step budget,
temperature, schedule, mask id and randomness, resolves the option objects of
ddpd.sampling.options from the call's keywords, and returns a `Run`; nothing below it
checks again. `initial_noise` is x_0 ~ uniform; `write` puts drawn tokens in place;
`subset` / `expand` restrict a pass to some rows and put its results back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ddpd.process import Schedule, get_schedule
from ddpd.sampling.draws import Draws, make_draws
from ddpd.sampling.noise import INIT, NoiseSource, make_noise
from ddpd.sampling.options import Execution, Temperature, resolve
from ddpd.validation import check_int


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

    def temperature_at(self, step: int) -> float:
        return self.temperature.at(step, self.steps)


def setup(sampler: str, batch_size, length, vocab_size, steps, temperature, seed, noise, device, options: dict,
          *kinds, masks: bool = False) -> Tuple[Run, Draws, tuple]:
    """Check a sampler call; returns (run, its Draws strategy, one option object per kind).

    options: the call's remaining keywords: `temperature_end`, `schedule`, `generator`,
    `mask_id` (samplers with a mask, masks=True), and the fields of Execution and of each
    kind (or the objects themselves, see ddpd.sampling.options.resolve).
    """
    check_int("batch_size", batch_size, 1)
    check_int("length", length, 1)
    check_int("vocab_size", vocab_size, 2)
    check_int("steps", steps, 1)
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
    execution, *objects = resolve(sampler, options, Execution, *kinds)
    device = None if device is None else torch.device(device)
    run = Run(batch_size, length, vocab_size, steps, temperature, schedule, mask_id, noise, device)
    return run, make_draws(noise, execution), tuple(objects)


def initial_noise(run: Run) -> Tensor:
    """x_0 ~ uniform over the vocabulary (p_noise^unif), from the INIT stream."""
    u = run.noise.uniform(0, INIT, torch.arange(run.batch_size, device=run.device), run.length)
    return (u * run.vocab_size).long().clamp_(max=run.vocab_size - 1)


def all_masks(run: Run) -> Tensor:
    """The all-mask sequence the mask-diffusion baselines start from."""
    return torch.full((run.batch_size, run.length), run.mask_id, dtype=torch.long, device=run.device)


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
