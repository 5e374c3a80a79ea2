"""Tau-leaping baselines: the reverse CTMC on a uniform time grid t_i = i / T.

Every position jumps independently within a step with probability rate * dt
(eq. reverse_transition_prob), all jumps applied at the end of the step:
`tau_leaping_mask` (DFM, mask diffusion with remasking stochasticity eta, eq.
trans_prob_decomp_mask), `tau_leaping_uniform` (DFM-Uni, eq. rate_decomposition_uniform_D)
and `tau_leaping_planned` (P x UniD, P x MaskD, eq. jump_rate_parameterization). The last
step removes whatever noise is left. Each chain is written once; Execution(fused=True)
hands it the fused Draws strategy (ddpd.sampling.draws). The rates, the last step and what
the fused run does differently are in docs/sampling.md#tau-leaping.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.process import Schedule
from ddpd.sampling.batch import RunningBatch, SampleResult, extended_softmax
from ddpd.sampling.common import Run, expand, on_device, row, run_steps, setup, start, subset
from ddpd.sampling.draws import Draws
from ddpd.sampling.gillespie import DENOISER_TYPES, mask_time
from ddpd.sampling.noise import EVENT, MASK, NoiseSource, happens
from ddpd.sampling.options import Execution, Guidance, Prompt, Temperature, Truncation, explains_moved_keywords
from ddpd.validation import check_bool, check_callable, check_choice, check_float


@explains_moved_keywords
def tau_leaping_mask(
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    eta: float = 0.0,
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
    """Mask-diffusion tau-leaping (DFM) from the all-mask sequence, with remasking stochasticity eta.

    Per step and position a mask unmasks with probability dt (alpha_dot + eta alpha) / (1 - alpha)
    (clamped to 1) to a draw of the denoiser, and a token is remasked with probability eta dt.
    With eta = 0 a row stops once it has no mask left.

    Args:
        denoiser: denoiser(x Long[B, D] with mask_id at masked positions, t Float[B]) ->
            Float[B, D, vocab_size] logits of p(x_1^d | x_t), called at the grid time (the
            reference run: only for rows with an unmasking in the step).
        batch_size: B, the number of sequences.
        length: D, the sequence length.
        vocab_size: V, the number of clean token values.
        steps: The number of grid steps T.
        eta: The remasking stochasticity, >= 0.
        temperature: The denoiser's logit temperature (0 = argmax), or a Temperature with fields
            start and end, annealed linearly over the steps.
        truncation: Cuts of every token draw's law (Truncation): top_k (the most probable
            tokens), top_p (nucleus), min_p (a fraction of the top probability); default: none.
        execution: How the run is carried out (Execution): fused (the ddpd.ops kernels, no host
            synchronisation inside a step, same draws from the same noise), sync_every (steps
            between stop checks), compaction (finished rows leave the batch there), dtype (the
            networks' precision, "auto" = bfloat16 on CUDA), graphs (CUDA-graph replay).
        prompt: Prompt(x_init, frozen) for prompts and infilling: x_init Long[B, D] (-1 where the
            run starts from the mask), frozen Bool[B, D] the positions that keep their value
            throughout, start unmasked and are never remasked; None: no prompt.
        guidance: Guidance(labels, scale, conditional_planner): class labels Long[B] for the
            denoiser, the classifier-free guidance scale, and conditional_planner
            (not accepted here: this sampler runs no planner network); None: unconditional.
        schedule: The noise schedule alpha_t: "linear", "cosine" or a ddpd.process.Schedule.
        mask_id: The mask token id (>= vocab_size; default vocab_size).
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
    check_callable("denoiser", denoiser)
    eta = check_float("eta", eta, 0.0, float("inf"), open_max=True)
    run, draws = setup("tau_leaping_mask", batch_size, length, vocab_size, mask_id=mask_id, masks=True,
                       steps=steps, temperature=temperature, schedule=schedule, seed=seed,
                       generator=generator, noise=noise, device=device, prompt=prompt, guidance=guidance,
                       truncation=truncation, execution=execution)
    batch = start(run, draws, masks=True)
    grid = _Grid(run, batch.x.device, eta)
    if eta == 0.0:  # a row the prompt fills whole costs no pass
        batch.finish(~(batch.x == run.mask_id).any(-1), 0)

    def one_step(i, temperature, last: bool, check: bool) -> None:
        remask_p = 0.0 if last else min(1.0, eta * grid.dt)
        masked = batch.x == run.mask_id  # never a frozen position: those hold their given values
        u = run.noise.uniform(i, EVENT, batch.rows, run.length)
        unmask = masked & happens(u, row(grid.jumps, i))
        remask = _free(batch, ~masked & happens(u, remask_p))
        x = torch.where(remask, torch.full_like(batch.x, run.mask_id), batch.x)
        batch.x.copy_(_draw_where(run, draws, batch, denoiser, i, x, batch.x, unmask, grid.t(i, len(batch)),
                                  temperature))
        if eta == 0.0 and not last:
            batch.finish(~(batch.x == run.mask_id).any(-1), i + 1, check=check)

    with torch.no_grad():
        run_steps(run, draws, batch, one_step, stops=eta == 0.0)
    return batch.result(run.steps)


@explains_moved_keywords
def tau_leaping_uniform(
    model: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
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
    """Uniform-diffusion tau-leaping (DFM-Uni) from uniform noise with one model.

    Per step and position: a jump with probability dt alpha_dot / (1 - alpha) times
    (1 - p(x_1^d = x_t^d | x_t)) (clamped to 1) to j != x_t^d drawn from p(x_1^d = j | x_t) at
    the logit temperature. Calls are counted in denoiser_calls.

    Args:
        model: model(x Long[B, D], t Float[B]) -> Float[B, D, vocab_size] logits of p(x_1^d | x_t).
        batch_size: B, the number of sequences.
        length: D, the sequence length.
        vocab_size: V, the number of clean token values.
        steps: The number of grid steps T.
        temperature: The denoiser's logit temperature (0 = argmax), or a Temperature with fields
            start and end, annealed linearly over the steps.
        truncation: Cuts of every token draw's law (Truncation), of the jump's draw after the
            current token is excluded: top_k (the most probable tokens), top_p (nucleus), min_p (a
            fraction of the top probability); default: none.
        execution: How the run is carried out (Execution): fused (the ddpd.ops kernels, no host
            synchronisation inside a step, same draws from the same noise), sync_every (steps
            between stop checks), compaction (finished rows leave the batch there), dtype (the
            networks' precision, "auto" = bfloat16 on CUDA), graphs (CUDA-graph replay).
        prompt: Prompt(x_init, frozen) for prompts and infilling: x_init Long[B, D] (-1 where the
            run starts from noise), frozen Bool[B, D] the positions that keep their value
            throughout and never jump; None: no prompt.
        guidance: Guidance(labels, scale, conditional_planner): class labels Long[B] for the
            denoiser, the classifier-free guidance scale, and conditional_planner
            (not accepted here: this sampler runs no planner network); None: unconditional.
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
    run, draws = setup("tau_leaping_uniform", batch_size, length, vocab_size,
                       steps=steps, temperature=temperature, schedule=schedule, seed=seed,
                       generator=generator, noise=noise, device=device, prompt=prompt, guidance=guidance,
                       truncation=truncation, execution=execution)
    batch = start(run, draws)
    grid = _Grid(run, batch.x.device)

    def one_step(i, temperature, last: bool, check: bool) -> None:
        logits = batch.denoiser(model, batch.x, grid.t(i, len(batch)), run.vocab_size, "model")
        p_stay = extended_softmax(logits, log=True).gather(-1, batch.x[..., None]).squeeze(-1).exp()
        jump = happens(run.noise.uniform(i, EVENT, batch.rows, run.length), row(grid.jumps, i) * (1.0 - p_stay))
        jump = _free(batch, jump)
        # New values exclude the current one: the rate is defined for j != x_t^d only.
        tokens = draws.tokens_everywhere(i, batch.rows, logits, temperature, exclude=batch.x)
        batch.x.copy_(torch.where(jump, tokens, batch.x))
        batch.count_commits(jump.sum(-1))

    with torch.no_grad():
        run_steps(run, draws, batch, one_step, stops=False)
    return batch.result(run.steps)


@explains_moved_keywords
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
    """Planner x denoiser tau-leaping (P x UniD, P x MaskD) from uniform noise.

    Per step a position jumps with probability dt alpha_dot / (1 - alpha) p(z^d = N | x_t) to a
    draw of the denoiser (which may return the current value).

    Args:
        planner: planner(x Long[B, D]) -> Float[B, D] logits of "position is noise"
            (planner(x, t) when time_conditioned_planner).
        denoiser: denoiser(x Long[B, D], t Float[B]) -> Float[B, D, vocab_size] logits: of
            p(x_1^d | x_t, z^d = N) at the grid time for denoiser_type="uniform", of a mask
            denoiser on the masked sequence at t = alpha^{-1}(1 - #masked / D) for "mask".
        batch_size: B, the number of sequences.
        length: D, the sequence length.
        vocab_size: V, the number of clean token values.
        steps: The number of grid steps T.
        denoiser_type: "uniform" or "mask" (the jumping positions denoised through
            prop:draw_with_maskD: all of them masked, the others with the planner's probability).
        time_conditioned_planner: Whether the planner takes the grid time, planner(x, t).
        temperature: The denoiser's logit temperature (0 = argmax), or a Temperature with fields
            start and end, annealed linearly over the steps.
        truncation: Cuts of every token draw's law (Truncation): top_k (the most probable
            tokens), top_p (nucleus), min_p (a fraction of the top probability); default: none.
        execution: How the run is carried out (Execution): fused (the ddpd.ops kernels, no host
            synchronisation inside a step, same draws from the same noise), sync_every (steps
            between stop checks), compaction (finished rows leave the batch there), dtype (the
            networks' precision, "auto" = bfloat16 on CUDA), graphs (CUDA-graph replay).
        prompt: Prompt(x_init, frozen) for prompts and infilling: x_init Long[B, D] (-1 where the
            run starts from noise), frozen Bool[B, D] the positions that keep their value
            throughout (p(z = N) = 0 there: they never jump and are never masked); None: no prompt.
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
    time_conditioned = check_bool("time_conditioned_planner", time_conditioned_planner)
    run, draws = setup("tau_leaping_planned", batch_size, length, vocab_size, mask_id=mask_id,
                       masks=denoiser_type == "mask",
                       planner=True, steps=steps, temperature=temperature, schedule=schedule,
                       seed=seed, generator=generator, noise=noise, device=device, prompt=prompt, guidance=guidance,
                       truncation=truncation, execution=execution)
    batch = start(run, draws)
    grid = _Grid(run, batch.x.device)

    def one_step(i, temperature, last: bool, check: bool) -> None:
        t = grid.t(i, len(batch))
        logits = batch.planner(planner, batch.x, t) if time_conditioned else batch.planner(planner, batch.x)
        p = _free(batch, torch.sigmoid(logits))  # a frozen position is never noise
        jump = happens(run.noise.uniform(i, EVENT, batch.rows, run.length), row(grid.jumps, i) * p)
        x_in, t_in = batch.x, t
        if denoiser_type == "mask":
            z = happens(run.noise.uniform(i, MASK, batch.rows, run.length), p) | jump
            x_in = torch.where(z, torch.full_like(batch.x, run.mask_id), batch.x)
            t_in = mask_time(z.sum(-1), run)
        batch.x.copy_(_draw_where(run, draws, batch, denoiser, i, batch.x, x_in, jump, t_in, temperature))

    with torch.no_grad():
        run_steps(run, draws, batch, one_step, stops=False)
    return batch.result(run.steps)


class _Grid:
    """The uniform time grid t_i = i / T and the noise-removal rate on it, as tables on the
    run's device (times float32, jumps float64: jump_probability(i, eta)) that a step reads
    with its index, a CUDA graph's step tensor when replayed."""

    def __init__(self, run: Run, device: torch.device, eta: float = 0.0):
        self.run = run
        self.dt = 1.0 / run.steps
        steps = range(run.steps)
        self.times = on_device(torch.tensor([i * self.dt for i in steps], dtype=torch.float32, device="cpu"), device)
        self.jumps = on_device(torch.tensor([self.jump_probability(i, eta) for i in steps], dtype=torch.float64,
                                            device="cpu"), device)

    def t(self, step, n: int) -> Tensor:
        return row(self.times, step).repeat(n)

    def jump_probability(self, step: int, eta: float = 0.0) -> float:
        """dt (alpha_dot + eta alpha) / (1 - alpha) at the start of the step, clamped to 1.

        eta = 0 is the noise-removal rate; it is 1 at the last step, where the rate is
        infinite at t = 1 for the schedules of ddpd.process (and is taken so for any).
        """
        if step == self.run.steps - 1:
            return 1.0
        schedule = self.run.schedule
        t = torch.tensor(step * self.dt, dtype=torch.float64, device="cpu")
        a = schedule.alpha(t)
        return min(1.0, self.dt * float((schedule.alpha_dot(t) + eta * a) / (1.0 - a)))


def _free(batch: RunningBatch, values: Tensor) -> Tensor:
    """values (Bool or Float [B, D]) set to 0 at the positions a prompt froze."""
    frozen = batch.state.get("frozen")
    return values if frozen is None else values.masked_fill(frozen, 0)


def _draw_where(run: Run, draws: Draws, batch: RunningBatch, denoiser: Callable, step, x: Tensor,
                x_in: Tensor, where: Tensor, t: Tensor, temperature) -> Tensor:
    """x with the positions `where` (Bool[B, D]) drawn from denoiser(x_in, t) at `temperature`.

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
    tokens = draws.tokens_everywhere(step, rows, logits, temperature)
    return torch.where(where, expand(index, tokens, x), x)
