"""ddpd: Discrete Diffusion with Planned Denoising (Liu et al., ICLR 2025).

A planner predicts which positions of a sequence are still noise; a denoiser fills
one chosen position; the adaptive Gillespie sampler repeats this until the planner
says the sequence is clean.
"""
from ddpd import _interrupts

# Installed before torch's import, the seconds a Ctrl-C most often lands in. torch is
# imported before ddpd._C, which links against torch's libraries; not in a tool's process:
# a tool checks its command line first, then imports torch (seconds on a busy machine).
if _interrupts.install() is None:
    import torch  # noqa: E402, F401

__version__ = "0.1.0"
