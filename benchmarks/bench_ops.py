"""The fused sampling ops against plain torch, op by op, on CPU.

Run: `pytest benchmarks/bench_ops.py --benchmark-only` (the summary at the end gives
the speed-ups, the fastest torch code of each group and peak memory). Variants of each
group, timed in the same run:
- "torch: ...": plain torch code for the same draw (benchmarks/torch_draws.py): the
  usual code of public implementations (softmax + torch.multinomial, full [N, V] logits
  for the head, torch.bernoulli for the mask, truncation by masking all V logits) and
  the fastest torch code for the same law (Gumbel-argmax, inverse CDF, rand < p,
  truncation among the kept tokens only);
- reference: the ddpd torch reference of the op (same draws as the fused op), with
  its uniforms generated before timing;
- fused: the ddpd op, seeded (its counter-based uniforms are generated inside).
Each runs on CPU, and on CUDA where a device is present (Triton kernels).
Targets: sample_categorical 64 x 50257 fp32 at least 5x faster than softmax +
torch.multinomial on CPU; with top-k / top-p / min-p (test_sample_categorical_controls)
at least 3x faster than the usual torch code at 64 x 50257 (Hugging Face's logits
warpers: top-k by torch.topk, top-p by sort + cumsum + mask, min-p by a softmax
threshold; then softmax + torch.multinomial), and at least as fast as it at every shape
of CONTROL_SHAPES (short rows too, where a row's fixed cost counts). Against the fastest
torch code no target is set: the summary says where ddpd is slower.
"""
import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_draws  # noqa: E402
from ddpd.ops.planner_select import (  # noqa: E402
    planner_select,
    planner_select_mask,
    planner_select_mask_reference,
    planner_select_reference,
)
from ddpd.ops.sample_categorical import noise_width, sample_categorical, sample_categorical_reference  # noqa: E402
from ddpd.ops.sample_from_hidden import sample_from_hidden, sample_from_hidden_reference  # noqa: E402
from torch_draws import TORCH  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
MASK_ID = 50257
OURS = ["reference", "fused"]


def variants(candidates) -> list[str]:
    """The variant names of a group: each torch candidate ("torch: <name>"), then ddpd's."""
    return [TORCH + name for name in candidates] + OURS


@functools.cache
def randn(*shape, scale=3.0, device="cpu"):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(device)


@functools.cache
def uniforms(rows, cols, device="cpu"):
    """Uniforms in (0, 1) for the references (any uniforms do for timing)."""
    u = torch.rand(rows, cols, generator=torch.Generator().manual_seed(rows)).clamp_(min=2.0**-25)
    return u.to(device)


