"""sample_categorical against plain torch, with and without top-k / top-p / min-p.

Run: `pytest benchmarks/bench_sample_categorical.py --benchmark-only`. Variants of each
case, timed in the same run (benchmarks/conftest.py):
- "torch: ...": plain torch code for the same draw (ddpd.testing.baselines): softmax +
  torch.multinomial, Gumbel-argmax and the inverse CDF; with truncation the usual code
  (Hugging Face's logits warpers: top-k by torch.topk, top-p by sort + cumsum + mask, min-p
  by a softmax threshold, then softmax + torch.multinomial) and the draw among the kept
  tokens only;
- reference: the ddpd torch reference (same draws as the op), its uniforms made before timing;
- fused: the ddpd op, seeded (its counter-based uniforms are generated inside).
Each runs on CPU, and on CUDA where a device is present.
Targets: 64 x 50257 fp32 at least 5x softmax + torch.multinomial on CPU; with truncation at
least 3x the usual torch code at 64 x 50257, and at least as fast as it at every shape of
CONTROL_SHAPES (short rows too, where a row's fixed cost counts). Against the fastest torch
code no target is set: the summary says where ddpd is slower.
"""
import functools

import pytest

from ddpd.ops import reference
from ddpd.ops.sample_categorical import noise_width, sample_categorical
from ddpd.testing import baselines
from ddpd.testing.baselines import TORCH
from inputs import DEVICES, randn, uniforms, variants


@pytest.mark.parametrize("rows,vocab", [(64, 28), (4096, 27), (64, 50257)])
@pytest.mark.parametrize("variant", variants(baselines.CATEGORICAL))
@pytest.mark.parametrize("device", DEVICES)
def test_sample_categorical(compare, rows, vocab, variant, device):
    logits = randn(rows, vocab, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    fns = {
        "reference": lambda: reference.sample_categorical(logits, noise=noise),
        "fused": lambda: sample_categorical(logits, seed=1, offset=2),
        **{TORCH + name: functools.partial(draw, logits) for name, draw in baselines.CATEGORICAL.items()},
    }
    compare("sample_categorical", (rows, vocab), variant, fns[variant], device=device)


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
@pytest.mark.parametrize("variant", variants(baselines.TRUNCATED))
@pytest.mark.parametrize("device", DEVICES)
def test_sample_categorical_controls(compare, rows, vocab, controls, variant, device):
    logits = randn(rows, vocab, device=device)
    noise = uniforms(rows, noise_width(vocab), device=device)
    kw = control_kwargs(controls, vocab)
    controls = " ".join(f"{name}={value}" for name, value in kw.items())
    fns = {
        "reference": lambda: reference.sample_categorical(logits, 0.8, noise=noise, **kw),
        "fused": lambda: sample_categorical(logits, 0.8, seed=1, offset=2, **kw),
        **{TORCH + name: functools.partial(draw, logits, 0.8, **kw) for name, draw in baselines.TRUNCATED.items()},
    }
    compare("sample_categorical", (rows, vocab), variant, fns[variant], params=f"T=0.8 {controls}", device=device)
