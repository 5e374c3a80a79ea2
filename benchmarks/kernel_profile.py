"""One call of each kernel whose GPU time the benchmarks leave unexplained, for Nsight
Compute to read its hardware counters (memory throughput against the device's peak,
occupancy, where the warps stall):

- sample_categorical at 64 and 1024 rows of GPT-2's vocabulary, bf16: the draw runs
  at several times one read of the logits (docs/performance.md);
- the same 64 rows with top_p = 0.9 at temperature 0.8: the threshold search;
- sample_from_hidden at N 64, H 4096, V 128256, bf16: above one read of W (docs/performance.md).

    python benchmarks/kernel_profile.py --ncu

runs this script under `ncu --clock-control none --profile-from-start off` with the
SpeedOfLight, Occupancy and WarpStateStats sections (Nsight Compute: the device's clocks
left alone), or says that ncu is not installed. Each call runs twice first (Triton
compiles its kernels then), and only the third, between cudaProfilerStart and
cudaProfilerStop, is profiled. benchmarks/gpu_check.sh runs this. `--dry-run` makes the
same calls on small CPU tensors, without a profiler (a check of the script).
"""
from __future__ import annotations

import argparse
import glob
import shutil
import subprocess
import sys
from typing import Callable, Optional

import torch

from ddpd.ops.sample_categorical import sample_categorical
from ddpd.ops.sample_from_hidden import sample_from_hidden

GPT2, LLAMA3 = 50257, 128256


def cases(device: str, small: bool) -> dict[str, Callable[[], object]]:
    """name -> a call, on tensors made once (small: shapes a CPU runs in a moment)."""
    g = torch.Generator().manual_seed(0)
    rows64, rows1024, vocab, width, big_vocab = (4, 8, 700, 64, 900) if small else (64, 1024, GPT2, 4096, LLAMA3)
    dtype = torch.float32 if small else torch.bfloat16  # the CPU kernels draw from float32 logits fastest

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(device=device, dtype=dtype)

    logits64, logits1024 = randn(rows64, vocab, scale=3.0), randn(rows1024, vocab, scale=3.0)
    hidden, weight = randn(rows64, width), randn(big_vocab, width, scale=2 / width**0.5)
    return {
        f"sample_categorical {rows64} x {vocab}": lambda: sample_categorical(logits64, seed=1, offset=2),
        f"sample_categorical {rows1024} x {vocab}": lambda: sample_categorical(logits1024, seed=1, offset=2),
        f"sample_categorical top_p 0.9 {rows64} x {vocab}": lambda: sample_categorical(logits64, 0.8, top_p=0.9,
                                                                                       seed=1, offset=2),
        f"sample_from_hidden {rows64} x {width} -> {big_vocab}": lambda: sample_from_hidden(hidden, weight, None,
                                                                                          seed=1, offset=2),
    }


def find_ncu() -> Optional[str]:
    """Nsight Compute's command line: on PATH, or where CUDA's installers put it."""
    found = [shutil.which("ncu")] + sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True) + \
        sorted(glob.glob("/usr/local/cuda*/bin/ncu"), reverse=True)
    return next((path for path in found if path), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="small CPU tensors, no profiler")
    parser.add_argument("--ncu", action="store_true", help="run this script under Nsight Compute")
    args = parser.parse_args()
    if args.ncu and not args.dry_run:
        ncu = find_ncu()
        if ncu is None:
            print("kernel_profile: Nsight Compute (ncu) is not installed here: no profile")
            return 0
        return subprocess.call([ncu, "--clock-control", "none", "--profile-from-start", "off", "--section",
                                "SpeedOfLight", "--section", "Occupancy", "--section", "WarpStateStats",
                                sys.executable, __file__])
    if not args.dry_run and not torch.cuda.is_available():
        print("kernel_profile: no CUDA device visible to torch (--dry-run checks this script)", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    table = cases(device, small=args.dry_run)
    for call in table.values():  # compile every kernel before the profiled range
        call()
        call()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    for name, call in table.items():
        print(f"{'profiled' if device == 'cuda' else 'called'}: {name}", flush=True)
        if device == "cuda":
            torch.cuda.profiler.start()
        call()
        sync()
        if device == "cuda":
            torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
