"""sample_from_hidden (the output head fused with the draw) against a matmul + plain torch draw.

Run: `pytest benchmarks/bench_sample_from_hidden.py --benchmark-only`. Variants of each case,
timed in the same run (benchmarks/conftest.py): "torch: matmul + ..." (F.linear, then each
draw of ddpd.testing.baselines.CATEGORICAL), reference (ddpd's torch reference, its uniforms
made before timing) and fused (the ddpd op, seeded). Shapes are (rows, H, V). Each runs on
CPU, and on CUDA where a device is present.
"""
import pytest
import torch.nn.functional as F

from ddpd.ops import reference
from ddpd.ops.sample_categorical import noise_width
from ddpd.ops.sample_from_hidden import sample_from_hidden
from ddpd.testing import baselines
from ddpd.testing.baselines import TORCH
from inputs import DEVICES, randn, uniforms, variants


@pytest.mark.parametrize("rows,width,vocab", [(64, 256, 28), (8, 256, 50257)])
@pytest.mark.parametrize("variant", variants(f"matmul + {name}" for name in baselines.CATEGORICAL))
@pytest.mark.parametrize("device", DEVICES)
def test_sample_from_hidden(compare, rows, width, vocab, variant, device):
    hidden = randn(rows, width, scale=1.0, device=device)
    weight = randn(vocab, width, scale=width**-0.5, device=device)
    bias = randn(vocab, scale=0.1, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    fns = {
        "reference": lambda: reference.sample_from_hidden(hidden, weight, bias, noise=noise),
        "fused": lambda: sample_from_hidden(hidden, weight, bias, seed=1, offset=2),
        **{f"{TORCH}matmul + {name}": lambda draw=draw: draw(F.linear(hidden, weight, bias))
           for name, draw in baselines.CATEGORICAL.items()},
    }
    compare("sample_from_hidden", (rows, width, vocab), variant, fns[variant], device=device)
