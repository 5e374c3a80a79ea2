"""philox_uniform (counter-based uniforms of (seed, offset, row id, column)) against plain torch.

Run: `pytest benchmarks/bench_philox_uniform.py --benchmark-only`. Variants of each case, timed in
the same run (benchmarks/conftest.py): "torch: torch Philox" (philox_uniform_reference, plain torch
drawing the same uniforms), "related: torch.rand" (torch's own uniforms from a generator: not a
counter-based stream, another job, shown apart) and fused (the ddpd op: ddpd._C's vector Philox on
the CPU, the Triton kernel on CUDA). Shapes: a sampler's token noise (64 rows of 256 and 4096 columns) and a
toy's many short rows (50,000 of 3).
"""
import pytest
import torch

from ddpd.ops import load_extension
from ddpd.ops.rng import philox_uniform, philox_uniform_reference
from ddpd.testing.baselines import RELATED, TORCH
from inputs import DEVICES


@pytest.mark.parametrize("rows,cols", [(64, 256), (64, 4096), (50000, 3)])
@pytest.mark.parametrize("variant", [TORCH + "torch Philox", RELATED + "torch.rand", "fused"])
@pytest.mark.parametrize("device", DEVICES)
def test_philox_uniform(compare, rows, cols, variant, device):
    load_extension()  # the CPU path runs ddpd._C once loaded
    ids = torch.arange(rows, device=device)
    generator = torch.Generator(device).manual_seed(0)
    fns = {
        TORCH + "torch Philox": lambda: philox_uniform_reference(1, 2, ids, cols),
        RELATED + "torch.rand": lambda: torch.rand(rows, cols, generator=generator, device=device),
        "fused": lambda: philox_uniform(1, 2, ids, cols),
    }
    compare("philox_uniform", (rows, cols), variant, fns[variant], device=device)
