"""One DDPD sampler step with a mask denoiser, excluding the two transformer bodies:
output head, softmax/sampling, planner selection, mask construction and scatter.

Run: `pytest benchmarks/bench_step.py --benchmark-only`. Inputs stand for the
bodies' outputs: planner logits [B, D] and the denoiser's final hidden states
[B, D, H] with its head (H -> V).
- torch: paper listing: the paper's listing (appendix 'Implementation details', DDPD
  with a separate planner and a mask denoiser; the mask as prop:draw_with_maskD states
  it): head on all B x D positions, softmax over [B, D, V], torch.multinomial;
- torch: gathered, DRAW: the best plain torch step (ddpd.testing.baselines.gathered_step):
  inverse-CDF planner draw and rand < p mask, the chosen positions' hidden rows
  gathered first, then linear + DRAW, one variant per token draw of
  ddpd.testing.baselines.CATEGORICAL (the fastest of them is the baseline, as with every op);
- fused: planner_select_mask -> hidden at the chosen positions ->
  sample_from_hidden -> scatter; no [B, D, V] tensor is ever allocated.
Runs on CPU, and on CUDA where a device is present.
Target (CPU): fused at least 20x faster than the paper listing at (B, D, V, H) =
(8, 1024, 50257, 256); the listing there builds 1.6 GB of logits and as much of
probabilities, so it is timed over 3 rounds only.
"""
import functools

import pytest
import torch
import torch.nn.functional as F

from ddpd.ops.planner_select import planner_select_mask
from ddpd.ops.sample_from_hidden import sample_from_hidden
from ddpd.testing.baselines import CATEGORICAL, EPS, TORCH, gathered_step
from inputs import DEVICES

SHAPES = [(64, 256, 28, 256), (8, 1024, 50257, 256)]  # (B, D, V, H)


def step_inputs(batch, length, vocab, width, device):
    g = torch.Generator().manual_seed(batch + length)
    inputs = dict(
        planner_logits=3 * torch.randn(batch, length, generator=g),
        x=torch.randint(0, vocab, (batch, length), generator=g),
        hidden=torch.randn(batch, length, width, generator=g),
        weight=torch.randn(vocab, width, generator=g) / width**0.5,
        bias=0.1 * torch.randn(vocab, generator=g),
    )
    return dict({name: t.to(device) for name, t in inputs.items()}, mask_id=vocab)


def reference_step(planner_logits, x, hidden, weight, bias, mask_id):
    """The paper's listing: the head at every position (see the module docstring)."""
    rows = torch.arange(x.shape[0], device=x.device)
    p = torch.sigmoid(planner_logits)
    stop = (p < EPS).all(-1)
    dim = torch.multinomial(p, 1).squeeze(-1)
    z = torch.bernoulli(p).bool()
    z[rows, dim] = True
    masked = torch.where(z, mask_id, x)  # the mask denoiser's input
    logits = F.linear(hidden, weight, bias)  # [B, D, V]
    probs = F.softmax(logits, dim=-1)
    tokens = torch.multinomial(probs[rows, dim], 1).squeeze(-1)
    out = x.clone()
    out[rows, dim] = tokens
    return out, masked, stop


def fused_step(planner_logits, x, hidden, weight, bias, mask_id, offset=0):
    positions, _, stop, masked, _, _ = planner_select_mask(planner_logits, x, mask_id, 1, seed=1, offset=offset)
    chosen = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden.shape[2])).squeeze(1)
    tokens, _, _, _ = sample_from_hidden(chosen, weight, bias, seed=1, offset=offset + 2)
    return x.scatter(1, positions, tokens[:, None]), masked, stop


GATHERED = {f"gathered, {name}": functools.partial(gathered_step, draw=draw) for name, draw in CATEGORICAL.items()}
STEPS = {TORCH + "paper listing": reference_step, **{TORCH + name: step for name, step in GATHERED.items()},
         "fused": fused_step}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-D{}-V{}-H{}".format(*s))
@pytest.mark.parametrize("variant", list(STEPS))
@pytest.mark.parametrize("device", DEVICES)
def test_sampler_step(compare, shape, variant, device):
    inputs = step_inputs(*shape, device)
    fn = STEPS[variant]
    big = shape[2] > 1000 and fn is reference_step and device == "cpu"
    compare("step", shape, variant, lambda: fn(**inputs), params="B x D x V x H, mask denoiser", device=device,
            rounds=3 if big else None)
