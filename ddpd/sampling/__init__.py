"""Samplers of DDPD and its baselines, each written once.

Models are callables (docs/api.md): planner(x) -> Float[B, D] logits of "position
is noise", denoiser(x, t) -> Float[B, D, V] logits. Every sampler takes one of
seed / generator / noise (a NoiseSource, ddpd.sampling.noise) and returns a
SampleResult (tokens, steps, per-row stop_step, forward-pass counts, the passes whose
output held a NaN: the run warns with a NaNOutputWarning).

- ddpd_sample: the DDPD Gillespie sampler (Algorithm 1) with a planner and a uniform or
  mask denoiser, on the planner clock or the exact clock.
- ddpd_sample_uniform: the same with a single uniform-diffusion model split by
  prop:generative_rate_decomposition.
- tau_leaping_mask (DFM), tau_leaping_uniform (DFM-Uni), tau_leaping_planned (P x D).
- maskgit_sample: MaskGIT confidence-based unmasking; mask_sample: the same loop with any
  of the field's parallel-decoding policies (ddpd.sampling.policies).

Parallel decoding: a commit policy (ddpd.sampling.policies) says how many drawn tokens a
step keeps, on the device: ErrorBudget for DDPD (DDPDOptions.policy), MaskGIT,
ConfidenceThreshold, ConfidenceFactor, EntropyBound and ReMDM for the mask loop. Every
SampleResult counts network passes per row and the tokens committed (tokens_per_pass).

Options are objects (ddpd.sampling.options: Temperature, DDPDOptions, Truncation,
Execution) or their fields as keywords. A run is reference (plain torch) or fused (the ddpd.ops kernels, no
host synchronisation inside a step, finished rows leaving the batch at a stop check every
sync_every steps) by the Draws strategy the loop is handed (ddpd.sampling.draws), chosen
with fused=True; from the same noise source both return the same samples (with float32
networks: below float32 a denoiser with an output head gives the fused run float32 logits at
the chosen positions where the reference rounds them to the dtype, and the two agree in law).
"""
from ddpd.sampling.batch import NaNOutputWarning, SampleResult
from ddpd.sampling.gillespie import ddpd_sample, ddpd_sample_uniform
from ddpd.sampling.maskgit import mask_sample, maskgit_sample
from ddpd.sampling.noise import NoiseSource, PhiloxNoise, TorchNoise
from ddpd.sampling.options import DDPDOptions, Execution, Temperature, Truncation
from ddpd.sampling.policies import (
                                    ConfidenceFactor,
                                    ConfidenceThreshold,
                                    EntropyBound,
                                    ErrorBudget,
                                    MaskGIT,
                                    ReMDM,
                                    parse_policy,
)
from ddpd.sampling.tau_leaping import tau_leaping_mask, tau_leaping_planned, tau_leaping_uniform

__all__ = [
    "ConfidenceFactor",
    "ConfidenceThreshold",
    "EntropyBound",
    "ErrorBudget",
    "MaskGIT",
    "ReMDM",
    "mask_sample",
    "parse_policy",
    "DDPDOptions",
    "Execution",
    "NaNOutputWarning",
    "SampleResult",
    "NoiseSource",
    "PhiloxNoise",
    "Temperature",
    "TorchNoise",
    "Truncation",
    "ddpd_sample",
    "ddpd_sample_uniform",
    "maskgit_sample",
    "tau_leaping_mask",
    "tau_leaping_planned",
    "tau_leaping_uniform",
]
