"""ddpd: Discrete Diffusion with Planned Denoising (Liu et al., ICLR 2025).

A planner predicts which positions of a sequence are still noise; a denoiser fills
one chosen position; the adaptive Gillespie sampler repeats this until the planner
says the sequence is clean.
"""
import torch  # noqa: F401  (first: ddpd._C links against torch's libraries, which this loads)

__version__ = "0.1.0"
