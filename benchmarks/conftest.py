"""Shared helpers of the ddpd benchmarks (`pytest benchmarks/ --benchmark-only`).

`compare(group, variant, fn, device)` times fn with pytest-benchmark under `group`
(on CUDA each call ends with a synchronize), measures the peak memory of one call,
and records both; `versus(group, name, fn, ..., baselines=...)` times ddpd's op against
baselines timed earlier in the group and prints the ratios. At the end of the session
a table gives, per group, every variant's median time (and peak memory, for compare)
and the speed-up of ddpd's op ('fused', or the name given to versus with baselines)
over each other variant, then names the fastest torch code of the group (the variants
named "torch: ...") and ddpd's ratio against it; all timed in the same run on the
same machine.

Threads: every variant runs with DDPD_BENCH_THREADS torch threads (default 1):
on a machine shared with other work, OpenMP regions of several threads wait on
descheduled threads and the timings stop meaning anything.

Peak memory on CUDA: torch.cuda.max_memory_allocated growth during one call.
Peak memory on CPU: growth of the process's peak resident set size (Linux VmHWM, reset
through /proc/self/clear_refs) during one call, over the resident size before it.
tracemalloc does not see torch's buffers; RSS does, provided the call cannot reuse
pages already resident: before that one call glibc hands its free heap pages back
to the system (malloc_trim) and is told to mmap every allocation above 64 KiB
(mallopt); afterwards it keeps buffers below 32 MiB in its heap again, and up to 64 MiB of
free heap at its top (the steady state of its default, dynamic thresholds), so timings are
unaffected. (With the mmap threshold set and the trim threshold left at its initial 128 KiB,
a buffer freed at the heap's top went back to the system after every call, and each call
paid the page faults of a fresh one: torch's 64 x 50257 inverse CDF took 8 or 24 ms
depending on what ran before it in the process, results/cpu-amd-epyc-2vcpu-2026-11-28-tile-
sums-unsteady-malloc.txt.)
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Callable, Optional

import pytest
import torch

from torch_draws import TORCH  # the prefix of the variants that are plain torch code for the same job

THREADS = int(os.environ.get("DDPD_BENCH_THREADS", "1"))
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers in glibc's malloc.h
_results: dict[str, dict[str, tuple[Optional[float], Optional[int]]]] = {}
_versus_stats: dict = {}  # (group, name) -> pytest-benchmark stats, for `versus`
_ours: dict[str, str] = {}  # group -> the name of ddpd's variant, where it is not "fused"


def _glibc():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def _release_to_system(mmap_threshold: int) -> bool:
    """mmap allocations above mmap_threshold, and hand every free heap page back to
    the system, so that memory a call touches shows in its RSS; False without glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    libc.malloc_trim(0)
    return True


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} missing from /proc/self/status")


def peak_cuda_growth(fn: Callable[[], object]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    return torch.cuda.max_memory_allocated() - before


def peak_rss_growth(fn: Callable[[], object]) -> Optional[int]:
    """Bytes by which the peak resident set size grows during one call of fn, or
    None where it cannot be measured (no Linux /proc, no glibc)."""
    if not os.path.exists("/proc/self/clear_refs") or not _release_to_system(64 * 1024):
        return None
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # peak RSS := current RSS
        before = _status_bytes("VmRSS")
        fn()
        return _status_bytes("VmHWM") - before
    finally:  # glibc's steady state after large buffers: its dynamic thresholds at their top
        _glibc().mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024)
        _glibc().mallopt(_M_TRIM_THRESHOLD, 64 * 1024 * 1024)


