"""The DDPD sampler: adaptive Gillespie plan-and-denoise (Algorithm 1, alg:sampling), written once.

Each step the planner scores every position, one position d' (or k of them) is drawn in
proportion to p(z^{d'} = N | x_t) (prop:self-loop-jumps), and the denoiser redraws it
from p(x_1^{d'} | x_t, z^{d'} = N). `ddpd_sample_uniform` runs the same loops with a single
uniform-diffusion model split into planner and denoiser by prop:generative_rate_decomposition.

The loops below are the whole algorithm; a run is reference or fused by the Draws strategy
it is handed (ddpd.sampling.draws). The options (plan, stop, clock), how a prompt's frozen
positions enter the planner and the time estimate, and what the samplers reach on toys with
exact laws are in docs/sampling.md.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.process import Schedule, denoiser_log_prob_from_uniform, planner_prob_from_uniform
from ddpd.sampling.batch import RunningBatch, SampleResult, check_hidden, extended_softmax
from ddpd.sampling.common import Run, expand, on_device, row, run_steps, setup, start, subset, write
from ddpd.sampling.draws import Draws
from ddpd.sampling.noise import ACCEPT, BELOW_ONE, CLOCK, CONFIDENCE, NoiseSource, exponential, gumbel
from ddpd.sampling.options import (
    DDPDOptions,
    Execution,
    Guidance,
    Prompt,
    Temperature,
    Truncation,
    check_option,
    explains_moved_keywords,
)
from ddpd.sampling.policies import annealed, commit_risk, cosine_table, spread_minimum
from ddpd.validation import check_bool, check_callable, check_choice

DENOISER_TYPES = ("uniform", "mask")


@explains_moved_keywords
def ddpd_sample(
    planner: Callable,
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    denoiser_type: str = "uniform",
    time_conditioned_planner: bool = False,
    ddpd: DDPDOptions = DDPDOptions(),
    temperature: Union[float, Temperature] = 1.0,
    truncation: Truncation = Truncation(),
    execution: Execution = Execution(),
    prompt: Optional[Prompt] = None,
    guidance: Optional[Guidance] = None,
    schedule: Union[str, Schedule] = "linear",
    mask_id: Optional[int] = None,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
) -> SampleResult:
    """Sample `batch_size` sequences of `length` tokens with a planner and a denoiser (Algorithm 1).

    Example:
        >>> result = ddpd_sample(planner, denoiser, 16, 64, 27, steps=256, seed=0,
        ...                      ddpd=DDPDOptions(stop="eps", eps=0.01), execution=Execution(fused=True))
        >>> result.tokens.shape
        torch.Size([16, 64])

    Args:
        planner: planner(x Long[B, D]) -> Float[B, D] logits of "position is noise"
            (planner(x, t) when time_conditioned_planner).
        denoiser: denoiser(x Long[B, D], t Float[B]) -> Float[B, D, vocab_size] logits of the
            clean values; with denoiser_type="mask" its input holds mask_id at masked positions.
            One exposing hidden(x, t) and an nn.Linear head has the head applied at the chosen
            positions only in the fused run.
        batch_size: B, the number of sequences.
        length: D, the sequence length.
        vocab_size: V, the number of clean token values.
        steps: The step budget T.
        denoiser_type: "uniform" (a denoiser of p(x_1^d | x_t, z^d = N)) or "mask" (a mask
            denoiser used through prop:draw_with_maskD).
        time_conditioned_planner: Whether the planner takes the time, planner(x, t); needs
            DDPDOptions(clock="exact").
        ddpd: How Algorithm 1 plans, stops and keeps time (DDPDOptions): selection ("sigmoid" =
            option A, "softmax" = C), stop ("eps" = A, "budget" = B), eps (the stop threshold),
            clock ("planner": the time estimated from the planner; "exact": the self-loop CTMC
            simulated exactly up to t_end), t_end, k positions per step during the first
            parallel_steps steps, policy (an ErrorBudget commit policy, or None); one_pass is
            ddpd_sample_uniform's (refused here: two networks are two passes).
        temperature: The denoiser's logit temperature (0 = argmax), or a Temperature with fields
            start and end, annealed linearly over what ends the run: the budget's steps,
            the planner's time estimate under the eps stop, the clock's time on the exact clock.
        truncation: Cuts of every token draw's law (Truncation): top_k (the most probable
            tokens), top_p (nucleus), min_p (a fraction of the top probability); default: none.
        execution: How the run is carried out (Execution): fused (the ddpd.ops kernels, no host
            synchronisation inside a step, same draws from the same noise), sync_every (steps
            between stop checks), compaction (finished rows leave the batch there), dtype (the
            networks' precision, "auto" = bfloat16 on CUDA), graphs (CUDA-graph replay).
        prompt: Prompt(x_init, frozen) for prompts and infilling: x_init Long[B, D] (-1 where the
            run starts from noise), frozen Bool[B, D] the positions that keep their value
            throughout; None: no prompt.
        guidance: Guidance(labels, scale, conditional_planner): class labels Long[B] for the
            denoiser, the classifier-free guidance scale, and conditional_planner
            (whether the planner gets the labels too); None: unconditional.
        schedule: The noise schedule alpha_t: "linear", "cosine" or a ddpd.process.Schedule.
        mask_id: The mask token id (>= vocab_size; default vocab_size), with a mask denoiser only.
        seed: Seed of the Philox noise (per-row streams). At most one of seed, generator, noise;
            none: a seed drawn from torch's default generator.
        generator: A torch.Generator the Philox seed and offset are drawn from.
        noise: A NoiseSource (PhiloxNoise, TorchNoise) used as given.
        device: Where the run's tensors live (default: the CPU).

    Returns:
        A SampleResult (ddpd.sampling.batch): tokens Long[B, D], steps, per-row stop_step, the
        planner and denoiser passes per row, tokens_per_pass and the passes whose output held NaN.

    Raises:
        TypeError: An argument of the wrong type, an options object named by its keyword
            (e.g. execution=dict(...)).
        ValueError: An argument out of range, or options that contradict each other.
    """
    check_callable("planner", planner)
    check_callable("denoiser", denoiser)
    check_choice("denoiser_type", denoiser_type, DENOISER_TYPES)
    check_bool("time_conditioned_planner", time_conditioned_planner)
    ddpd = check_option("ddpd_sample", "ddpd", ddpd, DDPDOptions)
    if time_conditioned_planner and ddpd.clock != "exact":
        raise ValueError("time_conditioned_planner=True needs DDPDOptions(clock='exact'): the planner clock "
                         "estimates the time from a time-free planner")
    if ddpd.one_pass:
        raise ValueError("DDPDOptions(one_pass=True) is ddpd_sample_uniform's: a planner and a denoiser are two "
                         "networks, two passes")
    run, draws = setup("ddpd_sample", batch_size, length, vocab_size, mask_id=mask_id,
                       masks=denoiser_type == "mask", planner=True,
                       steps=steps, temperature=temperature, schedule=schedule, seed=seed,
                       generator=generator, noise=noise, device=device, prompt=prompt, guidance=guidance,
                       truncation=truncation, execution=execution)
    if execution.fused:  # the one call the fused run makes that the reference does not
        check_hidden("denoiser", denoiser, labels=run.condition is not None)
    networks = _PlannerDenoiser(planner, denoiser, run.vocab_size, time_conditioned_planner)
    return _algorithm1(run, draws, ddpd.check(run.length, run.steps), networks, denoiser_type == "mask")


@explains_moved_keywords
def ddpd_sample_uniform(
    model: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    ddpd: DDPDOptions = DDPDOptions(),
    temperature: Union[float, Temperature] = 1.0,
    truncation: Truncation = Truncation(),
    execution: Execution = Execution(),
    prompt: Optional[Prompt] = None,
    guidance: Optional[Guidance] = None,
    schedule: Union[str, Schedule] = "linear",
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
) -> SampleResult:
    """DDPD with one uniform-diffusion model of p(x_1^d | x_t), split into planner and denoiser.

    On the planner clock (the appendix's first listing) each step calls the model twice: at the
    previous step's time estimate to plan (the probability that a position changes) and at the
    new estimate to denoise (the jump law over j != x_t^d). On the exact clock one call at the
    clock's time serves both, split by eqs. corruption_prob and denoising_prob. On the planner
    clock DDPDOptions(one_pass=True) draws from the planning call too: one call a step. Every
    call is counted in denoiser_calls.

    Args:
        model: model(x Long[B, D], t Float[B]) -> Float[B, D, vocab_size] logits of p(x_1^d | x_t).
        batch_size: B, the number of sequences.
        length: D, the sequence length.
        vocab_size: V, the number of token values.
        steps: The step budget T.
        ddpd: How Algorithm 1 plans, stops and keeps time (DDPDOptions): selection ("sigmoid" =
            option A, "softmax" = C), stop ("eps" = A, "budget" = B), eps (the stop threshold),
            clock ("planner": the time estimated from the planner; "exact": the self-loop CTMC
            simulated exactly up to t_end), t_end, k positions per step during the first
            parallel_steps steps, policy (an ErrorBudget commit policy, or None), one_pass
            (planner clock: draw from the planning call, one model call a step).
        temperature: The denoiser's logit temperature (0 = argmax), or a Temperature with fields
            start and end, annealed linearly as in ddpd_sample.
        truncation: Cuts of every token draw's law (Truncation): top_k (the most probable
            tokens), top_p (nucleus), min_p (a fraction of the top probability); default: none.
        execution: How the run is carried out (Execution): fused (the ddpd.ops kernels, no host
            synchronisation inside a step, same draws from the same noise), sync_every (steps
            between stop checks), compaction (finished rows leave the batch there), dtype (the
            networks' precision, "auto" = bfloat16 on CUDA), graphs (CUDA-graph replay).
        prompt: Prompt(x_init, frozen) for prompts and infilling: x_init Long[B, D] (-1 where the
            run starts from noise), frozen Bool[B, D] the positions that keep their value
            throughout; None: no prompt.
        guidance: Guidance(labels, scale, conditional_planner): class labels Long[B] for the
            denoiser, the classifier-free guidance scale, and conditional_planner
            (whether the planner gets the labels too); None: unconditional.
        schedule: The noise schedule alpha_t: "linear", "cosine" or a ddpd.process.Schedule.
        seed: Seed of the Philox noise (per-row streams). At most one of seed, generator, noise;
            none: a seed drawn from torch's default generator.
        generator: A torch.Generator the Philox seed and offset are drawn from.
        noise: A NoiseSource (PhiloxNoise, TorchNoise) used as given.
        device: Where the run's tensors live (default: the CPU).

    Returns:
        A SampleResult (ddpd.sampling.batch): tokens Long[B, D], steps, per-row stop_step, the
        planner and denoiser passes per row, tokens_per_pass and the passes whose output held NaN.

    Raises:
        TypeError: An argument of the wrong type, an options object named by its keyword
            (e.g. execution=dict(...)).
        ValueError: An argument out of range, or options that contradict each other.
    """
    check_callable("model", model)
    ddpd = check_option("ddpd_sample_uniform", "ddpd", ddpd, DDPDOptions)
    run, draws = setup("ddpd_sample_uniform", batch_size, length, vocab_size,
                       steps=steps, temperature=temperature, schedule=schedule, seed=seed,
                       generator=generator, noise=noise, device=device, prompt=prompt, guidance=guidance,
                       truncation=truncation, execution=execution)
    networks = _UniformModel(model, run, ddpd.selection, exact=ddpd.clock == "exact", one_pass=ddpd.one_pass)
    return _algorithm1(run, draws, ddpd.check(run.length, run.steps), networks, masked=False)


# ---------------------------------------------------------------------------------------------- networks


class _PlannerDenoiser:
    """A planner and a denoiser network (or any callables with their signatures)."""

    takes_time = False  # the planner clock's planner sees x only
    cached = None  # two networks: no pass serves both

    def __init__(self, planner: Callable, denoiser: Callable, vocab_size: int, time_conditioned: bool):
        self.planner, self.denoiser = planner, denoiser
        self.vocab_size, self.time_conditioned = vocab_size, time_conditioned

    def plan(self, batch: RunningBatch, x: Tensor, t: Optional[Tensor]) -> Tensor:
        return batch.planner(self.planner, x, t) if self.time_conditioned else batch.planner(self.planner, x)

    def tokens(self, draws: Draws, batch: RunningBatch, step: int, x_in: Tensor, t: Tensor, positions: Tensor,
               rows: Tensor, temperature: float, index: Optional[Tensor], used: Optional[Tensor] = None,
               confidence: bool = False):
        return draws.tokens_at(batch, self.denoiser, step, x_in, t, positions, rows, self.vocab_size, temperature,
                               used, confidence)


class _UniformModel:
    """Planner and denoiser of prop:generative_rate_decomposition from one model of p(x_1 | x_t).

    exact (the exact clock): plan and denoise at the clock's t, split by eqs. corruption_prob
    and denoising_prob at alpha_t, self-loops included; the denoiser reads the planning
    call's p(x_1 | x_t). Otherwise (the planner clock) the split is taken at alpha = 1: the
    planner is the probability that a position changes, 1 - p(x_1^d = x_t^d | x_t), the
    denoiser the jump law over j != x_t^d, as the appendix's first listing computes them, and
    the denoiser calls the model again at its own time, or with one_pass reads the planning
    call (at the previous estimate). The planner clock cannot use alpha_t: its t is the
    planner's own estimate, and at alpha_t = 0 eq. corruption_prob is 1 at every position
    whatever the model says, so t = alpha^{-1}(1 - sum_d p / D) would stay 0 from the first
    step on (each step redrawing a position from the data marginal). The jumps are those of
    eq. rate_decomposition_uniform_D either way (position d, token j != x_t^d, in proportion
    to p(x_1^d = j | x_t) under sigmoid selection); alpha = 1 only drops the self-loop events,
    which would cost the planner clock steps and no time.
    """

    takes_time = True  # the planner needs a time: the previous estimate on the planner clock

    def __init__(self, model: Callable, run: Run, selection: str, exact: bool, one_pass: bool = False):
        self.model, self.vocab_size = model, run.vocab_size
        self.alpha = run.schedule.alpha if exact else torch.ones_like  # a tensor: no host copy in a graph
        self.softmax, self.reuse = selection == "softmax", exact or one_pass
        # the planning call's logits, which the step's draws read (reuse) once: a step without a
        # planner pass (a policy's plan_every) calls the model itself
        self.cached: Optional[Tensor] = None

    def _logits(self, batch: RunningBatch, x: Tensor, t: Tensor, rows: Optional[Tensor] = None,
                used: Optional[Tensor] = None) -> Tensor:
        return batch.denoiser(self.model, x, t, self.vocab_size, "model", rows=rows, used=used)

    def plan(self, batch: RunningBatch, x: Tensor, t: Tensor) -> Tensor:
        logits = self._logits(batch, x, t)
        self.cached = logits if self.reuse else None
        p = planner_prob_from_uniform(extended_softmax(logits), x, self.alpha(t))
        # Planner logits log p - log(1 - p); for softmax selection clamped so that p = 1 stays finite.
        return torch.logit(p.double(), eps=1e-10).float() if self.softmax else torch.log(p) - torch.log1p(-p)

    def tokens(self, draws: Draws, batch: RunningBatch, step: int, x_in: Tensor, t: Tensor, positions: Tensor,
               rows: Tensor, temperature: float, index: Optional[Tensor], used: Optional[Tensor] = None,
               confidence: bool = False):
        if self.cached is not None:
            logits = self.cached if index is None else self.cached[index]
            self.cached = None
        else:
            logits = self._logits(batch, x_in, t, rows, used)
        log_q = denoiser_log_prob_from_uniform(extended_softmax(logits, log=True), x_in, self.alpha(t))
        # No jump where the model is sure the token is clean (log q all -inf: planned at the
        # previous time, denoised at the new one): the position keeps its token.
        stays = torch.nn.functional.one_hot(x_in, self.vocab_size).bool()
        log_q = torch.where((log_q > float("-inf")).any(-1, keepdim=True), log_q,
                            torch.where(stays, 0.0, float("-inf")))
        return draws.tokens_from(step, rows, log_q, positions, temperature, confidence)


# ---------------------------------------------------------------------------------------------- the loops


def _algorithm1(run: Run, draws: Draws, opts: DDPDOptions, networks, masked: bool) -> SampleResult:
    batch = start(run, draws)
    loop = _exact_clock if opts.clock == "exact" else _planner_clock
    with torch.no_grad():
        loop(run, draws, opts, networks, batch, run.mask_id if masked else None)
    return batch.result(run.steps)


def _plan(networks, batch: RunningBatch, t: Optional[Tensor]) -> Tensor:
    """Planner logits of the batch; -inf at frozen positions: p(z^d = N | x_t) = 0 there (see
    `ddpd_sample` on prompts)."""
    logits = networks.plan(batch, batch.x, t)
    frozen = batch.state.get("frozen")
    return logits if frozen is None else logits.masked_fill(frozen, float("-inf"))


def _planner_clock(run: Run, draws: Draws, opts: DDPDOptions, networks, batch: RunningBatch,
                   mask_id: Optional[int]) -> None:
    """Algorithm 1: plan, stop check (option A), denoise; the time comes from the planner.

    A planner that needs a time (the single uniform model) is given the previous step's
    estimate, 0 at the first step (batch state "t_prev"). A step writes its results in place,
    so that the fused run can replay it from a CUDA graph (ddpd.sampling.graphs); `step` is
    the loop index, or the graph's step tensor.
    """
    if networks.takes_time:
        batch.state["t_prev"] = torch.zeros(len(batch), device=batch.x.device)

    policy = opts.policy
    order = min(policy.max_k, run.length) if policy is not None else 0
    if policy is not None and policy.known_noise:
        batch.state["touched"] = _given(batch)
    cos = None
    if policy is not None and policy.spread == "cosine":
        cos = on_device(cosine_table(run.steps), batch.x.device)
        if "given" in batch.state:  # it spreads the noise a row starts with: a prompt's positions are data
            batch.state["n0"] = (~_given(batch)).sum(-1).clamp(min=1).float()
    if policy is not None and policy.plan_every > 1:
        batch.state["plan"] = torch.zeros(batch.x.shape, device=batch.x.device)

    def one_step(step, temperature: float, last: bool, check: bool, k: int, plan_now: bool) -> None:
        logits = _policy_plan(networks, batch, plan_now, policy.revise_above if policy is not None else None)
        plan = draws.plan(step, logits, batch.rows, k, opts.selection, opts.eps, batch.x, mask_id, order)
        positions = plan.positions if plan.order is None else plan.order
        sum_p, masked, count = plan.sum_p, plan.masked, plan.count
        # between planner passes (plan_every > 1) the stop reads the held plan, the commits since
        # clean: a row can stop before the planner has seen its last tokens
        if opts.stop == "eps":  # the rows that stop leave the planning pass the draws may read too
            logits, positions, sum_p, masked, count, networks.cached = batch.finish(
                plan.stop, step, logits, positions, sum_p, masked, count, networks.cached, check=check)
            if batch.finished:
                return
        if mask_id is not None:
            x_in, t = masked, mask_time(count, run)
        else:
            x_in, t = batch.x, planner_time(sum_p, run, _noisy_positions(batch, run))
        if opts.stop == "eps":
            temperature = _eps_stop_temperature(run, opts, temperature, sum_p, batch, positions.shape[1])
        unwritten = None  # the spread spends the noise by the budget's end: the unwritten is noise for certain
        if last and policy is not None and policy.known_noise and policy.spread != "none":
            positions, unwritten = _unwritten_first(positions, ~batch.state["touched"])
        change = _changes(batch, logits, positions)
        if policy is None:
            tokens = networks.tokens(draws, batch, step, x_in, t, positions, batch.rows, temperature, None)
        else:
            tokens, confidence = networks.tokens(draws, batch, step, x_in, t, positions, batch.rows, temperature,
                                                 None, confidence=True)
            minimum = spread_minimum(policy.spread, sum_p, step, run.steps, batch.state.get("n0", run.length),
                                     None if cos is None else row(cos, step))
            change = change & policy.commit(commit_risk(logits, positions, confidence),
                                            _candidates(positions, masked, mask_id), minimum,
                                            _choice_noise(run, policy, step, batch.rows, positions.shape[1]),
                                            unwritten)
        batch.x.copy_(write(batch.x, positions, tokens, change))
        batch.count_commits(change.sum(1))
        if policy is not None:
            _remember_commits(batch, positions, change)
        if "t_prev" in batch.state:
            batch.state["t_prev"].copy_(t)

    run_steps(run, draws, batch, one_step, stops=opts.stop == "eps", kind=_step_kind(run, opts))


def _exact_clock(run: Run, draws: Draws, opts: DDPDOptions, networks, batch: RunningBatch,
                 mask_id: Optional[int]) -> None:
    """The self-loop CTMC of prop:self-loop-jumps simulated exactly, by thinning.

    Its total rate alpha_dot/(1 - alpha) * sum_d p_t(z^d = N | x) changes with t even
    while x stays put, so a holding time drawn from Exp(rate at the current t) is
    wrong. In the clock s = -log(1 - alpha_t) the rate is sum_d p_t(z^d = N | x) <= D,
    so candidate events at constant rate D in s, each accepted with probability
    sum_d p / D, are the exact jump times (Lewis-Shedler thinning); a rejected
    candidate leaves x unchanged. The run ends at t_end (s_end = -log(1 - alpha(t_end))),
    as s runs to infinity at t = 1, or when the step budget (candidates) is spent.
    An accepted event denoises one position: only the accepted rows run the denoiser
    (the reference run; the fused run denoises every row and keeps the accepted draws).
    """
    length = run.length
    s_end = -math.log1p(-float(run.schedule.alpha(torch.tensor(opts.t_end, dtype=torch.float64))))
    batch.state["s"] = torch.zeros(len(batch), dtype=torch.float64, device=batch.x.device)

    def one_step(step, temperature: float, last: bool, check: bool, k: int, plan_now: bool) -> None:
        clock = exponential(run.noise.uniform(step, CLOCK, batch.rows, 1)[:, 0]).double() / length
        batch.state["s"].add_(clock)
        batch.finish(batch.state["s"] >= s_end, step, check=check)
        if batch.finished:
            return
        t = run.schedule.inverse(-torch.expm1(-batch.state["s"])).float()
        logits = _plan(networks, batch, t)
        plan = draws.plan(step, logits, batch.rows, 1, opts.selection, opts.eps, batch.x, mask_id)
        accept = run.noise.uniform(step, ACCEPT, batch.rows, 1)[:, 0].clamp(max=BELOW_ONE) * length < plan.sum_p
        index = draws.rows_with(accept)
        if index is not None and index.numel() == 0:
            return
        x_in, t_in = (plan.masked, mask_time(plan.count, run)) if mask_id is not None else (batch.x, t)
        x_in, t_in, t, positions, rows = subset(index, x_in, t_in, t, plan.positions, batch.rows)
        temperature = _over_time(run, t, opts.t_end, 1)  # the run ends at t_end, not at the budget's last step
        # the reference run passes the accepted rows only; the fused run passes all and keeps theirs
        used = accept if index is None else None
        tokens = networks.tokens(draws, batch, step, x_in, t_in, positions, rows, temperature, index, used)
        tokens = expand(index, tokens, batch.x.gather(1, plan.positions))
        change = _changes(batch, logits, plan.positions) & accept[:, None]
        batch.x.copy_(write(batch.x, plan.positions, tokens, change))
        batch.count_commits(change.sum(1))

    run_steps(run, draws, batch, one_step, stops=True, kind=_step_kind(run, opts))


def _step_kind(run: Run, opts: DDPDOptions) -> Callable:
    """What tells DDPD's steps apart (common.run_steps' kind, the key of a step's graph): step i
    -> (k, positions it denoises, and whether it runs the planner: ErrorBudget.plan_every)."""
    every = 1 if opts.policy is None else opts.policy.plan_every
    unread = _first_plan_unread(run, opts)
    return lambda i: (opts.positions_at(i), i % every == 0 and not (i == 0 and unread))


def _first_plan_unread(run: Run, opts: DDPDOptions) -> bool:
    """Whether the first step's planner pass can be skipped: under known_noise without a prompt
    every position starts unwritten, noise for certain, so nothing of that plan would be read."""
    return opts.policy is not None and opts.policy.skips_first_plan(prompted=run.x_init is not None)


def _over_time(run: Run, t: Tensor, t_final: float, k: int) -> Union[float, Tensor]:
    """The temperature of each draw (Float[B * k], a row's k draws consecutive) at the rows' times
    t (Float[B]) of a run that ends at t_final; the number itself when it is fixed."""
    temperature = run.temperature.over(t / t_final)
    return temperature if isinstance(temperature, float) else temperature.repeat_interleave(k)


def _eps_stop_temperature(run: Run, opts: DDPDOptions, temperature: float, sum_p: Tensor, batch: RunningBatch,
                          k: int) -> Union[float, Tensor]:
    """Under the eps stop a row ends when the planner says clean, mostly well before the budget's last
    step: the temperature follows the planner's time estimate, `end` from alpha^{-1}(1 - eps) on, an
    estimate every row has passed at the plan where it stops (p < eps everywhere puts it there)."""
    if run.temperature.start == run.temperature.end:
        return temperature
    t_stop = float(run.schedule.inverse(torch.tensor(1.0 - opts.eps, dtype=torch.float64)))
    return _over_time(run, planner_time(sum_p, run, _noisy_positions(batch, run)), t_stop, k)


def _choice_noise(run: Run, policy, step, rows: Tensor, k: int) -> Optional[Tensor]:
    """tau_i g, Float[B, k]: the annealed Gumbel noise of ErrorBudget's ranking (CONFIDENCE stream), or None."""
    if policy.choice_temperature == 0.0:
        return None
    return annealed(policy.choice_temperature, step, run.steps) * gumbel(run.noise.uniform(step, CONFIDENCE, rows, k))


def _policy_plan(networks, batch: RunningBatch, plan_now: bool, revise_above: Optional[float]) -> Tensor:
    """The step's planner logits under a commit policy: the planner's (or, on a step without a
    planner pass, the last plan with the positions committed since read as clean), +inf where
    no draw has written yet (known_noise: noise for certain); with revise_above, +inf or -inf
    where one has."""
    if plan_now:
        logits = _plan(networks, batch, batch.state.get("t_prev"))
        if "plan" in batch.state:
            batch.state["plan"].copy_(logits)
    elif "plan" in batch.state:
        logits = batch.state["plan"].clone()
    else:  # step 0 without its planner pass (skips_first_plan): every position is untouched, +inf below
        logits = torch.zeros(batch.x.shape, device=batch.x.device)
    touched = batch.state.get("touched")
    if touched is None:
        return logits
    if revise_above is not None:  # a written position is redrawn for certain, or kept in the context
        logits = torch.where(logits > math.log(revise_above / (1.0 - revise_above)), float("inf"), float("-inf"))
    return logits.masked_fill(~touched, float("inf"))


def _remember_commits(batch: RunningBatch, positions: Tensor, change: Tensor) -> None:
    """What the policy's state keeps of a step's commits: the positions written are touched, and
    clean in the plan that later steps without a planner pass read."""
    committed = torch.zeros_like(batch.x, dtype=torch.bool).scatter(1, positions, change)
    if "touched" in batch.state:
        batch.state["touched"] |= committed
    if "plan" in batch.state:
        batch.state["plan"].masked_fill_(committed, float("-inf"))


def _given(batch: RunningBatch) -> Tensor:
    """Bool[B, D]: the positions a run starts from data, not noise (a prompt's, frozen or not)."""
    given = batch.state.get("given")
    if given is None:
        return torch.zeros_like(batch.x, dtype=torch.bool)
    frozen = batch.state.get("frozen")
    return given if frozen is None else given | frozen


def _unwritten_first(positions: Tensor, unwritten: Tensor) -> tuple[Tensor, Tensor]:
    """The candidates of the budget's last step (known_noise with a spread): an unwritten position
    the planner did not pick takes the place of the written pick it ranks last (the missing ones in
    position order, while written picks last), so that none is left when at most max_k remain.

    Args:
        positions: Long[B, K] the planner's picks, in its order.
        unwritten: Bool[B, D] the positions no draw has written.

    Returns:
        (Long[B, K] the candidates, Bool[B, K] which of them are unwritten).
    """
    k = positions.shape[1]
    missing = unwritten & ~torch.zeros_like(unwritten).scatter(1, positions, True)
    first_missing = (~missing).to(torch.uint8).argsort(dim=1, stable=True)[:, :k]  # missing ones first
    written = ~unwritten.gather(1, positions)
    from_last = written.flip(1).cumsum(1).flip(1) - 1  # a written pick's place counted from the last one
    take = written & (from_last < missing.sum(1, keepdim=True))
    positions = torch.where(take, first_missing.gather(1, from_last.clamp(min=0)), positions)
    return positions, unwritten.gather(1, positions)


def _candidates(positions: Tensor, masked: Optional[Tensor], mask_id: Optional[int]) -> Tensor:
    """Bool[B, K]: the planner's picks a commit policy may commit: every pick, or with a mask
    denoiser those the denoiser saw masked (the first always is), whose tokens it predicted."""
    if mask_id is None:
        return torch.ones_like(positions, dtype=torch.bool)
    return masked.gather(1, positions) == mask_id


def _changes(batch: RunningBatch, logits: Tensor, positions: Tensor) -> Tensor:
    """Bool[B, k]: the chosen positions a draw may change. A position of zero weight (chosen only
    when fewer than k have weight; NaN logits count as -inf) and a row that stopped since the
    last stop check (fused run) change nothing."""
    change = logits.gather(1, positions) > float("-inf")
    running = batch.running()
    return change if running is None else change & running[:, None]


def planner_time(sum_p: Tensor, run: Run, noisy=None) -> Tensor:
    """t = alpha^{-1}(1 - sum_d p(z^d = N | x_t) / D): the planner's estimate of the time.

    Args:
        sum_p: Float[B] sum_d p(z^d = N | x_t).
        run: the run's checked settings (its schedule and length).
        noisy: with a prompt, the positions that can be noise, per row (Float[B]); None: D.

    Returns:
        Float[B] the times.
    """
    noisy = run.length if noisy is None else noisy
    return run.schedule.inverse((1.0 - sum_p / noisy).clamp(0.0, 1.0))


def _noisy_positions(batch: RunningBatch, run: Run):
    """Per row, the positions the forward process corrupts: D, less the frozen ones (at least 1)."""
    frozen = batch.state.get("frozen")
    return None if frozen is None else (run.length - frozen.sum(-1)).clamp(min=1).float()


def mask_time(count: Tensor, run: Run) -> Tensor:
    """t = alpha^{-1}(1 - #masked / D): the time of a masked sequence with `count` masks.

    Args:
        count: Long[B] masked positions per row.
        run: the run's checked settings (its schedule and length).

    Returns:
        Float[B] the times.
    """
    return run.schedule.inverse(1.0 - count.float() / run.length)
