"""The fused sampling ops against plain torch, op by op, on CPU.

Run: `pytest benchmarks/bench_ops.py --benchmark-only` (the summary at the end gives
the speed-ups and peak memory). Variants of each group, timed in the same run:
- torch: what public DDPD implementations do (softmax + torch.multinomial, full
  [N, V] logits for the head, torch.bernoulli for the mask);
- reference: the ddpd torch reference of the op (same draws as the fused op), with
  its uniforms generated before timing;
- fused: the ddpd op, seeded (its counter-based uniforms are generated inside).
Each runs on CPU, and on CUDA where a device is present (Triton kernels).
Targets: sample_categorical 64 x 50257 fp32 at least 5x faster than torch on CPU; with
top-k / top-p / min-p (test_sample_categorical_controls) at least 3x faster than the
usual torch code (Hugging Face's logits warpers: top-k by torch.topk, top-p by sort +
cumsum + mask, min-p by a softmax threshold; then softmax + torch.multinomial).
"""
import functools

import pytest
import torch
import torch.nn.functional as F

from ddpd.ops.planner_select import planner_select, planner_select_mask, planner_select_mask_reference, \
    planner_select_reference
from ddpd.ops.sample_categorical import noise_width, sample_categorical, sample_categorical_reference
from ddpd.ops.sample_from_hidden import sample_from_hidden, sample_from_hidden_reference

VARIANTS = ["torch", "reference", "fused"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
MASK_ID = 50257
EPS = 0.01


@functools.lru_cache(maxsize=None)
def randn(*shape, scale=3.0, device="cpu"):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(device)


@functools.lru_cache(maxsize=None)
def uniforms(rows, cols, device="cpu"):
    """Uniforms in (0, 1) for the references (any uniforms do for timing)."""
    u = torch.rand(rows, cols, generator=torch.Generator().manual_seed(rows)).clamp_(min=2.0**-25)
    return u.to(device)


@pytest.mark.parametrize("rows,vocab", [(64, 28), (64, 50257)])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("device", DEVICES)
def test_sample_categorical(compare, rows, vocab, variant, device):
    logits = randn(rows, vocab, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    fns = {
        "torch": lambda: torch.multinomial(torch.softmax(logits, -1), 1),
        "reference": lambda: sample_categorical_reference(logits, noise=noise),
        "fused": lambda: sample_categorical(logits, seed=1, offset=2),
    }
    compare(f"sample_categorical {rows}x{vocab} fp32", variant, fns[variant], device)


def torch_planner_select(logits):
    p = torch.sigmoid(logits)
    return torch.multinomial(p, 1), p.sum(-1), (p < EPS).all(-1)


@pytest.mark.parametrize("rows,length", [(64, 256), (8, 1024)])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("device", DEVICES)
def test_planner_select(compare, rows, length, variant, device):
    logits = randn(rows, length, device=device)
    noise = uniforms(rows, length, device=device)
    fns = {
        "torch": lambda: torch_planner_select(logits),
        "reference": lambda: planner_select_reference(logits, noise=noise),
        "fused": lambda: planner_select(logits, seed=1, offset=2),
    }
    compare(f"planner_select {rows}x{length}", variant, fns[variant], device)


def torch_planner_select_mask(logits, x):
    """The plan step and the mask of prop:draw_with_maskD as the paper's listing writes them."""
    p = torch.sigmoid(logits)
    positions = torch.multinomial(p, 1)
    z = torch.bernoulli(p).bool().scatter_(1, positions, True)
    return positions, p.sum(-1), (p < EPS).all(-1), torch.where(z, MASK_ID, x), z, z.sum(-1)


@pytest.mark.parametrize("rows,length", [(64, 256), (8, 1024)])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("device", DEVICES)
def test_planner_select_mask(compare, rows, length, variant, device):
    logits = randn(rows, length, device=device)
    x = torch.randint(0, MASK_ID, (rows, length), generator=torch.Generator().manual_seed(0)).to(device)
    noise, mask_noise = uniforms(rows, length, device=device), uniforms(rows + 1, length, device=device)[1:]
    fns = {
        "torch": lambda: torch_planner_select_mask(logits, x),
        "reference": lambda: planner_select_mask_reference(logits, x, MASK_ID, noise=noise, mask_noise=mask_noise),
        "fused": lambda: planner_select_mask(logits, x, MASK_ID, seed=1, offset=2),
    }
    compare(f"planner_select_mask {rows}x{length}", variant, fns[variant], device)


@pytest.mark.parametrize("rows,width,vocab", [(64, 256, 28), (8, 256, 50257)])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("device", DEVICES)
def test_sample_from_hidden(compare, rows, width, vocab, variant, device):
    hidden = randn(rows, width, scale=1.0, device=device)
    weight = randn(vocab, width, scale=width**-0.5, device=device)
    bias = randn(vocab, scale=0.1, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    fns = {
        "torch": lambda: torch.multinomial(torch.softmax(F.linear(hidden, weight, bias), -1), 1),
        "reference": lambda: sample_from_hidden_reference(hidden, weight, bias, noise=noise),
        "fused": lambda: sample_from_hidden(hidden, weight, bias, seed=1, offset=2),
    }
    compare(f"sample_from_hidden {rows}x{width} -> {vocab}", variant, fns[variant], device)


def torch_truncated(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """The usual torch code of a truncated draw (Hugging Face's warpers, in their order):
    temperature, top-k (torch.topk), top-p (sort + cumsum + mask, scattered back), min-p
    (softmax threshold), then softmax + torch.multinomial."""
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        remove = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(remove, float("-inf")))
    if min_p is not None:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1)


CONTROLS = {"top_k=50": dict(top_k=50), "top_p=0.9": dict(top_p=0.9), "min_p=0.05": dict(min_p=0.05),
            "top_k=50 top_p=0.9": dict(top_k=50, top_p=0.9)}


@pytest.mark.parametrize("controls", list(CONTROLS))
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("device", DEVICES)
def test_sample_categorical_controls(compare, controls, variant, device):
    rows, vocab = 64, 50257
    logits = randn(rows, vocab, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    kw = CONTROLS[controls]
    fns = {
        "torch": lambda: torch_truncated(logits, 0.8, **kw),
        "reference": lambda: sample_categorical_reference(logits, 0.8, noise=noise, **kw),
        "fused": lambda: sample_categorical(logits, 0.8, seed=1, offset=2, **kw),
    }
    compare(f"sample_categorical {rows}x{vocab} fp32 {controls}", variant, fns[variant], device)
