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

Each chain is written once; fused=True hands it the fused Draws strategy
(ddpd.sampling.draws): the token draws are done by ddpd.ops.sample_categorical and no
host synchronisation happens in a step, so the denoiser runs on every row in the batch
(the reference skips rows without a jump). Mask tau-leaping's finished rows (eta = 0)
leave the batch at a stop check every sync_every steps (compaction=False: never).
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.sampling.batch import RunningBatch, SampleResult
from ddpd.sampling.common import Run, expand, setup, start, subset
from ddpd.sampling.draws import Draws
from ddpd.sampling.gillespie import DENOISER_TYPES, mask_time
from ddpd.sampling.noise import EVENT, MASK, NoiseSource
from ddpd.sampling.options import Temperature
from ddpd.validation import check_bool, check_callable, check_choice, check_float


def tau_leaping_mask(
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    eta: float = 0.0,
    temperature: Union[float, Temperature] = 1.0,
    seed: Optional[int] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    **options,
) -> SampleResult:
    """Mask-diffusion tau-leaping from the all-mask sequence, with remasking stochasticity eta.

    denoiser(x Long[B, D] with mask_id (default vocab_size) at masked positions,
    t Float[B]) -> Float[B, D, vocab_size] logits of p(x_1^d | x_t), called at the
    grid time and only for rows with at least one unmasking in the step (reference run).
    Per step and position: a mask unmasks with probability dt (alpha_dot + eta alpha)/(1 - alpha)
    (clamped to 1), a token is remasked with probability eta dt. With eta = 0 a row
    stops once it has no mask left. Randomness: seed, noise or generator=.
    options: temperature_end, schedule, mask_id, generator, labels, guidance_scale (class
    conditioning, ddpd.sampling.common), x_init and frozen (a prompt:
    frozen positions start unmasked at their values and are never remasked), top_k, top_p,
    min_p (ddpd.sampling.options.Truncation), and fused, sync_every, compaction, dtype (or
    execution=Execution(...)): see the module docstring.
    """
    check_callable("denoiser", denoiser)
    eta = check_float("eta", eta, 0.0, float("inf"), open_max=True)
    run, draws, _ = setup("tau_leaping_mask", batch_size, length, vocab_size, steps, temperature, seed, noise,
                          device, options, masks=True)
    grid = _Grid(run)
    batch = start(run, draws, masks=True)
    with torch.no_grad():
        for i in range(run.steps):
            last = i == run.steps - 1
            unmask_p = grid.jump_probability(i, eta)
            remask_p = 0.0 if last else min(1.0, eta * grid.dt)
            masked = batch.x == run.mask_id  # never a frozen position: those hold their given values
            u = run.noise.uniform(i, EVENT, batch.rows, length)
            unmask = masked & (u < unmask_p)
            remask = _free(batch, ~masked & (u < remask_p))
            x = torch.where(remask, torch.full_like(batch.x, run.mask_id), batch.x)
            batch.x = _draw_where(run, draws, batch, denoiser, i, x, batch.x, unmask, grid.t(i, len(batch)))
            if eta == 0.0 and not last:
                batch.finish(~(batch.x == run.mask_id).any(-1), i + 1, check=batch.check_due(i))
                if batch.finished:
                    break
    return batch.result(run.steps)


def tau_leaping_uniform(
    model: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    temperature: Union[float, Temperature] = 1.0,
    seed: Optional[int] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    **options,
) -> SampleResult:
    """Uniform-diffusion tau-leaping (DFM-Uni) from uniform noise with one model.

    model(x, t) -> Float[B, D, V] logits of p(x_1^d | x_t). Per step and position:
    jump with probability dt alpha_dot/(1 - alpha) (1 - p(x_1^d = x_t^d | x_t))
    (clamped to 1) to j != x_t^d drawn from p(x_1^d = j | x_t) at the logit
    temperature. Calls are counted in denoiser_calls. options: temperature_end,
    schedule, generator, labels, guidance_scale, x_init and frozen (frozen positions never
    jump), top_k, top_p, min_p (of the jump's draw, after the current token is excluded),
    fused, dtype (see the module docstring and ddpd.sampling.options).
    """
    check_callable("model", model)
    run, draws, _ = setup("tau_leaping_uniform", batch_size, length, vocab_size, steps, temperature, seed, noise,
                          device, options)
    grid = _Grid(run)
    batch = start(run, draws)
    with torch.no_grad():
        for i in range(run.steps):
            logits = batch.denoiser(model, batch.x, grid.t(i, len(batch)), vocab_size, "model")
            p_stay = logits.log_softmax(-1).gather(-1, batch.x[..., None]).squeeze(-1).exp()
            jump = run.noise.uniform(i, EVENT, batch.rows, length) < (grid.jump_probability(i) * (1.0 - p_stay))
            jump = _free(batch, jump)
            # New values exclude the current one: the rate is defined for j != x_t^d only.
            tokens = draws.tokens_everywhere(i, batch.rows, logits, run.temperature_at(i), exclude=batch.x)
            batch.x = torch.where(jump, tokens, batch.x)
            batch.count_commits(jump.sum(-1))
    return batch.result(run.steps)


