"""planner_select and planner_select_mask against plain torch.

Run: `pytest benchmarks/bench_planner_select.py --benchmark-only`. Variants of each case,
timed in the same run (benchmarks/conftest.py): "torch: ..." (ddpd.testing.baselines: the
position by torch.multinomial, the inverse CDF or Gumbel-argmax; the mask coins by
torch.bernoulli or rand < p), reference (ddpd's torch reference, its uniforms made before
timing) and fused (the ddpd op, seeded). Each runs on CPU, and on CUDA where a device is present.
"""
import functools

import pytest
import torch

from ddpd.ops import reference
from ddpd.ops.planner_select import planner_select, planner_select_mask
from ddpd.testing import baselines
from ddpd.testing.baselines import TORCH
from inputs import DEVICES, MASK_ID, randn, uniforms, variants


@pytest.mark.parametrize("rows,length", [(64, 256), (8, 1024)])
@pytest.mark.parametrize("variant", variants(baselines.SELECT))
@pytest.mark.parametrize("device", DEVICES)
def test_planner_select(compare, rows, length, variant, device):
    logits = randn(rows, length, device=device)
    noise = uniforms(rows, length, device=device)
    fns = {
        "reference": lambda: reference.planner_select(logits, noise=noise),
        "fused": lambda: planner_select(logits, seed=1, offset=2),
        **{TORCH + name: functools.partial(baselines.planner_select, logits, name) for name in baselines.SELECT},
    }
    compare("planner_select", (rows, length), variant, fns[variant], device=device)


@pytest.mark.parametrize("rows,length", [(64, 256), (8, 1024)])
@pytest.mark.parametrize("variant", variants(baselines.PLANNER_MASK))
@pytest.mark.parametrize("device", DEVICES)
def test_planner_select_mask(compare, rows, length, variant, device):
    logits = randn(rows, length, device=device)
    x = torch.randint(0, MASK_ID, (rows, length), generator=torch.Generator().manual_seed(0)).to(device)
    noise, mask_noise = uniforms(rows, length, device=device), uniforms(rows + 1, length, device=device)[1:]
    fns = {
        "reference": lambda: reference.planner_select_mask(logits, x, MASK_ID, noise=noise, mask_noise=mask_noise),
        "fused": lambda: planner_select_mask(logits, x, MASK_ID, seed=1, offset=2),
        **{TORCH + name: functools.partial(baselines.planner_select_mask, logits, x, MASK_ID, *draws)
           for name, draws in baselines.PLANNER_MASK.items()},
    }
    compare("planner_select_mask", (rows, length), variant, fns[variant], device=device)
