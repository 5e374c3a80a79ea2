"""The DDPD sampler: adaptive Gillespie plan-and-denoise (Algorithm 1, alg:sampling).

Each step the planner scores every position, one position d' (or k of them) is
drawn in proportion to p(z^{d'} = N | x_t) (prop:self-loop-jumps), and the
denoiser redraws it from p(x_1^{d'} | x_t, z^{d'} = N). Options, named as in the
appendix 'Implementation details' (the listings' names differ):

- stop='eps' (A): a row stops once p(z^d = N | x_t) < eps at every position;
  stop='budget' (B): every row runs the whole step budget.
- selection='sigmoid': weights sigmoid(planner logit) (A); 'softmax' (C): softmax
  of the planner logits over positions, a greedier plan.
- denoiser_type='uniform': a denoiser of p(x_1^d | x_t, z^d = N);
  'mask': a mask-diffusion denoiser used through prop:draw_with_maskD: z drawn from
  the planner's marginals, the chosen positions always masked, the masked sequence
  given to the mask denoiser at t = alpha^{-1}(1 - #masked / D).
- clock='planner' (the paper's): the denoiser's time is the planner's estimate
  t = alpha^{-1}(1 - sum_d p_d / D) (section 'Adaptive Time Correction').
  clock='exact': the self-loop CTMC of prop:self-loop-jumps simulated exactly from
  t = 0 to t_end, see `_ExactClock`; with a time-conditioned planner
  p_t(z^d = N | x_t) and denoiser this is an exact sampler of p_data.
- k positions per step (drawn without replacement) during the first
  `parallel_steps` steps, then one at a time (refinement).
- temperature: denoiser logit temperature, fixed or annealed linearly to
  temperature_end over the step budget.
- fused=True (clock='planner'): the same sampler with the per-step work in
  ddpd.ops and finished rows leaving the batch at stop checks every sync_every
  steps (ddpd.sampling.fused); the code here is the reference.

`ddpd_sample_uniform` does the same with a single uniform-diffusion model
p(x_1^d | x_t) split into planner and denoiser by prop:generative_rate_decomposition
(eqs. corruption_prob and denoising_prob), as in the appendix's first listing.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.process import Schedule, denoiser_prob_from_uniform, get_schedule, planner_prob_from_uniform
from ddpd.sampling import steps as step_fns
from ddpd.sampling.common import (RunningBatch, SampleResult, check_callable, check_choice, check_float,
                                  check_int, check_shape, check_temperatures, initial_noise)
from ddpd.sampling.fused import fused_planner_clock
from ddpd.sampling.fused_batch import FusedBatch, check_fused_options
from ddpd.sampling.fused_draws import OpDraws
from ddpd.sampling.noise import ACCEPT, CLOCK, MASK, SELECT, TOKEN, NoiseSource, exponential, make_noise

DENOISER_TYPES = ("uniform", "mask")
STOPS = ("eps", "budget")
CLOCKS = ("planner", "exact")


def ddpd_sample(
    planner: Callable,
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    denoiser_type: str = "uniform",
    selection: str = "sigmoid",
    stop: Optional[str] = None,
    eps: float = 0.01,
    clock: str = "planner",
    time_conditioned_planner: bool = False,
    t_end: float = 1.0 - 1e-4,
    k: int = 1,
    parallel_steps: int = 0,
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
    """Sample `batch_size` sequences of `length` tokens with a planner and a denoiser.

    planner(x Long[B, D]) -> Float[B, D] logits of "position is noise"
    (planner(x, t) when time_conditioned_planner, which needs clock='exact');
    denoiser(x Long[B, D], t Float[B]) -> Float[B, D, vocab_size] logits; for
    denoiser_type='mask' its input holds mask_id (default vocab_size) at masked
    positions. steps: the step budget T. stop: 'eps' (default with clock='planner')
    or 'budget' (the only choice with clock='exact', which also ends at t_end).
    Randomness: one of seed, generator, noise (see ddpd.sampling.noise).

    fused=True runs ddpd.sampling.fused (clock='planner', eps < 1): same draws from
    the same noise. A denoiser exposing hidden(x, t) and an nn.Linear head (the
    ddpd.models networks, whose forward is head(hidden(x, t))) has its head applied
    at the chosen positions only; a plain callable's logits are gathered there.
    With stop='eps' finished rows are frozen at once and leave the batch at the
    stop check every sync_every steps (the only host synchronisation);
    compaction=False keeps them in the batch to the end (same samples, more
    row-evaluations). Both are ignored by the reference path, which removes a row
    the step it stops.
    Returns a SampleResult; stop_step is the number of steps each row took.
    """
    check_callable("planner", planner)
    check_callable("denoiser", denoiser)
    opts = _Options.check(batch_size, length, vocab_size, steps, selection, stop, eps, clock, t_end, k, parallel_steps,
                          temperature, temperature_end, schedule)
    check_choice("denoiser_type", denoiser_type, DENOISER_TYPES)
    if time_conditioned_planner and clock != "exact":
        raise ValueError("time_conditioned_planner=True needs clock='exact': the planner clock estimates "
                         "the time from a time-free planner")
    mask_id = vocab_size if mask_id is None else check_int("mask_id", mask_id, vocab_size)
    check_fused_options(fused, sync_every, compaction)
    if fused and clock != "planner":
        raise ValueError(f"fused=True needs clock='planner', got clock={clock!r}")
    if fused and opts.eps >= 1.0:
        raise ValueError(f"eps must be < 1 with fused=True, got {opts.eps}")
    noise = make_noise(seed, generator, noise)
    x0 = initial_noise(noise, batch_size, length, vocab_size, device)
    if fused:
        return fused_planner_clock(planner, denoiser, FusedBatch(x0, sync_every, compaction), OpDraws(noise), opts,
                                   denoiser_type, mask_id, vocab_size)
    batch = RunningBatch(x0)
    width = step_fns.token_noise_width(vocab_size)

    def plan(x: Tensor, t: Optional[Tensor]) -> Tensor:
        return batch.planner(planner, x, t) if time_conditioned_planner else batch.planner(planner, x)

    def denoise(i: int, rows: Tensor, x: Tensor, logits: Tensor, t: Optional[Tensor], kk: int) -> Tensor:
        p = torch.sigmoid(logits)
        log_w = step_fns.selection_log_weights(logits, selection)
        positions, valid = step_fns.select_positions(log_w, noise.uniform(i, SELECT, rows, length), kk)
        if denoiser_type == "mask":
            z = step_fns.draw_mask(p, noise.uniform(i, MASK, rows, length), positions)
            x_in, t = torch.where(z, torch.full_like(x, mask_id), x), step_fns.mask_time(z, opts.schedule)
        else:
            x_in, t = x, step_fns.planner_time(p, opts.schedule) if t is None else t
        x1_logits = batch.denoiser(denoiser, x_in, t, vocab_size)
        u = noise.uniform(i, TOKEN, rows, kk * width).view(-1, kk, width)
        return step_fns.denoise_positions(x, x1_logits, positions, valid, u, opts.temperature(i))

    loop = _exact_clock_loop if clock == "exact" else _planner_clock_loop
    steps_run = loop(batch, noise, opts, plan, denoise)
    return batch.result(steps_run)


def ddpd_sample_uniform(
    model: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    selection: str = "sigmoid",
    stop: Optional[str] = None,
    eps: float = 0.01,
    clock: str = "planner",
    t_end: float = 1.0 - 1e-4,
    k: int = 1,
    parallel_steps: int = 0,
    temperature: float = 1.0,
    temperature_end: Optional[float] = None,
    schedule: Union[str, Schedule] = "linear",
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
) -> SampleResult:
    """DDPD with one uniform-diffusion model(x, t) -> Float[B, D, V] logits of p(x_1^d | x_t).

    Planner: p(z^d = N | x_t) = 1 - p(x_1^d = x_t^d | x_t) alpha / (alpha + (1 - alpha) / S)
    (eq. corruption_prob); denoiser: p(x_1^d = j | x_t, z^d = N) of eq. denoising_prob,
    including the self-loop j = x_t^d. With clock='planner' each step calls the model
    twice, as the appendix's first listing does: at the previous step's time estimate
    (0 at the first step) to plan, then at the new estimate to denoise. With
    clock='exact' one call at the clock's time serves both. Every call is counted in
    denoiser_calls. Other arguments as in ddpd_sample.
    """
    check_callable("model", model)
    opts = _Options.check(batch_size, length, vocab_size, steps, selection, stop, eps, clock, t_end, k, parallel_steps,
                          temperature, temperature_end, schedule)
    noise = make_noise(seed, generator, noise)
    batch = RunningBatch(initial_noise(noise, batch_size, length, vocab_size, device))
    width = step_fns.token_noise_width(vocab_size)
    alpha = opts.schedule.alpha
    # Per-row state shared with the loops: "p_x1", the latest planning call's output
    # (reused to denoise on the exact clock), and "t_prev", the lagged time estimate.
    cache: dict = {}

    def plan(x: Tensor, t: Tensor) -> Tensor:
        p_x1 = batch.denoiser(model, x, t, vocab_size, "model").softmax(-1)
        cache["p_x1"] = p_x1
        p = planner_prob_from_uniform(p_x1, x, alpha(t))
        # Planner logits: log p - log(1 - p), clamped so that p = 1 stays finite for softmax.
        return torch.logit(p.double(), eps=1e-10).float() if selection == "softmax" else _log_odds(p)

    def denoise(i: int, rows: Tensor, x: Tensor, logits: Tensor, t: Optional[Tensor], kk: int) -> Tensor:
        log_w = step_fns.selection_log_weights(logits, selection)
        positions, valid = step_fns.select_positions(log_w, noise.uniform(i, SELECT, rows, length), kk)
        if t is None:  # planner clock: a second call at the new time estimate, kept for the next plan
            t = step_fns.planner_time(torch.sigmoid(logits), opts.schedule)
            p_x1 = batch.denoiser(model, x, t, vocab_size, "model").softmax(-1)
            cache["t_prev"] = t
        else:
            p_x1 = cache["p_x1"]
        q = denoiser_prob_from_uniform(p_x1, x, alpha(t))
        u = noise.uniform(i, TOKEN, rows, kk * width).view(-1, kk, width)
        return step_fns.denoise_positions(x, torch.log(q), positions, valid, u, opts.temperature(i))

    if clock == "exact":
        steps_run = _exact_clock_loop(batch, noise, opts, plan, denoise, filter_cache=cache)
    else:
        steps_run = _planner_clock_loop(batch, noise, opts, plan, denoise, lagged_time=cache)
    return batch.result(steps_run)


def _log_odds(p: Tensor) -> Tensor:
    """logit(p) exactly where it is finite; sigmoid of it returns p (0 and 1 included)."""
    return torch.log(p) - torch.log1p(-p)


class _Options:
    """Checked options shared by both DDPD entry points."""

    @classmethod
    def check(cls, batch_size, length, vocab_size, steps, selection, stop, eps, clock, t_end, k, parallel_steps,
              temperature, temperature_end, schedule) -> "_Options":
        check_shape(batch_size, length, vocab_size)
        o = cls()
        o.length, o.steps = length, check_int("steps", steps, 1)
        o.selection = check_choice("selection", selection, step_fns.SELECTIONS)
        o.clock = check_choice("clock", clock, CLOCKS)
        o.stop = ("eps" if clock == "planner" else "budget") if stop is None else check_choice("stop", stop, STOPS)
        if o.clock == "exact" and o.stop == "eps":
            raise ValueError("stop='eps' is not available with clock='exact', which runs to t_end; "
                             "use stop='budget' or clock='planner'")
        o.eps = check_float("eps", eps, 0.0, 1.0, open_min=True)
        o.t_end = check_float("t_end", t_end, 0.0, 1.0, open_min=True, open_max=True)
        o.k = check_int("k", k, 1, length)
        o.parallel_steps = check_int("parallel_steps", parallel_steps, 0, steps)
        if o.clock == "exact" and o.k > 1 and o.parallel_steps > 0:
            raise ValueError("k > 1 (parallel steps) is not available with clock='exact', "
                             "which simulates one jump at a time")
        o.temperatures = check_temperatures(temperature, temperature_end)
        o.schedule = get_schedule(schedule)
        return o

    def temperature(self, step: int) -> float:
        return step_fns.temperature_at(step, self.steps, *self.temperatures)

    def positions_per_step(self, step: int) -> int:
        return self.k if step < self.parallel_steps else 1


def _planner_clock_loop(batch: RunningBatch, noise: NoiseSource, opts: _Options, plan, denoise,
                        lagged_time: Optional[dict] = None) -> int:
    """Algorithm 1: plan, stop check (option A), denoise; the time comes from the planner.

    lagged_time: for the single uniform model, which needs a time to plan; holds the
    previous step's estimate per row (starting at 0).
    """
    if lagged_time is not None:
        lagged_time["t_prev"] = torch.zeros(len(batch), device=batch.x.device)
    for i in range(opts.steps):
        t_plan = lagged_time["t_prev"] if lagged_time is not None else None
        logits = plan(batch.x, t_plan)
        if opts.stop == "eps":
            keep = batch.finish((torch.sigmoid(logits) < opts.eps).all(-1), i)
            logits = logits[keep]
            if lagged_time is not None:
                lagged_time["t_prev"] = lagged_time["t_prev"][keep]
            if len(batch) == 0:
                return i
        batch.x = denoise(i, batch.rows, batch.x, logits, None, opts.positions_per_step(i))
    return opts.steps


def _exact_clock_loop(batch: RunningBatch, noise: NoiseSource, opts: _Options, plan, denoise,
                      filter_cache: Optional[dict] = None) -> int:
    """The self-loop CTMC of prop:self-loop-jumps simulated exactly, by thinning.

    Its total rate alpha_dot/(1 - alpha) * sum_d p_t(z^d = N | x) changes with t even
    while x stays put, so a holding time drawn from Exp(rate at the current t) is
    wrong. In the clock s = -log(1 - alpha_t) the rate is sum_d p_t(z^d = N | x) <= D,
    so candidate events at constant rate D in s, each accepted with probability
    sum_d p / D, are the exact jump times (Lewis-Shedler thinning); a rejected
    candidate leaves x unchanged. The run ends at t_end (s_end = -log(1 - alpha(t_end))),
    as s runs to infinity at t = 1, or when the step budget (candidates) is spent.
    """
    s_end = -math.log1p(-float(opts.schedule.alpha(torch.tensor(opts.t_end, dtype=torch.float64))))
    s = torch.zeros(len(batch), dtype=torch.float64, device=batch.x.device)
    for i in range(opts.steps):
        s = s + exponential(noise.uniform(i, CLOCK, batch.rows, 1)[:, 0]).double() / opts.length
        keep = batch.finish(s >= s_end, i)
        s = s[keep]
        if len(batch) == 0:
            return i
        t = opts.schedule.inverse(-torch.expm1(-s)).float()
        logits = plan(batch.x, t)
        p = torch.sigmoid(logits)
        accept = noise.uniform(i, ACCEPT, batch.rows, 1)[:, 0] * opts.length < p.sum(-1)
        if bool(accept.any()):
            if filter_cache is not None and "p_x1" in filter_cache:
                filter_cache["p_x1"] = filter_cache["p_x1"][accept]
            x = batch.x.clone()
            x[accept] = denoise(i, batch.rows[accept], x[accept], logits[accept], t[accept], 1)
            batch.x = x
    return opts.steps