def tau_leaping_planned(
    planner: Callable,
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    denoiser_type: str = "uniform",
    temperature: Union[float, Temperature] = 1.0,
    seed: Optional[int] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    **options,
) -> SampleResult:
    """Planner x denoiser tau-leaping (P x UniD, P x MaskD) from uniform noise.

    planner(x) (or planner(x, t) with time_conditioned_planner=True) -> Float[B, D] logits;
    denoiser(x, t) -> Float[B, D, V] logits, of p(x_1^d | x_t, z^d = N) for
    denoiser_type='uniform' (called at the grid time) or of a mask denoiser for 'mask'
    (called on the masked sequence at t = alpha^{-1}(1 - #masked / D)). Per step a
    position jumps with probability dt alpha_dot/(1 - alpha) p(z^d = N | x_t) to a
    draw of the denoiser (which may return the current value). options:
    time_conditioned_planner, temperature_end, schedule, mask_id, generator, labels,
    guidance_scale, conditional_planner, x_init and frozen (a frozen position has
    p(z = N) = 0: it never jumps and is never masked), top_k, top_p, min_p, fused, dtype (see
    the module docstring and ddpd.sampling.options).
    """
    check_callable("planner", planner)
    check_callable("denoiser", denoiser)
    check_choice("denoiser_type", denoiser_type, DENOISER_TYPES)
    time_conditioned = check_bool("time_conditioned_planner", options.pop("time_conditioned_planner", False))
    run, draws, _ = setup("tau_leaping_planned", batch_size, length, vocab_size, steps, temperature, seed, noise,
                          device, options, masks=True, planner=True)
    grid = _Grid(run)
    batch = start(run, draws)
    with torch.no_grad():
        for i in range(run.steps):
            t = grid.t(i, len(batch))
            logits = batch.planner(planner, batch.x, t) if time_conditioned else batch.planner(planner, batch.x)
            p = _free(batch, torch.sigmoid(logits))  # a frozen position is never noise
            jump = run.noise.uniform(i, EVENT, batch.rows, length) < grid.jump_probability(i) * p
            x_in, t_in = batch.x, t
            if denoiser_type == "mask":
                z = (run.noise.uniform(i, MASK, batch.rows, length) < p) | jump
                x_in = torch.where(z, torch.full_like(batch.x, run.mask_id), batch.x)
                t_in = mask_time(z.sum(-1), run)
            batch.x = _draw_where(run, draws, batch, denoiser, i, batch.x, x_in, jump, t_in)
    return batch.result(run.steps)


class _Grid:
    """The uniform time grid t_i = i / T and the noise-removal rate on it."""

    def __init__(self, run: Run):
        self.run = run
        self.dt = 1.0 / run.steps

    def t(self, step: int, n: int) -> Tensor:
        return torch.full((n,), step * self.dt, dtype=torch.float32, device=self.run.device)

    def jump_probability(self, step: int, eta: float = 0.0) -> float:
        """dt (alpha_dot + eta alpha) / (1 - alpha) at the start of the step, clamped to 1.

        eta = 0 is the noise-removal rate; it is 1 at the last step, where the rate is
        infinite at t = 1 for the schedules of ddpd.process (and is taken so for any).
        """
        if step == self.run.steps - 1:
            return 1.0
        schedule = self.run.schedule
        t = torch.tensor(step * self.dt, dtype=torch.float64)
        a = schedule.alpha(t)
        return min(1.0, self.dt * float((schedule.alpha_dot(t) + eta * a) / (1.0 - a)))


def _free(batch: RunningBatch, values: Tensor) -> Tensor:
    """values (Bool or Float [B, D]) set to 0 at the positions a prompt froze."""
    frozen = batch.state.get("frozen")
    return values if frozen is None else values.masked_fill(frozen, 0)


def _draw_where(run: Run, draws: Draws, batch: RunningBatch, denoiser: Callable, step: int, x: Tensor,
                x_in: Tensor, where: Tensor, t: Tensor) -> Tensor:
    """x with the positions `where` (Bool[B, D]) drawn from denoiser(x_in, t).

    The reference run calls the denoiser on the rows with a draw only; the fused run does
    not know them without a host synchronisation and runs every row.
    """
    batch.count_commits(where.sum(-1))
    index = draws.rows_with(where.any(-1))
    if index is not None and index.numel() == 0:
        return x
    x_in, t, rows = subset(index, x_in, t, batch.rows)
    used = where.any(-1) if index is None else None  # the rows with a draw, as the reference run passes
    logits = batch.denoiser(denoiser, x_in, t, run.vocab_size, rows=rows, used=used)
    tokens = draws.tokens_everywhere(step, rows, logits, run.temperature_at(step))
    return torch.where(where, expand(index, tokens, x), x)
