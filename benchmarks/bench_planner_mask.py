"""planner_mask (the mask of prop:draw_with_maskD at given positions) against plain torch.

Run: `pytest benchmarks/bench_planner_mask.py --benchmark-only`. Variants of each case, timed
in the same run (benchmarks/conftest.py): "torch: ..." (ddpd.testing.baselines.planner_mask:
the coins by torch.bernoulli or rand < p, the chosen positions scattered in), reference
(ddpd's torch reference, its uniforms made before timing) and fused (the ddpd op, seeded).
Each runs on CPU, and on CUDA where a device is present.
"""
import functools

import pytest
import torch

from ddpd.ops import reference
from ddpd.ops.planner_mask import planner_mask
from ddpd.testing import baselines
from ddpd.testing.baselines import TORCH
from inputs import DEVICES, MASK_ID, randn, uniforms, variants


@pytest.mark.parametrize("rows,length", [(64, 256), (8, 1024)])
@pytest.mark.parametrize("variant", variants(baselines.COIN))
@pytest.mark.parametrize("device", DEVICES)
def test_planner_mask(compare, rows, length, variant, device):
    logits = randn(rows, length, device=device)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, MASK_ID, (rows, length), generator=g).to(device)
    positions = torch.randint(0, length, (rows, 1), generator=g).to(device)
    noise = uniforms(rows, length, device=device)
    fns = {
        "reference": lambda: reference.planner_mask(logits, x, positions, MASK_ID, noise=noise),
        "fused": lambda: planner_mask(logits, x, positions, MASK_ID, seed=1, offset=2),
        **{TORCH + coin: functools.partial(baselines.planner_mask, logits, x, positions, MASK_ID, coin)
           for coin in baselines.COIN},
    }
    compare("planner_mask", (rows, length), variant, fns[variant], device=device)