@pytest.mark.parametrize("rows,vocab", [(64, 28), (4096, 27), (64, 50257)])
@pytest.mark.parametrize("variant", variants(torch_draws.CATEGORICAL))
@pytest.mark.parametrize("device", DEVICES)
def test_sample_categorical(compare, rows, vocab, variant, device):
    logits = randn(rows, vocab, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    fns = {
        "reference": lambda: sample_categorical_reference(logits, noise=noise),
        "fused": lambda: sample_categorical(logits, seed=1, offset=2),
        **{TORCH + name: functools.partial(draw, logits) for name, draw in torch_draws.CATEGORICAL.items()},
    }
    compare(f"sample_categorical {rows}x{vocab} fp32", variant, fns[variant], device)


@pytest.mark.parametrize("rows,length", [(64, 256), (8, 1024)])
@pytest.mark.parametrize("variant", variants(torch_draws.SELECT))
@pytest.mark.parametrize("device", DEVICES)
def test_planner_select(compare, rows, length, variant, device):
    logits = randn(rows, length, device=device)
    noise = uniforms(rows, length, device=device)
    fns = {
        "reference": lambda: planner_select_reference(logits, noise=noise),
        "fused": lambda: planner_select(logits, seed=1, offset=2),
        **{TORCH + name: functools.partial(torch_draws.planner_select, logits, name) for name in torch_draws.SELECT},
    }
    compare(f"planner_select {rows}x{length}", variant, fns[variant], device)


@pytest.mark.parametrize("rows,length", [(64, 256), (8, 1024)])
@pytest.mark.parametrize("variant", variants(torch_draws.PLANNER_MASK))
@pytest.mark.parametrize("device", DEVICES)
def test_planner_select_mask(compare, rows, length, variant, device):
    logits = randn(rows, length, device=device)
    x = torch.randint(0, MASK_ID, (rows, length), generator=torch.Generator().manual_seed(0)).to(device)
    noise, mask_noise = uniforms(rows, length, device=device), uniforms(rows + 1, length, device=device)[1:]
    fns = {
        "reference": lambda: planner_select_mask_reference(logits, x, MASK_ID, noise=noise, mask_noise=mask_noise),
        "fused": lambda: planner_select_mask(logits, x, MASK_ID, seed=1, offset=2),
        **{TORCH + name: functools.partial(torch_draws.planner_select_mask, logits, x, MASK_ID, *draws)
           for name, draws in torch_draws.PLANNER_MASK.items()},
    }
    compare(f"planner_select_mask {rows}x{length}", variant, fns[variant], device)


@pytest.mark.parametrize("rows,width,vocab", [(64, 256, 28), (8, 256, 50257)])
@pytest.mark.parametrize("variant", variants(f"matmul + {name}" for name in torch_draws.CATEGORICAL))
@pytest.mark.parametrize("device", DEVICES)
def test_sample_from_hidden(compare, rows, width, vocab, variant, device):
    hidden = randn(rows, width, scale=1.0, device=device)
    weight = randn(vocab, width, scale=width**-0.5, device=device)
    bias = randn(vocab, scale=0.1, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    fns = {
        "reference": lambda: sample_from_hidden_reference(hidden, weight, bias, noise=noise),
        "fused": lambda: sample_from_hidden(hidden, weight, bias, seed=1, offset=2),
        **{f"{TORCH}matmul + {name}": lambda draw=draw: draw(F.linear(hidden, weight, bias))
           for name, draw in torch_draws.CATEGORICAL.items()},
    }
    compare(f"sample_from_hidden {rows}x{width} -> {vocab}", variant, fns[variant], device)


CONTROLS = ("top_k", "top_p", "min_p", "top_k top_p")
# GPT-2's vocabulary, and the small ones that MaskGIT and tau-leaping draw at every one of
# B x D positions (text8's 27 characters, DNA's 5 bases), where a row's fixed cost counts
CONTROL_SHAPES = [(64, 50257), (2048, 300), (4096, 27), (16384, 27), (16384, 5)]


def control_kwargs(controls: str, vocab: int) -> dict:
    """The keyword arguments of a truncation: top-k 50 (Hugging Face's default) where it
    cuts, else a fifth of the vocabulary (at least 2); top-p 0.9; min-p 0.05."""
    every = dict(top_k=50 if vocab > 100 else max(2, vocab // 5), top_p=0.9, min_p=0.05)
    return {name: every[name] for name in controls.split()}


@pytest.mark.parametrize("rows,vocab", CONTROL_SHAPES)
@pytest.mark.parametrize("controls", CONTROLS)
@pytest.mark.parametrize("variant", variants(torch_draws.TRUNCATED))
@pytest.mark.parametrize("device", DEVICES)
def test_sample_categorical_controls(compare, rows, vocab, controls, variant, device):
    logits = randn(rows, vocab, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    kw = control_kwargs(controls, vocab)
    controls = " ".join(f"{name}={value}" for name, value in kw.items())
    fns = {
        "reference": lambda: sample_categorical_reference(logits, 0.8, noise=noise, **kw),
        "fused": lambda: sample_categorical(logits, 0.8, seed=1, offset=2, **kw),
        **{TORCH + name: functools.partial(draw, logits, 0.8, **kw) for name, draw in torch_draws.TRUNCATED.items()},
    }
    compare(f"sample_categorical {rows}x{vocab} fp32 {controls}", variant, fns[variant], device)
