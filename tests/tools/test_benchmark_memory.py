"""ddpd/testing/memory.py, the benchmarks' peak-memory probe: /proc, glibc and the CUDA
allocator are simulated, but for two checks on the real process's resident memory."""
import io

import pytest
import torch

from ddpd.testing import memory

MIB = 2**20


class FakeLibc:
    """glibc's mallopt and malloc_trim, recording each call."""

    def __init__(self):
        self.calls = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


class FakeProc:
    """/proc/self/status and /proc/self/clear_refs: writing "5" to clear_refs sets the peak
    (VmHWM) to the current resident size (VmRSS); `grow` is a call's resident growth."""

    def __init__(self, rss_kb: int, hwm_kb: int):
        self.rss_kb, self.hwm_kb = rss_kb, hwm_kb
        self.written = []

    def grow(self, kb: int) -> None:
        self.rss_kb += kb
        self.hwm_kb = max(self.hwm_kb, self.rss_kb)

    def open(self, path, mode="r"):
        if path == "/proc/self/clear_refs":
            proc = self

            class ClearRefs(io.StringIO):
                def close(self):
                    proc.written.append(self.getvalue())
                    if self.getvalue() == "5":
                        proc.hwm_kb = proc.rss_kb
                    super().close()

            return ClearRefs()
        assert path == "/proc/self/status" and mode == "r"
        return io.StringIO(f"Name:\tpython\nVmPeak:\t  999999 kB\nVmHWM:\t  {self.hwm_kb} kB\n"
                           f"VmRSS:\t  {self.rss_kb} kB\nThreads:\t2\n")


@pytest.fixture
def libc(monkeypatch):
    fake = FakeLibc()
    monkeypatch.setattr(memory, "_glibc", lambda: fake)
    return fake


@pytest.fixture
def proc(monkeypatch):
    fake = FakeProc(rss_kb=1000, hwm_kb=50000)
    monkeypatch.setattr(memory, "open", fake.open, raising=False)
    monkeypatch.setattr(memory.os.path, "exists", lambda path: path == "/proc/self/clear_refs")
    return fake


def test_status_bytes_reads_a_field_in_bytes(proc):
    assert memory._status_bytes("VmRSS") == 1000 * 1024 and memory._status_bytes("VmHWM") == 50000 * 1024


def test_status_bytes_matches_the_whole_field_name(proc):
    """"Vm" is no field, though "VmPeak" and "VmHWM" begin with it."""
    with pytest.raises(RuntimeError, match="Vm missing from /proc/self/status"):
        memory._status_bytes("Vm")


def test_release_to_system_sets_the_mmap_threshold_and_trims_the_heap(libc):
    assert memory._release_to_system(4096) is True
    assert libc.calls == [("mallopt", memory._M_MMAP_THRESHOLD, 4096), ("malloc_trim", 0)]


def test_release_to_system_without_glibc_is_false(monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    assert memory._release_to_system(4096) is False


def test_glibc_is_none_where_no_c_library_is_found(monkeypatch):
    asked = []
    monkeypatch.setattr(memory.ctypes.util, "find_library", lambda name: asked.append(name))
    memory._glibc.cache_clear()
    try:
        assert memory._glibc() is None and asked == ["c"]
    finally:
        memory._glibc.cache_clear()


class TrimOnly:
    """A C library with malloc_trim but no mallopt."""

    def malloc_trim(self, pad: int) -> int:
        return 1


class MalloptOnly:
    """A C library with mallopt but no malloc_trim."""

    def mallopt(self, param: int, value: int) -> int:
        return 1


@pytest.mark.parametrize("library", [object, TrimOnly, MalloptOnly])
def test_glibc_is_none_for_a_c_library_without_mallopt_and_malloc_trim(monkeypatch, library):
    monkeypatch.setattr(memory.ctypes.util, "find_library", lambda name: "libc-like")
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: library())
    memory._glibc.cache_clear()
    try:
        assert memory._glibc() is None
    finally:
        memory._glibc.cache_clear()


