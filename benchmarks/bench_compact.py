"""compact_fixed / scatter_back on CPU against the nonzero + index_select
(and index_copy_) chains they replace, for the state of a sampler batch of B = 256
sequences of D = 1024 tokens: tokens Long[B, D], planner logits Float[B, D], time
Float[B]. Run with `pytest benchmarks/bench_compact.py --benchmark-only`; each ddpd
benchmark prints its speed-up over the torch chain timed in the same run, with
DDPD_BENCH_THREADS torch threads (default 1) on both sides.
Target: compact_fixed faster than nonzero + index_select, at 1 and at 2 threads. Both
sides copy the same bytes; on CPU that copy is bound by memory bandwidth, so the
margin comes from the fixed cost per call and from how evenly the threads share
the bytes."""
import pytest
import torch

from ddpd.ops.compact import compact_fixed, scatter_back

B, D = 256, 1024


@pytest.fixture(scope="module")
def state():
    g = torch.Generator().manual_seed(0)
    active = torch.rand(B, generator=g) < 0.6
    tokens = torch.randint(0, 50257, (B, D), generator=g)
    logits = torch.randn(B, D, generator=g)
    time = torch.rand(B, generator=g)
    return active, (tokens, logits, time)


def torch_compact(active, *tensors):
    index = active.nonzero().squeeze(1)
    return tuple(t.index_select(0, index) for t in tensors), index


def torch_scatter_back(index, packed, outs):
    for p, o in zip(packed, outs):
        o.index_copy_(0, index, p)


def test_torch_compact(versus, state):
    active, tensors = state
    versus("compact", "torch: nonzero + index_select", torch_compact, active, *tensors)


def test_ddpd_compact_fixed(versus, state):
    active, tensors = state
    versus("compact", "ddpd fixed capacity", compact_fixed, active, B, *tensors,
           baselines=("torch: nonzero + index_select",))


def test_torch_scatter_back(versus, state):
    active, tensors = state
    packed, index = torch_compact(active, *tensors)
    outs = [t.clone() for t in tensors]
    versus("scatter_back", "torch: index_copy_", torch_scatter_back, index, packed, outs)


def test_ddpd_scatter_back(versus, state):
    active, tensors = state
    packed, index, _ = compact_fixed(active, int(active.sum()), *tensors)
    outs = [t.clone() for t in tensors]
    versus("scatter_back", "ddpd", scatter_back, index, packed, outs, baselines=("torch: index_copy_",))
