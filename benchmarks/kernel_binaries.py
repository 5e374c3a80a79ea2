"""The sm_90 binaries of the Triton launches the ops make, compiled here without a GPU,
and what their loops execute (ddpd.testing.sm90).

For every kernel of every case (ddpd.testing.sm90.CASES: the launches at the benchmark
shapes) it prints the registers and stack (cuobjdump) and, for each loop of the SASS (a
backward branch and the code it jumps over), its length in instructions and the barriers
(BAR), shared-memory accesses (LDS, STS), shuffles (SHFL), global loads (LDG; in brackets
those of 16 bytes a lane) and special-function operations (MUFU: exp2, reciprocals) in it:
what a kernel does a block, read where no GPU can time it.

    python benchmarks/kernel_binaries.py                  # every case
    python benchmarks/kernel_binaries.py --case top-p     # the cases whose names hold it

It refuses to run under TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from ddpd.testing.launches import record_launches
from ddpd.testing.sm90 import CASES, COUNTED, answer_as_h100, compile_launch, cuobjdump, loops, resources


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="", help="only the cases whose names contain this (a string no "
                                                   "case's name contains is refused)")
    only = parser.parse_args().case
    if not any(only in case for case in CASES):  # a misspelt case compiled nothing and exited 0
        print(f"kernel_binaries: --case {only!r} is in no case's name; the cases: {'; '.join(CASES)}",
              file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes"):
        print("kernel_binaries: unset TRITON_INTERPRET (the interpreter compiles nothing)", file=sys.stderr)
        return 2
    import triton

    answer_as_h100()
    print(f"sm_90 binaries, triton {triton.__version__}, torch {torch.__version__}; loops innermost first, "
          f"each: first-last address, instructions, {', '.join(COUNTED)} (LDG: in brackets those of 16 bytes)")
    for case, make in CASES.items():
        if only not in case:
            continue
        for kernel, grid, args, kwargs in record_launches(make()):
            compiled = compile_launch(kernel, args, dict(kwargs))
            print(f"{case}: {kernel.fn.__name__} grid {tuple(grid)} {resources(compiled)}")
            for loop in loops(cuobjdump(compiled, "-sass")):
                counts = " ".join(f"{name} {loop[name]}" + (f" ({loop['vector']})" if name == "LDG" else "")
                                  for name in COUNTED)
                print(f"  loop {loop['first']:#06x}-{loop['last']:#06x}: {loop['instructions']:5d} instructions, "
                      f"{counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
