"""ddpd: Discrete Diffusion with Planned Denoising (Liu et al., ICLR 2025).

A planner predicts which positions of a sequence are still noise; a denoiser fills
one chosen position; the adaptive Gillespie sampler repeats this until the planner
says the sequence is clean.
"""
from ddpd import _interrupts

_interrupts.install()  # before torch's import, the seconds a Ctrl-C most often lands in

import torch  # noqa: E402, F401  (before ddpd._C: it links against torch's libraries, which this loads)

__version__ = "0.1.0"
