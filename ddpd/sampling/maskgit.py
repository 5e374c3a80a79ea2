"""The mask loop: from the all-mask sequence, each step's denoiser pass (two with guidance)
draws a token at every masked position and a policy (ddpd.sampling.policies) says which of
them to keep, and for ReMDM which committed tokens to mask again.

`maskgit_sample` is this loop with MaskGIT's policy (Chang et al. 2022); `mask_sample` takes
any of the field's policies. The confidence a policy reads is the untempered model
log-probability of the drawn token; docs/sampling.md#the-mask-loop has the details.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.process import Schedule
from ddpd.sampling.batch import SampleResult, extended_softmax
from ddpd.sampling.common import Run, on_device, row, run_steps, setup, start
from ddpd.sampling.draws import Draws
from ddpd.sampling.gillespie import mask_time
from ddpd.sampling.noise import CONFIDENCE, EVENT, NoiseSource, gumbel
from ddpd.sampling.options import Execution, Guidance, Prompt, Temperature, Truncation, explains_moved_keywords
from ddpd.sampling.policies import MaskGIT, MaskPolicy, Step
from ddpd.validation import check_callable

MASK_POLICIES = ("MaskGIT", "ConfidenceThreshold", "ConfidenceFactor", "EntropyBound", "ReMDM")


@explains_moved_keywords
def maskgit_sample(
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    choice_temperature: float = 4.5,
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
    """MaskGIT sampling with a mask denoiser: `mask_sample` with policy=MaskGIT(choice_temperature).

    Args:
        denoiser: denoiser(x Long[B, D] with mask_id at masked positions, t Float[B]) ->
            Float[B, D, vocab_size] logits, called at t = alpha^{-1}(1 - #masked / D).
        batch_size: B, the number of sequences.
        length: D, the sequence length.
        vocab_size: V, the number of clean token values.
        steps: The step budget, a denoiser pass a step (two with guidance); the last step fills
            every mask left.
        choice_temperature: The scale of the Gumbel noise on the confidences (MaskGIT's default
            4.5; 0 ranks by confidence alone, ties broken by position).
        temperature: The denoiser's logit temperature (0 = argmax), or a Temperature with fields
            start and end, annealed linearly over the steps; the confidences use the untempered
            model probabilities.
        truncation: Cuts of every token draw's law (Truncation), the confidence staying the model's:
            top_k (the most probable tokens), top_p (nucleus), min_p (a fraction of the top
            probability); default: none.
        execution: How the run is carried out (Execution): fused (the ddpd.ops kernels, no host
            synchronisation inside a step, same draws from the same noise), sync_every (steps
            between stop checks), compaction (finished rows leave the batch there), dtype (the
            networks' precision, "auto" = bfloat16 on CUDA), graphs (CUDA-graph replay).
        prompt: Prompt(x_init, frozen) for prompts and infilling: x_init Long[B, D] (-1 where the
            run starts from the mask), frozen Bool[B, D] the positions that keep their value
            throughout, start unmasked and are never masked again;
            MaskGIT's cosine schedule counts the masks a row starts with instead of D; None: no prompt.
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
    return _checked_loop("maskgit_sample", denoiser, batch_size, length, vocab_size, MaskGIT(choice_temperature),
                         dict(steps=steps, temperature=temperature, truncation=truncation, execution=execution,
                              prompt=prompt, guidance=guidance, schedule=schedule, mask_id=mask_id, seed=seed,
                              generator=generator, noise=noise, device=device))


@explains_moved_keywords
def mask_sample(
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    policy: MaskPolicy = MaskGIT(),
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
    """Parallel decoding with a mask denoiser, `policy` choosing what each step commits.

    A row stops once it has no mask (ReMDM with eta > 0: at the budget), so adaptive
    policies use fewer steps: SampleResult's stop_step per row, and its denoiser_passes (a
    pass a step, two with guidance).

    Args:
        denoiser: denoiser(x Long[B, D] with mask_id at masked positions, t Float[B]) ->
            Float[B, D, vocab_size] logits, called at t = alpha^{-1}(1 - #masked / D).
        batch_size: B, the number of sequences.
        length: D, the sequence length.
        vocab_size: V, the number of clean token values.
        steps: The step budget, a denoiser pass a step (two with guidance); the last step fills
            every mask left.
        policy: One of MaskGIT, ConfidenceThreshold, ConfidenceFactor, EntropyBound, ReMDM
            (ddpd.sampling.policies, docs/parallel.md).
        temperature: The denoiser's logit temperature (0 = argmax), or a Temperature with fields
            start and end, annealed linearly over the steps; the confidences use the untempered
            model probabilities.
        truncation: Cuts of every token draw's law (Truncation), the confidence staying the model's:
            top_k (the most probable tokens), top_p (nucleus), min_p (a fraction of the top
            probability); default: none.
        execution: How the run is carried out (Execution): fused (the ddpd.ops kernels, no host
            synchronisation inside a step, same draws from the same noise), sync_every (steps
            between stop checks), compaction (finished rows leave the batch there), dtype (the
            networks' precision, "auto" = bfloat16 on CUDA), graphs (CUDA-graph replay).
        prompt: Prompt(x_init, frozen) for prompts and infilling: x_init Long[B, D] (-1 where the
            run starts from the mask), frozen Bool[B, D] the positions that keep their value
            throughout, start unmasked and are never masked again;
            MaskGIT's cosine schedule counts the masks a row starts with instead of D; None: no prompt.
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
    if type(policy).__name__ not in MASK_POLICIES:
        raise TypeError(f"policy must be one of {', '.join(MASK_POLICIES)} (ddpd.sampling.policies), "
                        f"got {type(policy).__name__}")
    return _checked_loop("mask_sample", denoiser, batch_size, length, vocab_size, policy,
                         dict(steps=steps, temperature=temperature, truncation=truncation, execution=execution,
                              prompt=prompt, guidance=guidance, schedule=schedule, mask_id=mask_id, seed=seed,
                              generator=generator, noise=noise, device=device))


def _checked_loop(sampler: str, denoiser: Callable, batch_size, length, vocab_size, policy,
                  keywords: dict) -> SampleResult:
    """The mask loop of a sampler call, checked and named as `sampler`."""
    check_callable("denoiser", denoiser)
    run, draws = setup(sampler, batch_size, length, vocab_size, masks=True, **keywords)
    return _mask_loop(run, draws, denoiser, policy)


def _mask_loop(run: Run, draws: Draws, denoiser: Callable, policy) -> SampleResult:
    """The loop of mask_sample on a checked run. The fused run replays the steps between stop
    checks from CUDA graphs (ddpd.sampling.graphs); the stop checks and the last step, which
    fills every mask, run eagerly."""
    steps = run.steps
    batch = start(run, draws, masks=True)
    batch.state["m0"] = (batch.x == run.mask_id).sum(-1)  # the masks to fill: D less a prompt's positions
    stops = not getattr(policy, "remasks", False)  # a filled row that may be masked again runs to the budget
    if stops:  # a row the prompt fills whole costs no pass (one it freezes whole stopped at the start)
        batch.finish(batch.state["m0"] == 0, 0)
    table = policy.step_table(steps, lambda u: _alpha(run, u))
    table = None if table is None else on_device(table, batch.x.device)

    def one_step(i, temperature, last: bool, check: bool) -> None:
        """Step i (an int, or a CUDA graph's step tensor), written in place."""
        masked = batch.x == run.mask_id
        # a row with no mask left (under remasking) uses no logits this step: no pass
        logits = batch.denoiser(denoiser, batch.x, mask_time(masked.sum(-1), run), run.vocab_size,
                                used=masked.any(-1))
        tokens = draws.tokens_everywhere(i, batch.rows, logits, temperature)
        step = _step(run, batch, policy, i, last, masked, logits, tokens, None if table is None else row(table, i))
        unmask, remask = policy.moves(step)
        if remask is not None and "frozen" in batch.state:
            remask = remask & ~batch.state["frozen"]
        x = torch.where(unmask, tokens, batch.x)
        batch.x.copy_(x if remask is None else x.masked_fill(remask, run.mask_id))
        batch.count_commits(unmask.sum(-1))
        if stops and not last:
            batch.finish(~(batch.x == run.mask_id).any(-1), i + 1, check=check)

    with torch.no_grad():
        run_steps(run, draws, batch, one_step, stops)
    return batch.result(steps)


def _step(run: Run, batch, policy, i, last: bool, masked: Tensor, logits: Tensor, tokens: Tensor,
          table_row: Optional[Tensor]) -> Step:
    """The policy's view of step i (see ddpd.sampling.policies.Step) with its step_table row."""
    needs = getattr(policy, "needs", ())
    logprob, entropy = _model_law(logits, tokens, "entropy" in needs)
    extra = {} if entropy is None else {"entropy": entropy}
    if "gumbel" in needs:
        extra["gumbel"] = gumbel(run.noise.uniform(i, CONFIDENCE, batch.rows, run.length))
    if "uniforms" in needs:
        extra["uniforms"] = run.noise.uniform(i, EVENT, batch.rows, run.length)
    return Step(i, run.steps, masked, logprob, batch.state["m0"], last, table=table_row, **extra)


def _model_law(logits: Tensor, tokens: Tensor, entropy: bool) -> tuple:
    """(logprob, entropy): the untempered model log-probability of each drawn token, Float[B, D],
    and with `entropy` that of each position's law (else None)."""
    log_p = extended_softmax(logits, log=True)
    # NaN reads as -inf, as in every draw: a position of a NaN output is the least confident
    logprob = log_p.gather(-1, tokens[..., None]).squeeze(-1).nan_to_num(nan=float("-inf"))
    if not entropy:
        return logprob, None
    return logprob, -(log_p.exp() * log_p.masked_fill(log_p == float("-inf"), 0.0)).sum(-1)


def _alpha(run: Run, t: float) -> float:
    return float(run.schedule.alpha(torch.tensor(t, dtype=torch.float64, device="cpu")))
