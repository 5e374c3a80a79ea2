"""Benchmark results as machine-readable rows: one JSON object a line, one file a device,
benchmarks/results/<device>.jsonl (the latest rows of that device; history is in git).

A row compares ddpd's op (or sampler) with one baseline timed in the same run:

    op, shape, dtype, params   what was timed ("params": truncation, k, ...; "" if none)
    device                     the device's name (torch's, or the CPU's model and count)
    mode                       "eager" (a normal call) or "graph" (a CUDA-graph replay)
    commit, sources            git commit (with "+" when files differ from it) and the hash
                               of the sources that `benchmarks/gpu_check.sh --tree-hash` prints
    median                     ddpd's median, seconds
    baseline, baseline_median  the baseline's name ("torch: ..." for plain torch code, or
                               "reference") and its median, seconds
    ratio                      baseline_median / median: ddpd's speed-up (below 1: slower)
    date, source               UTC date of the run, and the benchmark that timed it

`merge` writes a run's rows into a device's file, replacing the rows of the same cases (on the
same device, by the same benchmark and so the same timer) and keeping the others, so a run of
a few benchmarks updates only what it measured.
benchmarks/report.py makes docs/performance.md's tables from these files.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIELDS = ("op", "shape", "dtype", "params", "device", "mode", "commit", "sources", "median", "baseline",
          "baseline_median", "ratio", "date", "source")
# what a row measured: a run that measures a case replaces every earlier row of it, whatever their
# baselines; the device, and the benchmark (its timer), are part of the case
CASE = ("op", "shape", "dtype", "params", "device", "mode", "source")
HASHED = ("ddpd", "kernels", "csrc", "benchmarks", "tests")
HASHED_SUFFIXES = (".py", ".cpp", ".cu", ".h", ".sh")


def device_name(device: str = "cpu") -> str:
    """A device's name: torch's for a CUDA device, 'CPU <model> <n>vCPU' for the CPU."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {model} {os.cpu_count()}vCPU"


def slug(name: str) -> str:
    """A device's name as a file name: 'NVIDIA H200' -> 'nvidia-h200' (as gpu_check.sh names it)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def rows_path(device: str = "cpu") -> Path:
    """benchmarks/results/<device>.jsonl of a device ('cpu', 'cuda', 'cuda:1')."""
    return rows_file(device_name(device))


def rows_file(name: str) -> Path:
    """benchmarks/results/<device>.jsonl of a device's name (device_name)."""
    return RESULTS / f"{slug(name)}.jsonl"


def source_hash(root: Path = ROOT) -> str:
    """The first 12 hex digits of a sha1 over `sha1sum`-style lines for every source file of
    HASHED, in byte order of their paths (what benchmarks/gpu_check.sh --tree-hash prints)."""
    paths = sorted(str(path.relative_to(root)) for part in HASHED if (root / part).is_dir()
                   for path in (root / part).rglob("*")
                   if path.is_file() and path.suffix in HASHED_SUFFIXES and "__pycache__" not in path.parts)
    lines = "".join(f"{hashlib.sha1((root / path).read_bytes()).hexdigest()}  {path}\n"
                    for path in sorted(paths, key=os.fsencode))
    return hashlib.sha1(lines.encode()).hexdigest()[:12]


def commit(root: Path = ROOT) -> str:
    """The short hash of HEAD, with '+' when the working tree differs from it; 'unknown'
    outside a git checkout."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=root, capture_output=True).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+" if dirty else "")


def row(op: str, shape: Iterable[int], dtype: str, median: float, baseline: str, baseline_median: float, *,
        params: str = "", mode: str = "eager", device: str, source: str, stamp: dict) -> dict:
    """One row (the module docstring says what each field holds). stamp: commit, sources and
    date, computed once a run (make_stamp())."""
    return dict(op=op, shape=list(shape), dtype=dtype, params=params, device=device, mode=mode,
                **stamp, median=_digits(median), baseline=baseline,
                baseline_median=_digits(baseline_median), ratio=_digits(baseline_median / median), source=source)


def _digits(value: float) -> float:
    """Six significant digits: more than any timing here resolves."""
    return float(f"{value:.6g}")


def make_stamp() -> dict:
    """commit, sources and date of this run."""
    return dict(commit=commit(), sources=source_hash(),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))


def read(path: Path) -> list[dict]:
    """The rows of a file (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def case(r: dict) -> tuple:
    """The case a row measured (CASE's fields)."""
    return tuple(json.dumps(r.get(field)) for field in CASE)


def merge(path: Path, new: list[dict]) -> int:
    """Write new rows into path, replacing every row of the cases they measured (a baseline
    renamed or dropped since leaves no stale row); the number of rows written. The file is
    replaced whole (written to a temporary name, then renamed)."""
    if not new:
        return 0
    fresh = {case(r) for r in new}
    kept = [r for r in read(path) if case(r) not in fresh]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text("".join(json.dumps({f: r.get(f) for f in FIELDS}) + "\n" for r in kept + new))
    temporary.replace(path)
    return len(new)


if __name__ == "__main__":  # benchmarks/gpu_check.sh --tree-hash
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree-hash", action="store_true", required=True,
                        help="print the hash of the sources that the results rows name")
    parser.parse_args()
    print(source_hash())
