"""Seeded inputs and the variants of the op benchmarks (benchmarks/bench_<op>.py)."""
from __future__ import annotations

import functools

import pytest
import torch

from ddpd.testing.baselines import TORCH

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
MASK_ID = 50257
OURS = ["reference", "fused"]


def variants(candidates) -> list[str]:
    """The variant names of a case: each torch candidate ("torch: <name>"), then ddpd's."""
    return [TORCH + name for name in candidates] + OURS


@functools.cache
def randn(*shape, scale=3.0, device="cpu"):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(device)


@functools.cache
def uniforms(rows, cols, device="cpu"):
    """Uniforms in (0, 1) for the references (any uniforms do for timing)."""
    u = torch.rand(rows, cols, generator=torch.Generator().manual_seed(rows)).clamp_(min=2.0**-25)
    return u.to(device)