def test_peak_rss_growth_is_the_peak_over_the_resident_size_before_the_call(libc, proc):
    """The earlier peak (50000 kB) is reset to the resident size first; the call peaks 300 kB
    above it and frees 200 kB of that before it returns."""
    def fn():
        proc.grow(300)
        proc.grow(-200)

    assert memory.peak_rss_growth(fn) == 300 * 1024 and proc.written == ["5"]


def test_peak_rss_growth_mmaps_above_64_kib_during_the_call_and_restores_the_thresholds(libc, proc):
    seen = []
    memory.peak_rss_growth(lambda: seen.extend(libc.calls))
    assert seen == [("mallopt", memory._M_MMAP_THRESHOLD, 64 * 1024), ("malloc_trim", 0)]
    assert libc.calls[2:] == [("mallopt", memory._M_MMAP_THRESHOLD, 32 * MIB),
                              ("mallopt", memory._M_TRIM_THRESHOLD, 64 * MIB)]


def test_peak_rss_growth_restores_the_thresholds_when_the_call_raises(libc, proc):
    def fn():
        raise KeyError("boom")

    with pytest.raises(KeyError):
        memory.peak_rss_growth(fn)
    assert libc.calls[-2:] == [("mallopt", -3, 32 * MIB), ("mallopt", -1, 64 * MIB)]


def test_peak_rss_growth_is_none_and_restores_the_thresholds_when_the_peak_cannot_be_reset(libc, proc,
                                                                                          monkeypatch):
    """A /proc/self/clear_refs this process may not write (some containers): no measurement,
    the call never runs, and glibc's thresholds are restored all the same."""
    def open_(path, mode="r"):
        if path == "/proc/self/clear_refs":
            raise PermissionError(path)
        return proc.open(path, mode)

    monkeypatch.setattr(memory, "open", open_, raising=False)
    ran = []
    assert memory.peak_rss_growth(lambda: ran.append(1)) is None
    assert ran == [] and libc.calls[-2:] == [("mallopt", -3, 32 * MIB), ("mallopt", -1, 64 * MIB)]


def test_peak_rss_growth_is_none_without_proc(libc, proc, monkeypatch):
    monkeypatch.setattr(memory.os.path, "exists", lambda path: False)
    ran = []
    assert memory.peak_rss_growth(lambda: ran.append(1)) is None and ran == [] and libc.calls == []


def test_peak_rss_growth_is_none_without_glibc(proc, monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    ran = []
    assert memory.peak_rss_growth(lambda: ran.append(1)) is None and ran == [] and proc.written == []


def test_peak_cuda_growth_is_the_peak_allocated_over_the_allocated_before(monkeypatch):
    """The allocator holds 100 bytes, its peak so far 900; the call allocates 50 more, peaking
    at 170, and the peak is reset after the device is synchronised and before the call."""
    state = {"allocated": 100, "peak": 900}
    events = []

    def reset():
        events.append("reset")
        state["peak"] = state["allocated"]

    def fn():
        events.append("call")
        state["allocated"] += 70
        state["peak"] = max(state["peak"], state["allocated"])
        state["allocated"] -= 20

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: state["peak"])
    assert memory.peak_cuda_growth(fn) == 70 and events == ["sync", "reset", "call"]


def test_peak_rss_growth_sees_a_buffer_the_call_fills():
    growth = memory.peak_rss_growth(lambda: torch.ones(16 * MIB).sum())  # 64 MiB of float32
    if growth is None:
        pytest.skip("needs Linux /proc and glibc")
    assert growth >= 48 * MIB


def test_peak_rss_growth_forgets_the_peak_of_earlier_work():
    buffer = torch.ones(64 * MIB)  # 256 MiB, resident then freed
    del buffer
    growth = memory.peak_rss_growth(lambda: None)
    if growth is None:
        pytest.skip("needs Linux /proc and glibc")
    assert growth < 32 * MIB
