"""The harness of the ddpd benchmarks (`pytest benchmarks/ --benchmark-only`).

`compare(op, shape, variant, fn, dtype=..., params=..., device=..., rounds=...)` times fn with
pytest-benchmark (on CUDA each call ends with a synchronize), measures the peak memory of one
call (ddpd.testing.memory) and records both under the case (op, shape, dtype, params). The
variants of a case: "fused" (ddpd's op or sampler), "reference" (its torch reference), "torch:
..." (plain torch code for the same job, ddpd.testing.baselines), "related: ..." (torch code
for a related but different job, shown apart) and any other name. At the end of the session a
table gives, per case, every variant's median (and peak memory) and fused's speed-up over each,
then names the fastest torch code and fused's ratio against it; all timed in the same run on
the same machine. The same comparisons are written as rows (benchmarks/rows.py) into --rows, by
default benchmarks/results/<device>.jsonl, from which benchmarks/report.py makes the tables of
docs/performance.md. Nothing is written under --benchmark-disable (nothing is timed).

Threads: every variant runs with DDPD_BENCH_THREADS torch threads (default 1): on a
machine shared with other work, OpenMP regions of several threads wait on descheduled
threads and the timings stop meaning anything.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

import rows as result_rows
from ddpd.testing.baselines import RELATED, TORCH  # variants' prefixes: torch code for the same job, another
from ddpd.testing.memory import peak_cuda_growth, peak_rss_growth

THREADS = int(os.environ.get("DDPD_BENCH_THREADS", "1"))
OURS = "fused"  # the variant that is ddpd's op (or sampler)
# case (op, shape, dtype, params, device) -> variant -> (median seconds or None, peak bytes or None, source)
_results: dict[tuple, dict[str, tuple[Optional[float], Optional[int], str]]] = {}


def pytest_addoption(parser):
    parser.addoption("--rows", default=None, metavar="PATH",
                     help="where the run's rows go (benchmarks/rows.py; default "
                          "benchmarks/results/<device>.jsonl, '' for nowhere)")


def shape_text(shape: Iterable[int]) -> str:
    return "x".join(map(str, shape))


def case_title(case: tuple) -> str:
    op, shape, dtype, params, device = case
    return " ".join(part for part in (op, shape_text(shape), dtype, params, "cuda" if device == "cuda" else "")
                    if part)


@pytest.fixture
def compare(benchmark, request):
    """compare(op, shape, variant, fn, dtype="float32", params="", device="cpu", rounds=None):
    time fn under the case (rounds: a fixed number of rounds, for slow work), measure its
    peak memory, record both."""

    def run(op: str, shape: Iterable[int], variant: str, fn: Callable[[], object], dtype: str = "float32",
            params: str = "", device: str = "cpu", rounds: Optional[int] = None) -> None:
        if device == "cuda":
            work = fn

            def fn():
                work()
                torch.cuda.synchronize()

        case = (op, tuple(shape), dtype, params, device)
        benchmark.group = case_title(case)
        benchmark.extra_info["variant"] = variant
        benchmark.extra_info["threads"] = THREADS
        threads = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            if rounds is None:
                benchmark(fn)
            else:
                benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)
            stats = getattr(benchmark, "stats", None)  # None under --benchmark-disable: nothing timed
            peak = None
            if stats is not None:
                peak = peak_cuda_growth(fn) if device == "cuda" else peak_rss_growth(fn)
        finally:
            torch.set_num_threads(threads)
        if peak is not None:
            benchmark.extra_info["peak_memory_growth_mib"] = round(peak / 2**20, 2)
        median = stats.stats.median if stats is not None else None
        _results.setdefault(case, {})[variant] = (median, peak, request.node.path.name)

    return run


def _mib(peak: Optional[int]) -> str:
    return "n/a" if peak is None else f"{peak / 2**20:.1f} MiB"


def _ratio(theirs: Optional[float], ours: Optional[float]) -> str:
    if not theirs or not ours:
        return ""
    return f"{theirs / ours:.2f}x faster" if theirs >= ours else f"{ours / theirs:.2f}x SLOWER"


def rows() -> list[dict]:
    """The session's comparisons as rows: fused against every other variant of its case."""
    stamp, names, out = None, {}, []
    for case, variants in _results.items():
        op, shape, dtype, params, device = case
        ours = variants.get(OURS, (None, None, ""))
        if not ours[0]:
            continue
        stamp = stamp or result_rows.make_stamp()
        name = names.setdefault(device, result_rows.device_name(device))
        for variant, (median, _, _) in variants.items():
            if variant != OURS and median:
                out.append(result_rows.row(op, shape, dtype, ours[0], variant, median, params=params, device=name,
                                           source=f"benchmarks/{ours[2]}", stamp=stamp))
    return out


def pytest_terminal_summary(terminalreporter, config):
    if not _results:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"ddpd against plain torch ({THREADS} torch threads, same run)")
    for case, variants in _results.items():
        ours = variants.get(OURS, (None, None, ""))[0]
        width = max(10, *map(len, variants))
        write(case_title(case))
        for variant, (median, peak, _) in variants.items():
            line = f"  {variant:{width}s} median {'n/a' if median is None else f'{median * 1e3:10.3f} ms'}"
            line += "" if peak is None else f"  peak memory +{_mib(peak)}"
            if variant != OURS and median and ours:
                line += f"  {OURS} is {_ratio(median, ours)}"
            write(line)
        timed = {v: m for v, (m, _, _) in variants.items() if v.startswith(TORCH) and m}
        if timed and ours:
            fastest = min(timed, key=timed.get)
            write(f"  => fastest torch code: {fastest[len(TORCH):]} ({timed[fastest] * 1e3:.3f} ms); "
                  f"{OURS} is {_ratio(timed[fastest], ours)} than it")
        for variant, (median, _, _) in variants.items():
            if variant.startswith(RELATED) and median and ours:
                write(f"  => related code, another job: {variant[len(RELATED):]}; {OURS} is {_ratio(median, ours)} "
                      "than it")
    found = rows()
    target = config.getoption("--rows")
    if found and target != "":
        by_device: dict[Path, list[dict]] = {}
        for r in found:
            path = Path(target) if target else result_rows.rows_file(r["device"])
            by_device.setdefault(path, []).append(r)
        for path, device_rows in by_device.items():
            write(f"{result_rows.merge(path, device_rows)} rows written to {path}")
