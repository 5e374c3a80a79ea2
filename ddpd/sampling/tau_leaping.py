"""Tau-leaping baselines: the reverse CTMC on a uniform time grid t_i = i / T.

Every position jumps independently within a step with probability rate * dt
(eq. reverse_transition_prob), all jumps applied at the end of the step.

- `tau_leaping_mask` (DFM, Campbell et al. 2024): mask diffusion, eq.
  trans_prob_decomp_mask, with stochasticity eta: a masked position unmasks at rate
  (alpha_dot + eta alpha) / (1 - alpha) to a draw of the denoiser, an unmasked one
  is remasked at rate eta (the detailed-balance term; alpha = t gives DFM's
  (1 + eta t) / (1 - t)).
- `tau_leaping_uniform` (DFM-Uni): a single uniform model, rate
  alpha_dot / (1 - alpha) p(x_1^d = j | x_t) for every j != x_t^d
  (eq. rate_decomposition_uniform_D).
- `tau_leaping_planned` (P x UniD, P x MaskD): rate
  alpha_dot / (1 - alpha) * p(z^d = N | x_t) * p(x_1^d = j | x_t, z^d = N)
  (eq. jump_rate_parameterization); with a mask denoiser the jumping positions
  are denoised through prop:draw_with_maskD (all of them masked, the others masked
  with the planner's probability).

The last step removes whatever noise is left: its probabilities are clamped to 1
where the rate is infinite at t = 1, no position is remasked in it, and every mask
still present is filled.

fused=True: the same chains with the token draws done by ddpd.ops.sample_categorical
(ddpd.sampling.fused_draws) and no host synchronisation in a step: the denoiser runs
on every row in the batch. Mask tau-leaping's finished rows (eta = 0) leave the
batch at a stop check every sync_every steps (compaction=False: never).
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.process import Schedule, get_schedule
from ddpd.sampling import steps as step_fns
from ddpd.sampling.common import (RunningBatch, SampleResult, check_bool, check_callable, check_choice, check_float,
                                  check_int, check_shape, check_temperatures, initial_noise)
from ddpd.sampling.fused_batch import check_fused_options, make_batch
from ddpd.sampling.fused_draws import OpDraws, draw_everywhere, draw_where
from ddpd.sampling.noise import EVENT, MASK, TOKEN, NoiseSource, make_noise

DENOISER_TYPES = ("uniform", "mask")


class _Grid:
    """The uniform time grid, the noise-removal rate on it and the temperature schedule."""

    def __init__(self, steps: int, schedule: Union[str, Schedule], temperature, temperature_end):
        self.steps = check_int("steps", steps, 1)
        self.schedule = get_schedule(schedule)
        self.temperatures = check_temperatures(temperature, temperature_end)
        self.dt = 1.0 / steps

    def time(self, step: int) -> float:
        return step * self.dt

    def jump_probability(self, step: int, eta: float = 0.0) -> float:
        """dt (alpha_dot + eta alpha) / (1 - alpha) at the start of the step, clamped to 1.

        eta = 0 is the noise-removal rate; it is 1 at the last step, where the rate is
        infinite at t = 1 for the schedules of ddpd.process (and is taken so for any).
        """
        if step == self.steps - 1:
            return 1.0
        t = torch.tensor(self.time(step), dtype=torch.float64)
        a = self.schedule.alpha(t)
        return min(1.0, self.dt * float((self.schedule.alpha_dot(t) + eta * a) / (1.0 - a)))

    def temperature(self, step: int) -> float:
        return step_fns.temperature_at(step, self.steps, *self.temperatures)

    def t_batch(self, step: int, n: int, device) -> Tensor:
        return torch.full((n,), self.time(step), dtype=torch.float32, device=device)


def tau_leaping_mask(
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    eta: float = 0.0,
    temperature: float = 1.0,
    temperature_end: Optional[float] = None,
    schedule: Union[str, Schedule] = "linear",
    mask_id: Optional[int] = None,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    fused: bool = False,
    sync_every: int = 8,
    compaction: bool = True,
) -> SampleResult:
    """Mask-diffusion tau-leaping from the all-mask sequence, with remasking stochasticity eta.

    denoiser(x Long[B, D] with mask_id (default vocab_size) at masked positions,
    t Float[B]) -> Float[B, D, vocab_size] logits of p(x_1^d | x_t), called at the
    grid time and only for rows with at least one unmasking in the step. Per step
    and position: a mask unmasks with probability dt (alpha_dot + eta alpha)/(1 - alpha)
    (clamped to 1), a token is remasked with probability eta dt. With eta = 0 a row
    stops once it has no mask left. Randomness: one of seed, generator, noise.
    fused, sync_every, compaction: see the module docstring.
    """
    check_callable("denoiser", denoiser)
    check_shape(batch_size, length, vocab_size)
    grid = _Grid(steps, schedule, temperature, temperature_end)
    eta = check_float("eta", eta, 0.0)
    mask_id = vocab_size if mask_id is None else check_int("mask_id", mask_id, vocab_size)
    check_fused_options(fused, sync_every, compaction)
    noise = make_noise(seed, generator, noise)
    x0 = torch.full((batch_size, length), mask_id, dtype=torch.long, device=device)
    batch = make_batch(x0, fused, sync_every, compaction)
    draw = draw_where if fused else _draw_where
    for i in range(grid.steps):
        last = i == grid.steps - 1
        unmask_p = grid.jump_probability(i, eta)
        remask_p = 0.0 if last else min(1.0, eta * grid.dt)
        masked = batch.x == mask_id
        u = noise.uniform(i, EVENT, batch.rows, length)
        unmask = masked & (u < unmask_p)
        remask = ~masked & (u < remask_p)
        x = torch.where(remask, torch.full_like(batch.x, mask_id), batch.x)
        batch.x = draw(batch, denoiser, i, x, batch.x, unmask, grid.t_batch(i, len(batch), x.device),
                       noise, vocab_size, grid.temperature(i))
        if eta == 0.0 and not last:
            batch.finish(~(batch.x == mask_id).any(-1), i + 1)
            if batch.finished:
                return batch.result(i + 1)
    return batch.result(grid.steps)


def tau_leaping_uniform(
    model: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    temperature: float = 1.0,
    temperature_end: Optional[float] = None,
    schedule: Union[str, Schedule] = "linear",
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    fused: bool = False,
) -> SampleResult:
    """Uniform-diffusion tau-leaping (DFM-Uni) from uniform noise with one model.

    model(x, t) -> Float[B, D, V] logits of p(x_1^d | x_t). Per step and position:
    jump with probability dt alpha_dot/(1 - alpha) (1 - p(x_1^d = x_t^d | x_t))
    (clamped to 1) to j != x_t^d drawn from p(x_1^d = j | x_t) at the logit
    temperature. Calls are counted in denoiser_calls. fused: see the module docstring.
    """
    check_callable("model", model)
    check_shape(batch_size, length, vocab_size)
    grid = _Grid(steps, schedule, temperature, temperature_end)
    check_bool("fused", fused)
    noise = make_noise(seed, generator, noise)
    batch = RunningBatch(initial_noise(noise, batch_size, length, vocab_size, device))
    width = step_fns.token_noise_width(vocab_size)
    for i in range(grid.steps):
        t = grid.t_batch(i, len(batch), batch.x.device)
        logits = batch.denoiser(model, batch.x, t, vocab_size, "model")
        p_stay = logits.log_softmax(-1).gather(-1, batch.x[..., None]).squeeze(-1).exp()
        jump = noise.uniform(i, EVENT, batch.rows, length) < (grid.jump_probability(i) * (1.0 - p_stay))
        # New values exclude the current one: the rate is defined for j != x_t^d only.
        if fused:
            tokens = draw_everywhere(OpDraws(noise), i, batch.rows, logits, grid.temperature(i), exclude=batch.x)
        else:
            u = noise.uniform(i, TOKEN, batch.rows, length * width).view(len(batch), length, width)
            logits = logits.scatter(-1, batch.x[..., None], float("-inf"))
            tokens = step_fns.sample_categorical(logits, u, grid.temperature(i))
        batch.x = torch.where(jump, tokens, batch.x)
    return batch.result(grid.steps)


def tau_leaping_planned(
    planner: Callable,
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    denoiser_type: str = "uniform",
    time_conditioned_planner: bool = False,
    temperature: float = 1.0,
    temperature_end: Optional[float] = None,
    schedule: Union[str, Schedule] = "linear",
    mask_id: Optional[int] = None,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    fused: bool = False,
) -> SampleResult:
    """Planner x denoiser tau-leaping (P x UniD, P x MaskD) from uniform noise.

    planner(x) (or planner(x, t) when time_conditioned_planner) -> Float[B, D] logits;
    denoiser(x, t) -> Float[B, D, V] logits, of p(x_1^d | x_t, z^d = N) for
    denoiser_type='uniform' (called at the grid time) or of a mask denoiser for 'mask'
    (called on the masked sequence at t = alpha^{-1}(1 - #masked / D)). Per step a
    position jumps with probability dt alpha_dot/(1 - alpha) p(z^d = N | x_t) to a
    draw of the denoiser (which may return the current value). fused: see the
    module docstring.
    """
    check_callable("planner", planner)
    check_callable("denoiser", denoiser)
    check_shape(batch_size, length, vocab_size)
    check_choice("denoiser_type", denoiser_type, DENOISER_TYPES)
    grid = _Grid(steps, schedule, temperature, temperature_end)
    mask_id = vocab_size if mask_id is None else check_int("mask_id", mask_id, vocab_size)
    check_bool("fused", fused)
    noise = make_noise(seed, generator, noise)
    batch = RunningBatch(initial_noise(noise, batch_size, length, vocab_size, device))
    draw = draw_where if fused else _draw_where
    for i in range(grid.steps):
        t = grid.t_batch(i, len(batch), batch.x.device)
        logits = batch.planner(planner, batch.x, t) if time_conditioned_planner else batch.planner(planner, batch.x)
        p = torch.sigmoid(logits)
        jump = noise.uniform(i, EVENT, batch.rows, length) < grid.jump_probability(i) * p
        x_in, t_in = batch.x, t
        if denoiser_type == "mask":
            z = (noise.uniform(i, MASK, batch.rows, length) < p) | jump
            x_in = torch.where(z, torch.full_like(batch.x, mask_id), batch.x)
            t_in = step_fns.mask_time(z, grid.schedule)
        batch.x = draw(batch, denoiser, i, batch.x, x_in, jump, t_in, noise, vocab_size, grid.temperature(i))
    return batch.result(grid.steps)


def _draw_where(batch: RunningBatch, denoiser: Callable, step: int, x: Tensor, x_in: Tensor, where: Tensor,
                t: Tensor, noise: NoiseSource, vocab_size: int, temperature: float) -> Tensor:
    """x with the positions `where` drawn from denoiser(x_in, t); only rows with a draw call it."""
    rows = where.any(-1)
    if not bool(rows.any()):
        return x
    logits = batch.denoiser(denoiser, x_in[rows], t[rows], vocab_size)
    n, length = logits.shape[:2]
    width = step_fns.token_noise_width(vocab_size)
    u = noise.uniform(step, TOKEN, batch.rows[rows], length * width).view(n, length, width)
    tokens = step_fns.sample_categorical(logits, u, temperature)
    x = x.clone()
    x[rows] = torch.where(where[rows], tokens, x[rows])
    return x
