"""Samplers of DDPD and its baselines, each written once (docs/sampling.md).

Models are callables: planner(x) -> Float[B, D] logits of "position is noise",
denoiser(x, t) -> Float[B, D, V] logits. Every sampler returns a SampleResult.

- ddpd_sample, ddpd_sample_uniform: the DDPD Gillespie sampler (Algorithm 1).
- tau_leaping_mask (DFM), tau_leaping_uniform (DFM-Uni), tau_leaping_planned (P x D).
- maskgit_sample, mask_sample: the mask loop with MaskGIT's or another commit policy.

Every sampler takes the same keyword-only options: steps, temperature (a float or a
Temperature), truncation=Truncation(...), execution=Execution(...) (fused kernels, stop
checks, precision), prompt=Prompt(x_init, frozen), guidance=Guidance(labels, scale), schedule,
seed / generator / noise, device; the DDPD samplers also ddpd=DDPDOptions(...).
"""
from ddpd.sampling.batch import NaNOutputWarning, SampleResult
from ddpd.sampling.gillespie import ddpd_sample, ddpd_sample_uniform
from ddpd.sampling.maskgit import mask_sample, maskgit_sample
from ddpd.sampling.noise import NoiseSource, PhiloxNoise, TorchNoise
from ddpd.sampling.options import DDPDOptions, Execution, Guidance, Prompt, Temperature, Truncation
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
    "Guidance",
    "NaNOutputWarning",
    "SampleResult",
    "NoiseSource",
    "PhiloxNoise",
    "Prompt",
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
