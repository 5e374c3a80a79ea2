"""Samplers of DDPD and its baselines, in plain torch (the reference implementations).

Models are callables (see DESIGN.md): planner(x) -> Float[B, D] logits of "position
is noise", denoiser(x, t) -> Float[B, D, V] logits. Every sampler takes one of
seed / generator / noise (a NoiseSource, ddpd.sampling.noise) and returns a
SampleResult (tokens, steps, per-row stop_step, forward-pass counts).

- ddpd_sample: the DDPD Gillespie sampler with a planner and a uniform or mask denoiser.
- ddpd_sample_uniform: DDPD with a single uniform-diffusion model split by
  prop:generative_rate_decomposition.
- tau_leaping_mask (DFM), tau_leaping_uniform (DFM-Uni), tau_leaping_planned (P x D).
- maskgit_sample: MaskGIT confidence-based unmasking.

fused=True (ddpd_sample with clock='planner', the tau-leaping samplers, MaskGIT)
runs the same sampler with the per-step draws in the ddpd.ops kernels and no host
synchronisation inside a step; rows that stop early leave the batch at a stop check
every sync_every steps (ddpd.sampling.fused, fused_batch, fused_draws). From the
same noise source it returns the same samples as the reference code.
SampleResult also reports the row-evaluations early stopping saved.
"""
from ddpd.sampling.common import SampleResult
from ddpd.sampling.gillespie import ddpd_sample, ddpd_sample_uniform
from ddpd.sampling.maskgit import maskgit_sample
from ddpd.sampling.noise import NoiseSource, PhiloxNoise, TorchNoise
from ddpd.sampling.tau_leaping import tau_leaping_mask, tau_leaping_planned, tau_leaping_uniform

__all__ = [
    "SampleResult",
    "NoiseSource",
    "PhiloxNoise",
    "TorchNoise",
    "ddpd_sample",
    "ddpd_sample_uniform",
    "maskgit_sample",
    "tau_leaping_mask",
    "tau_leaping_planned",
    "tau_leaping_uniform",
]
