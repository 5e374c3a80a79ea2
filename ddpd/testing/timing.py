"""The one timer of ddpd's benchmarks.

- `median_seconds`: the median wall time of a call, each timed alone: CUDA events around it
  on a GPU, time.perf_counter on the CPU; warm-up calls first. For work of milliseconds
  or more (a sampling run, a step).
- `kernel_seconds`: the median time of a short GPU call by triton.testing.do_bench
  (warm-up, L2 flushed before each call, CUDA events); on the CPU, `median_seconds`. The
  host's work overlaps the flush there and goes unseen: for kernel time (a graph replay).
- `eager_seconds`: a normal call, host cost included: calls back to back between two
  synchronisations, by the host's clock.
- `best_per_call`: host cost, the best of several timings of many calls, of one or more
  calls timed in alternation (on a shared machine other work only adds time, so the
  minimum is the steadiest estimate of the cost itself).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch


def median_seconds(fn: Callable[[], object], cuda: bool = False, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall time of fn() over `repeats` calls, after `warmup` calls.

    Args:
        fn: the work to time, called with no arguments.
        cuda: time with CUDA events (the device synchronised before and after each call);
            else with time.perf_counter.
        repeats: timed calls (at least 1).
        warmup: untimed calls first (compilation, caches, allocator pools).

    Returns:
        Seconds, the median of the timed calls.

    Raises:
        ValueError: repeats below 1 or warmup below 0.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def kernel_seconds(fn: Callable[[], object], cuda: bool, rep_ms: int = 100) -> float:
    """Median time of a short call: triton.testing.do_bench on a GPU, else `median_seconds`.

    Args:
        fn: the call to time (a kernel launch or a few).
        cuda: whether fn runs on a CUDA device.
        rep_ms: do_bench's time budget for the timed calls, milliseconds.

    Returns:
        Seconds, the median.
    """
    if not cuda:
        return median_seconds(fn)
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") / 1e3


def eager_seconds(fn: Callable[[], object], cuda: bool, rep_ms: int = 100, repeats: int = 5) -> float:
    """Seconds per call of fn called back to back, as a loop of eager calls runs: the larger of
    its host cost and its device time (the device synchronised before the clock starts and
    before it stops; the L2 cache is not flushed between calls).

    Args:
        fn: the call to time.
        cuda: whether fn runs on a CUDA device.
        rep_ms: the time budget of the timed calls, milliseconds; sets the calls per timing.
        repeats: timings; the best is kept (`best_per_call`).

    Returns:
        Seconds per call.

    Raises:
        ValueError: rep_ms or repeats below 1.
    """
    if rep_ms < 1 or repeats < 1:
        raise ValueError(f"rep_ms and repeats must be >= 1, got rep_ms={rep_ms}, repeats={repeats}")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    once = best_per_call(fn, calls=1, repeats=1, warmup=3, sync=sync)[0]
    calls = max(1, min(1000, int(rep_ms / 1e3 / repeats / max(once, 1e-9))))
    return best_per_call(fn, calls=calls, repeats=repeats, warmup=0, sync=sync)[0]


def best_per_call(*fns: Callable[[], object], calls: int, repeats: int, warmup: int = 20,
                  sync: Optional[Callable[[], None]] = None) -> list[float]:
    """Seconds per call of each fn: the best of `repeats` timings of `calls` calls, the fns
    timed in alternation so that all see the same load.

    Args:
        *fns: the calls to time.
        calls: calls per timing.
        repeats: timings of each fn; the minimum is kept.
        warmup: untimed calls of each fn first.
        sync: called after each timing's calls (torch.cuda.synchronize for CUDA work).

    Returns:
        Seconds per call of each fn, in the order given.

    Raises:
        ValueError: calls or repeats below 1.
    """
    if calls < 1 or repeats < 1:
        raise ValueError(f"calls and repeats must be >= 1, got calls={calls}, repeats={repeats}")
    sync = sync or (lambda: None)
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            best[i] = min(best[i], (time.perf_counter() - start) / calls)
    return best
