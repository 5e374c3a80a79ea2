"""MaskGIT (Chang et al. 2022): confidence-based parallel unmasking, a baseline of DDPD.

From the all-mask sequence, step i (of T) draws a token at every masked position
from the mask denoiser, scores each draw by its confidence log p(token) plus
annealed Gumbel noise tau_i g with tau_i = choice_temperature (1 - (i + 1) / T),
and keeps the n_i least confident positions masked, where the cosine schedule
n_i = floor(m0 cos(pi/2 (i + 1) / T)) (m0 = D, the masks a row starts with) is clamped to [1, m - 1] for m masked
positions (at least one unmasked per step, one left for later), and n = 0 at the
last step, which fills every remaining mask.

The Gumbel-perturbed ranking is a Plackett-Luce draw: the unmasked set is the first
m - n_i picks, without replacement, with weights p(token)^(1 / tau_i). The confidence is
the untempered model probability of the drawn token (as MaskGIT and LLaDA's low-confidence
remasking define it), a log-softmax of the logits on both paths.

fused=True hands the loop the fused Draws strategy (ddpd.sampling.draws): the tokens
are drawn with ddpd.ops.sample_categorical (same tokens from the same noise); every row
runs every step, so nothing else changes.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.sampling.batch import SampleResult
from ddpd.sampling.common import setup, start
from ddpd.sampling.gillespie import mask_time
from ddpd.sampling.noise import CONFIDENCE, NoiseSource, gumbel
from ddpd.sampling.options import Temperature
from ddpd.validation import check_callable, check_float


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
    """MaskGIT sampling with a mask denoiser(x, t) -> Float[B, D, V] logits.

    The denoiser sees mask_id (default vocab_size) at masked positions and
    t = alpha^{-1}(1 - #masked / D). temperature (annealed linearly to temperature_end
    when given) tempers the token draws; confidences use the untempered model
    probabilities. choice_temperature scales the Gumbel noise on the confidences
    (MaskGIT's default 4.5; 0 ranks by confidence alone, ties broken by position).
    options: temperature_end, schedule, mask_id, generator, labels, guidance_scale (class
    conditioning, ddpd.sampling.common), x_init and frozen (a prompt:
    its positions start unmasked; the cosine schedule counts the m0 masks a row starts
    with instead of D), top_k, top_p, min_p (cuts of the token draws; the confidence stays the
    model's log-probability of the drawn token), fused (draw the tokens with
    ddpd.ops.sample_categorical), dtype (the networks' precision; ddpd.sampling.options).
    """
    check_callable("denoiser", denoiser)
    choice_temperature = check_float("choice_temperature", choice_temperature, 0.0, float("inf"), open_max=True)
    run, draws, _ = setup("maskgit_sample", batch_size, length, vocab_size, steps, temperature, seed, noise, device,
                          options, masks=True)
    batch = start(run, draws, masks=True)
    batch.state["m0"] = (batch.x == run.mask_id).sum(-1)  # the masks to fill: D less a prompt's positions
    with torch.no_grad():
        for i in range(steps):
            masked = batch.x == run.mask_id
            logits = batch.denoiser(denoiser, batch.x, mask_time(masked.sum(-1), run), vocab_size)
            tokens = draws.tokens_everywhere(i, batch.rows, logits, run.temperature_at(i))
            # The confidence is the model's log-probability of the drawn token, by the same torch code on
            # both paths. (The draw's own log-probability at temperature 1 would save this pass, but the
            # kernels' float32 tile sums and the reference's float64 differ in the last bits: a confident
            # draw gets 0 from one and -5e-14 from the other, and ranked by confidence alone
            # (choice_temperature 0) the fused run then unmasked other positions.)
            confidence = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
            tau = choice_temperature * (1.0 - (i + 1) / steps)
            confidence = confidence + tau * gumbel(run.noise.uniform(i, CONFIDENCE, batch.rows, length))
            n_masked = _masks_left(masked.sum(-1), i, steps, batch.state["m0"])
            unmask = masked & ~least_confident(confidence, masked, n_masked)
            batch.x = torch.where(unmask, tokens, batch.x)
    return batch.result(steps)


def _masks_left(m: Tensor, step: int, steps: int, m0: Tensor) -> Tensor:
    """n_i: masks left after the step, floor(m0 cos(pi/2 (i + 1) / T)) of the m0 masks a row
    started with (D without a prompt), clamped to [1, m - 1]."""
    if step == steps - 1:
        return torch.zeros_like(m)
    n = torch.floor(m0.double() * math.cos(0.5 * math.pi * (step + 1) / steps)).long()
    return torch.clamp(torch.minimum(m - 1, n), min=1)


def least_confident(confidence: Tensor, masked: Tensor, n: Tensor) -> Tensor:
    """Bool[B, D]: the n (Long[B]) masked positions of lowest confidence in each row.

    Unmasked positions never count; ties go to the lower position (stable sort).
    """
    score = confidence.masked_fill(~masked, float("inf"))
    order = score.argsort(dim=-1, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(score.shape[-1], device=score.device)
                                             .expand_as(order))
    return rank < n[:, None]
