"""compact_fixed / scatter_back on CPU against the nonzero + index_select (and index_copy_)
chains they replace, for the state of a sampler batch of B = 256 sequences of D = 1024
tokens: tokens Long[B, D], planner logits Float[B, D], time Float[B]. nonzero + index_select
does less than compact_fixed (the active rows only, no count; a host sync on CUDA), so it is
"related: ..." code (ddpd.testing.baselines.COMPACT_RELATED), shown apart; compact_fixed's
torch baseline for its own job is ddpd.testing.baselines.COMPACT (a fixed number of rows, no
host sync on CUDA: stable sort, index_select, torch.where).

Run: `pytest benchmarks/bench_compact.py --benchmark-only`; both sides run with
DDPD_BENCH_THREADS torch threads (default 1), in the same run (benchmarks/conftest.py).
Target: compact_fixed faster than nonzero + index_select (the code it replaces), at 1 and at 2
threads. Both sides
copy the same bytes; on CPU that copy is bound by memory bandwidth, so the margin comes from
the fixed cost per call and from how evenly the threads share the bytes.
"""
import pytest
import torch

from ddpd.ops.compact import compact_fixed, scatter_back
from ddpd.testing.baselines import COMPACT, COMPACT_RELATED, RELATED, TORCH

B, D = 256, 1024
PARAMS = "tokens int64, logits float32, time float32"


@pytest.fixture(scope="module")
def state():
    g = torch.Generator().manual_seed(0)
    active = torch.rand(B, generator=g) < 0.6
    tokens = torch.randint(0, 50257, (B, D), generator=g)
    logits = torch.randn(B, D, generator=g)
    time = torch.rand(B, generator=g)
    return active, (tokens, logits, time)


def torch_scatter_back(index, packed, outs):
    for p, o in zip(packed, outs):
        o.index_copy_(0, index, p)


@pytest.mark.parametrize("variant", [*(TORCH + name for name in COMPACT), *(RELATED + name for name in COMPACT_RELATED),
                                     "fused"])
def test_compact_fixed(compare, state, variant):
    active, tensors = state
    fns = {**{TORCH + name: lambda fn=fn: fn(active, B, *tensors) for name, fn in COMPACT.items()},
           **{RELATED + name: lambda fn=fn: fn(active, B, *tensors) for name, fn in COMPACT_RELATED.items()},
           "fused": lambda: compact_fixed(active, B, *tensors)}
    compare("compact_fixed", (B, D), variant, fns[variant], dtype="mixed", params=PARAMS)


@pytest.mark.parametrize("variant", [TORCH + "index_copy_", "fused"])
def test_scatter_back(compare, state, variant):
    active, tensors = state
    packed, index, _ = compact_fixed(active, int(active.sum()), *tensors)
    outs = [t.clone() for t in tensors]
    fns = {TORCH + "index_copy_": lambda: torch_scatter_back(index, packed, outs),
           "fused": lambda: scatter_back(index, packed, outs)}
    compare("scatter_back", (B, D), variant, fns[variant], dtype="mixed", params=PARAMS)
