"""bernoulli (z = u < p from counter-based uniforms) against plain torch.

Run: `pytest benchmarks/bench_bernoulli.py --benchmark-only`. Variants of each case, timed in
the same run (benchmarks/conftest.py): "torch: ..." (ddpd.testing.baselines.COIN:
torch.bernoulli, rand < p), reference (ddpd's torch reference, its uniforms made before timing)
and fused (the ddpd op, seeded). Each runs on CPU, and on CUDA where a device is present.
"""
import pytest
import torch

from ddpd.ops import reference
from ddpd.ops.bernoulli import bernoulli
from ddpd.testing import baselines
from ddpd.testing.baselines import TORCH
from inputs import DEVICES, randn, uniforms, variants


@pytest.mark.parametrize("rows,width", [(64, 256), (64, 1024)])
@pytest.mark.parametrize("variant", variants(baselines.COIN))
@pytest.mark.parametrize("device", DEVICES)
def test_bernoulli(compare, rows, width, variant, device):
    p = torch.sigmoid(randn(rows, width, device=device))
    noise = uniforms(rows, width, device=device)
    fns = {
        "reference": lambda: reference.bernoulli(p, noise=noise),
        "fused": lambda: bernoulli(p, seed=1, offset=2),
        **{TORCH + coin: (lambda draw=draw: draw(p)) for coin, draw in baselines.COIN.items()},
    }
    compare("bernoulli", (rows, width), variant, fns[variant], device=device)
