"""The mask loop: from the all-mask sequence, each step one denoiser pass draws a token at every
masked position and a policy (ddpd.sampling.policies) says which of them to keep, and for
ReMDM which committed tokens to mask again.

`maskgit_sample` is this loop with MaskGIT's policy (Chang et al. 2022): confidence-based
parallel unmasking on the cosine schedule; `mask_sample` takes any of the field's policies
(MaskGIT, Fast-dLLM's threshold and factor rules, EB-sampler's entropy bound, ReMDM). The
confidence a policy reads is the untempered model log-probability of the drawn token (as
MaskGIT, Fast-dLLM and LLaDA's low-confidence remasking define it) and the entropy of the
model's law, computed by the same torch code on both paths from the logits.

fused=True hands the loop the fused Draws strategy (ddpd.sampling.draws): the tokens are
drawn with ddpd.ops.sample_categorical (same tokens from the same noise). A row with no mask
left stops (its stop_step is the passes it took) and leaves the batch at the next stop check.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.sampling.batch import SampleResult
from ddpd.sampling.common import Run, setup, start
from ddpd.sampling.gillespie import mask_time
from ddpd.sampling.noise import CONFIDENCE, EVENT, NoiseSource, gumbel
from ddpd.sampling.options import Temperature
from ddpd.sampling.policies import MaskGIT, MaskPolicy, ReMDM, Step
from ddpd.validation import check_callable

MASK_POLICIES = ("MaskGIT", "ConfidenceThreshold", "ConfidenceFactor", "EntropyBound", "ReMDM")


def maskgit_sample(
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    temperature: Union[float, Temperature] = 1.0,
    choice_temperature: float = 4.5,
    seed: Optional[int] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    **options,
) -> SampleResult:
    """MaskGIT sampling with a mask denoiser(x, t) -> Float[B, D, V] logits: `mask_sample`
    with policy=MaskGIT(choice_temperature).

    The denoiser sees mask_id (default vocab_size) at masked positions and
    t = alpha^{-1}(1 - #masked / D). temperature (annealed linearly to temperature_end
    when given) tempers the token draws; confidences use the untempered model
    probabilities. choice_temperature scales the Gumbel noise on the confidences
    (MaskGIT's default 4.5; 0 ranks by confidence alone, ties broken by position).
    options: as mask_sample's.
    """
    return _mask_loop("maskgit_sample", denoiser, batch_size, length, vocab_size, steps, MaskGIT(choice_temperature),
                      temperature, seed, noise, device, options)


def mask_sample(
    denoiser: Callable,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    steps: int,
    policy: MaskPolicy = MaskGIT(),
    temperature: Union[float, Temperature] = 1.0,
    seed: Optional[int] = None,
    noise: Optional[NoiseSource] = None,
    device: Union[str, torch.device, None] = None,
    **options,
) -> SampleResult:
    """Parallel decoding with a mask denoiser(x, t) -> Float[B, D, V] logits, `policy` choosing
    what each pass commits (ddpd.sampling.policies: MaskGIT, ConfidenceThreshold,
    ConfidenceFactor, EntropyBound, ReMDM).

    steps: the pass budget; the last step fills every mask left. A row stops once it has no
    mask (ReMDM: at the budget), so adaptive policies use fewer passes: SampleResult's
    denoiser_passes per row. options: temperature_end, schedule, mask_id, generator, labels,
    guidance_scale (class conditioning, ddpd.sampling.common), x_init and frozen (a prompt:
    its positions start unmasked, are never masked again, and MaskGIT's cosine schedule counts
    the m0 masks a row starts with instead of D), top_k, top_p, min_p (cuts of the token draws;
    the confidence stays the model's), fused, sync_every, compaction, dtype
    (ddpd.sampling.options).
    """
    if type(policy).__name__ not in MASK_POLICIES:
        raise TypeError(f"policy must be one of {', '.join(MASK_POLICIES)} (ddpd.sampling.policies), "
                        f"got {type(policy).__name__}")
    return _mask_loop("mask_sample", denoiser, batch_size, length, vocab_size, steps, policy, temperature, seed,
                      noise, device, options)


def _mask_loop(sampler: str, denoiser: Callable, batch_size, length, vocab_size, steps, policy, temperature, seed,
               noise, device, options: dict) -> SampleResult:
    """The loop of mask_sample, checked and named as `sampler`."""
    check_callable("denoiser", denoiser)
    run, draws, _ = setup(sampler, batch_size, length, vocab_size, steps, temperature, seed, noise, device, options,
                          masks=True)
    batch = start(run, draws, masks=True)
    batch.state["m0"] = (batch.x == run.mask_id).sum(-1)  # the masks to fill: D less a prompt's positions
    needs = getattr(policy, "needs", ())
    with torch.no_grad():
        for i in range(steps):
            masked = batch.x == run.mask_id
            logits = batch.denoiser(denoiser, batch.x, mask_time(masked.sum(-1), run), vocab_size)
            tokens = draws.tokens_everywhere(i, batch.rows, logits, run.temperature_at(i))
            step = _step(run, batch, policy, needs, i, masked, logits, tokens)
            unmask, remask = policy.moves(step)
            if remask is not None and "frozen" in batch.state:
                remask = remask & ~batch.state["frozen"]
            x = torch.where(unmask, tokens, batch.x)
            batch.x = x if remask is None else x.masked_fill(remask, run.mask_id)
            batch.count_commits(unmask.sum(-1))
            if i < steps - 1:
                batch.finish(~(batch.x == run.mask_id).any(-1), i + 1, check=batch.check_due(i))
                if batch.finished:
                    break
    return batch.result(steps)


def _step(run: Run, batch, policy, needs, i: int, masked: Tensor, logits: Tensor, tokens: Tensor) -> Step:
    """The policy's view of step i (see ddpd.sampling.policies.Step)."""
    log_p = logits.log_softmax(-1)
    # NaN reads as -inf, as in every draw: a position of a NaN output is the least confident
    logprob = log_p.gather(-1, tokens[..., None]).squeeze(-1).nan_to_num(nan=float("-inf"))
    extra = {}
    if "entropy" in needs:
        extra["entropy"] = -(log_p.exp() * log_p.masked_fill(log_p == float("-inf"), 0.0)).sum(-1)
    if "gumbel" in needs:
        extra["gumbel"] = gumbel(run.noise.uniform(i, CONFIDENCE, batch.rows, run.length))
    if "uniforms" in needs:
        extra["uniforms"] = run.noise.uniform(i, EVENT, batch.rows, run.length)
    if isinstance(policy, ReMDM):
        extra["alpha_t"], extra["alpha_s"], extra["looping"] = policy.alphas(i, run.steps, lambda u: _alpha(run, u))
    return Step(i, run.steps, masked, logprob, batch.state["m0"], **extra)


def _alpha(run: Run, t: float) -> float:
    return float(run.schedule.alpha(torch.tensor(t, dtype=torch.float64)))
