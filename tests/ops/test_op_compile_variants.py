"""New seeds and offsets never compile a new variant of a Triton kernel.

A sampler draws with a new offset at every step. Triton specialises an integer argument
on its value (1, multiples of 16) and types it by its range (int32 or int64), so words of
the seed and offset passed as plain integers made sample_categorical's finish kernel
compile 30 variants over the 8 seeds x 8 offsets below: seconds of compilation at
unpredictable steps of a first sampling run. The words now arrive as int32 arguments Triton does not specialise on
(ddpd.kernels.rng.COUNTER_WORDS, ddpd.ops.rng.split32).

Counted without a GPU: in a child process (no TRITON_INTERPRET), Triton's driver is
stubbed (ddpd.testing.launches) and each kernel's compile is counted as every
launcher runs at one shape under many seeds and offsets.
"""
from collections import Counter

import pytest

from ddpd.testing import launches as launch_cost
from hang_guard import run_compiled

SEEDS = (0, 1, 2, 16, 2**31 + 3, 2**32, 2**40 + 1, 2**63 + 16)
OFFSETS = (0, 1, 2, 16, 33, 2**31, 2**32 + 16, 2**62 + 1)
BUILDERS = {
    "sample_categorical": launch_cost.sample_categorical_call,
    "sample_from_hidden": launch_cost.sample_from_hidden_call,
    "planner_select": launch_cost.planner_call,
    "planner_select_mask": lambda **kw: launch_cost.planner_call(with_mask=True, **kw),
    "planner_mask": launch_cost.planner_mask_call,
    "bernoulli": launch_cost.bernoulli_call,
}


@pytest.mark.integration
def test_seeds_and_offsets_compile_each_kernel_once():
    result = run_compiled(__file__)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("ok ") == len(BUILDERS), result.stdout


COMPILES: Counter = Counter()  # kernel name -> variants compiled since the last reset


def compiles_per_kernel(build) -> Counter:
    """How many variants of each kernel the launcher asks Triton to compile over SEEDS x OFFSETS."""
    COMPILES.clear()
    for seed in SEEDS:
        for offset in OFFSETS:
            build(seed=seed, offset=offset)()
    return Counter(COMPILES)


if __name__ == "__main__":
    launch_cost.stub_triton(on_compile=lambda name: COMPILES.update([name]))
    for name, build in BUILDERS.items():
        counts = compiles_per_kernel(build)
        assert counts and set(counts.values()) == {1}, f"{name}: compiled variants per kernel {dict(counts)}"
        print(f"ok {name}: {dict(counts)}")