@pytest.fixture
def compare(benchmark):
    """compare(group, variant, fn, device="cpu", rounds=None): time fn (rounds: a
    fixed number of rounds for slow work), measure its peak memory, record both."""

    def run(group: str, variant: str, fn: Callable[[], object], device: str = "cpu",
            rounds: Optional[int] = None) -> None:
        if device == "cuda":
            work = fn

            def fn():
                work()
                torch.cuda.synchronize()

            group = f"{group} cuda"
        benchmark.group = group
        benchmark.extra_info["variant"] = variant
        benchmark.extra_info["threads"] = THREADS
        threads = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            if rounds is None:
                benchmark(fn)
            else:
                benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)
            peak = peak_cuda_growth(fn) if device == "cuda" else peak_rss_growth(fn)
        finally:
            torch.set_num_threads(threads)
        if peak is not None:
            benchmark.extra_info["peak_memory_growth_mib"] = round(peak / 2**20, 2)
        stats = getattr(benchmark, "stats", None)
        median = stats.stats.median if stats is not None else None
        _results.setdefault(group, {})[variant] = (median, peak)

    return run


@pytest.fixture
def versus(benchmark, capsys):
    """versus(group, name, fn, *args, baselines=(), **kwargs): time fn(*args, **kwargs)
    under `group` as `name`, then print its speed-up over each of `baselines` (names
    timed earlier in the same group, same run): the ratio of medians, and of
    minimums, which a machine shared with other jobs disturbs least. Like compare,
    it runs fn with DDPD_BENCH_THREADS torch threads. Under --benchmark-disable fn
    runs once and nothing is recorded."""

    def run(group: str, name: str, fn: Callable, *args, baselines: tuple = (), **kwargs) -> None:
        benchmark.group = group
        benchmark.extra_info["threads"] = THREADS
        threads = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            benchmark(fn, *args, **kwargs)
        finally:
            torch.set_num_threads(threads)
        stats = getattr(benchmark, "stats", None)  # None under --benchmark-disable: nothing timed
        if stats is None:
            return
        _versus_stats[(group, name)] = ours = stats.stats
        _results.setdefault(group, {})[name] = (ours.median, None)
        if baselines:
            _ours[group] = name
        for baseline in baselines:
            theirs = _versus_stats.get((group, baseline))
            if theirs is None:
                continue
            with capsys.disabled():
                print(f"\n[{group}] {name} vs {baseline}: {theirs.median / ours.median:.2f}x (median "
                      f"{ours.median * 1e3:.3f} vs {theirs.median * 1e3:.3f} ms), "
                      f"{theirs.min / ours.min:.2f}x (min {ours.min * 1e3:.3f} vs {theirs.min * 1e3:.3f} ms), "
                      f"{THREADS} torch threads")

    return run


def _mib(peak: Optional[int]) -> str:
    return "n/a" if peak is None else f"{peak / 2**20:.1f} MiB"


def _ratio(theirs: Optional[float], ours: Optional[float]) -> str:
    if not theirs or not ours:
        return ""
    return f"{theirs / ours:.2f}x faster" if theirs >= ours else f"{ours / theirs:.2f}x SLOWER"


def pytest_terminal_summary(terminalreporter):
    if not _results:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"ddpd against plain torch ({THREADS} torch threads, same run)")
    for group, variants in _results.items():
        name = _ours.get(group, "fused")
        ours = variants.get(name, (None, None))[0]
        width = max(10, *map(len, variants))
        write(group)
        for variant, (median, peak) in variants.items():
            line = f"  {variant:{width}s} median {'n/a' if median is None else f'{median * 1e3:10.3f} ms'}"
            line += "" if peak is None else f"  peak memory +{_mib(peak)}"
            if variant != name and median and ours:
                line += f"  {name} is {_ratio(median, ours)}"
            write(line)
        timed = {v: m for v, (m, _) in variants.items() if v.startswith(TORCH) and m}
        if timed and ours:
            fastest = min(timed, key=timed.get)
            write(f"  => fastest torch code: {fastest[len(TORCH):]} ({timed[fastest] * 1e3:.3f} ms); "
                  f"{name} is {_ratio(timed[fastest], ours)} than it")
