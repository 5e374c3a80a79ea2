"""Peak memory growth of one call: on CUDA, torch.cuda.max_memory_allocated's growth; on
the CPU, the growth of the process's peak resident set size (Linux VmHWM, reset through
/proc/self/clear_refs) over the resident size before the call.

tracemalloc does not see torch's buffers; RSS does, provided the call cannot reuse pages
already resident: before that one call glibc hands its free heap pages back to the system
(malloc_trim) and is told to mmap every allocation above 64 KiB (mallopt); afterwards it
keeps buffers below 32 MiB in its heap again, and up to 64 MiB of free heap at its top (the
steady state of its default, dynamic thresholds), so timings are unaffected. With the mmap
threshold set and the trim threshold left at its initial 128 KiB, a buffer freed at the
heap's top went back to the system after every call and each call paid the page faults of
a fresh one, which made torch's baselines' times depend on what ran before them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Callable, Optional

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers in glibc's malloc.h


@functools.cache
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


def _reset_peak() -> bool:
    """Set the peak resident size (VmHWM) to the current one (VmRSS); False where
    /proc/self/clear_refs cannot be written (a PermissionError in some containers)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_cuda_growth(fn: Callable[[], object]) -> int:
    """Bytes by which CUDA's peak allocated memory grows during one call of fn.

    Args:
        fn: the call, on the current CUDA device.

    Returns:
        The growth of torch.cuda.max_memory_allocated over the memory allocated before it.
    """
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    return torch.cuda.max_memory_allocated() - before


def peak_rss_growth(fn: Callable[[], object]) -> Optional[int]:
    """Bytes by which the peak resident set size grows during one call of fn.

    Args:
        fn: the call.

    Returns:
        The growth of VmHWM over VmRSS before the call, or None where it cannot be measured
        (no Linux /proc, no glibc, or a /proc/self/clear_refs this process may not write);
        fn is not called then.
    """
    if not os.path.exists("/proc/self/clear_refs") or not _release_to_system(64 * 1024):
        return None
    try:
        if not _reset_peak():
            return None
        before = _status_bytes("VmRSS")
        fn()
        return _status_bytes("VmHWM") - before
    finally:  # glibc's steady state after large buffers: its dynamic thresholds at their top
        _glibc().mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024)
        _glibc().mallopt(_M_TRIM_THRESHOLD, 64 * 1024 * 1024)
