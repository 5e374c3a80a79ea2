"""MaskGIT (Chang et al. 2022): confidence-based parallel unmasking, a baseline of DDPD.

From the all-mask sequence, step i (of T) draws a token at every masked position
from the mask denoiser, scores each draw by its confidence log p(token) plus
annealed Gumbel noise tau_i g with tau_i = choice_temperature (1 - (i + 1) / T),
and keeps the n_i least confident positions masked, where the cosine schedule
n_i = floor(D cos(pi/2 (i + 1) / T)) is clamped to [1, m - 1] for m masked
positions (at least one unmasked per step, one left for later), and n = 0 at the
last step, which fills every remaining mask.

The Gumbel-perturbed ranking is a Plackett-Luce draw: the unmasked set is the first
m - n_i picks, without replacement, with weights p(token)^(1 / tau_i).

fused=True draws the tokens with ddpd.ops.sample_categorical (same tokens from the
same noise); every row runs every step, so nothing else changes.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.process import Schedule, get_schedule
from ddpd.sampling import steps as step_fns
from ddpd.sampling.common import (RunningBatch, SampleResult, check_bool, check_callable, check_float, check_int,
                                  check_shape, check_temperatures)
from ddpd.sampling.fused_draws import OpDraws, draw_everywhere
from ddpd.sampling.noise import CONFIDENCE, TOKEN, NoiseSource, gumbel, make_noise


def maskgit_sample(
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    temperature: float = 1.0,
    temperature_end: Optional[float] = None,
    choice_temperature: float = 4.5,
    schedule: Union[str, Schedule] = "linear",
    mask_id: Optional[int] = None,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    fused: bool = False,
) -> SampleResult:
    """MaskGIT sampling with a mask denoiser(x, t) -> Float[B, D, V] logits.

    The denoiser sees mask_id (default vocab_size) at masked positions and
    t = alpha^{-1}(1 - #masked / D). temperature (annealed linearly to temperature_end
    when given) tempers the token draws; confidences use the untempered model
    probabilities. choice_temperature scales the Gumbel noise on the confidences
    (MaskGIT's default 4.5; 0 ranks by confidence alone, ties broken by position).
    fused: draw the tokens with ddpd.ops.sample_categorical.
    """
    check_callable("denoiser", denoiser)
    check_shape(batch_size, length, vocab_size)
    check_int("steps", steps, 1)
    temperatures = check_temperatures(temperature, temperature_end)
    choice_temperature = check_float("choice_temperature", choice_temperature, 0.0)
    schedule = get_schedule(schedule)
    mask_id = vocab_size if mask_id is None else check_int("mask_id", mask_id, vocab_size)
    check_bool("fused", fused)
    noise = make_noise(seed, generator, noise)
    batch = RunningBatch(torch.full((batch_size, length), mask_id, dtype=torch.long, device=device))
    width = step_fns.token_noise_width(vocab_size)
    for i in range(steps):
        masked = batch.x == mask_id
        logits = batch.denoiser(denoiser, batch.x, step_fns.mask_time(masked, schedule), vocab_size)
        temperature = step_fns.temperature_at(i, steps, *temperatures)
        if fused:
            tokens = draw_everywhere(OpDraws(noise), i, batch.rows, logits, temperature)
        else:
            u = noise.uniform(i, TOKEN, batch.rows, length * width).view(len(batch), length, width)
            tokens = step_fns.sample_categorical(logits, u, temperature)
        tau = choice_temperature * (1.0 - (i + 1) / steps)
        confidence = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
        confidence = confidence + tau * gumbel(noise.uniform(i, CONFIDENCE, batch.rows, length))
        n_masked = _masks_left(masked.sum(-1), i, steps, length)
        unmask = masked & ~least_confident(confidence, masked, n_masked)
        batch.x = torch.where(unmask, tokens, batch.x)
    return batch.result(steps)


def _masks_left(m: Tensor, step: int, steps: int, length: int) -> Tensor:
    """n_i: masks left after the step, from the cosine schedule, clamped to [1, m - 1]."""
    if step == steps - 1:
        return torch.zeros_like(m)
    n = math.floor(length * math.cos(0.5 * math.pi * (step + 1) / steps))
    return torch.clamp(torch.clamp(m - 1, max=n), min=1)


def least_confident(confidence: Tensor, masked: Tensor, n: Tensor) -> Tensor:
    """Bool[B, D]: the n (Long[B]) masked positions of lowest confidence in each row.

    Unmasked positions never count; ties go to the lower position (stable sort).
    """
    score = confidence.masked_fill(~masked, float("inf"))
    order = score.argsort(dim=-1, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(score.shape[-1], device=score.device)
                                             .expand_as(order))
    return rank < n[:, None]
