"""The Python side of a CUDA call of each Triton op, measured without a GPU.

On a GPU an eager call costs its wrapper's checks (benchmarks/host_cost.py), then the
op's launcher (ddpd.ops.<op>.<op>_triton: allocations, grids) and the launch of each
kernel before the driver's cuLaunchKernel. This times the launcher and its launches on CPU
tensors, with Triton's driver and compiled kernels stubbed (ddpd.testing.launches):
everything but the driver's own calls. Shapes of the GPU benchmarks (64 rows of GPT-2's
vocabulary, H = 768).

Per op: the call as it runs (each kernel started from ddpd's cache of compiled kernels,
ddpd.ops._dispatch.launch), the same call through Triton's launch (JITFunction.run behind a
wrapper, which launch() defers to: argument binding and specialisation, cache lookup), and
Triton's launch of each kernel alone.

    python benchmarks/launch_cost.py

It refuses to run under TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

import torch

from ddpd.testing.launches import LAUNCHES, record_launches, stub_triton, tritons_launch
from ddpd.testing.timing import best_per_call

CALLS, REPEATS = 2000, 7


def per_call_us(fn: Callable[[], object]) -> float:
    """Best of REPEATS timings of CALLS calls, microseconds a call."""
    return best_per_call(fn, calls=CALLS, repeats=REPEATS, warmup=50)[0] * 1e6


def through_tritons_launch(call: Callable[[], object]) -> float:
    """per_call_us(call) with every kernel launched by Triton's JITFunction.run."""
    with tritons_launch():
        return per_call_us(call)


def main() -> int:
    # --help: this docstring
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes"):
        # the interpreter would run every kernel for real on the CPU: minutes, and nothing about launches
        print("launch_cost: TRITON_INTERPRET is set; run it without (unset TRITON_INTERPRET)", file=sys.stderr)
        return 2
    import triton

    torch.set_num_threads(1)
    stub_triton()
    print(f"Python side of a CUDA call's launches (launcher + launches, no driver), triton "
          f"{triton.__version__}, torch {torch.__version__}, best of {REPEATS} x {CALLS} calls")
    print(f"{'op':26s} {'call':>9s} {'via Triton':>11s}   Triton's launch of each kernel")
    for name, build in LAUNCHES.items():
        call = build()
        kernels = [f"{kernel.fn.__name__} {per_call_us(lambda: kernel[grid](*args.values(), **kwargs)):.1f} us"
                   for kernel, grid, args, kwargs in record_launches(call)]
        print(f"{name:26s} {per_call_us(call):6.1f} us {through_tritons_launch(call):8.1f} us   {', '.join(kernels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
