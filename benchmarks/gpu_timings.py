"""Timings of every ddpd op and of the fused sampler step on one GPU (step 3 of
benchmarks/gpu_check.sh).

Per op and shape, on the device:
- check: the op draws what its torch reference draws for the same seed (integer
  and boolean outputs equal, float outputs to 1e-4), so the kernel timed is a
  kernel tested on this device;
- sample_categorical, sample_from_hidden, multinomial (GPT-2 and Llama-3 vocabularies):
  the time a call of a normal call ("eager", what a user sees: host cost included; calls
  back to back between two synchronisations, ddpd.testing.timing.eager_seconds) and the
  median of a CUDA-graph replay of the same call ("graph", kernel time only;
  triton.testing.do_bench: warm-up, L2 flushed before each call, CUDA events), for ddpd
  and for each torch candidate for the same job (ddpd.testing.baselines: softmax +
  torch.multinomial, Gumbel-argmax, inverse CDF; the same after a cuBLAS matmul;
  torch.multinomial, inverse CDF, Gumbel-top-k; truncation by masking all V logits or
  among the kept tokens only), the speed-ups against the fastest of them, one read of the
  input at the measured copy bandwidth, and ddpd's host cost that the device's work does
  not hide (eager - graph); the targets are printed beside;
- sample_from_hidden's GEMM and sample_categorical under a few launch configurations
  (to tune head_launch and categorical_launch);
- rotary, the networks' position rotation, against the torch code it replaces, at the
  shapes of the sampling benchmarks (the bundled model at batches 64 and 512, the
  GPT-2-size pair); bit-for-bit equality is checked; norm, the networks' LayerNorm with
  the adaLN modulation, at the same shapes, against the torch code it replaces and
  against the shortest torch code (layer_norm in the dtype, then one addcmul); values
  within one unit of the dtype's last place are checked;
- philox_uniform, the token noise of the mask loop's draws (GPT-2's vocabulary), its Triton
  kernel against the torch Philox it replaced on CUDA, checked bit for bit;
- the other ops and the fused sampler step: ddpd against the fastest of the torch
  candidates, eager calls timed as above (the usual code it replaces and faster code for
  the same law or job, such as compact_fixed's without a host sync; for the step, the
  paper's listing and the step that applies the head only at the chosen positions, with
  each token draw), GB/s against the copy bandwidth, peak memory.

    python benchmarks/gpu_timings.py            # CUDA
    python benchmarks/gpu_timings.py --dry-run  # checks this script without a GPU
    python benchmarks/gpu_timings.py --only 'launch configurations'  # those sections only

Every comparison with the torch candidates is also written as rows (benchmarks/rows.py),
eager and graph apart, into --rows (on a GPU, by default benchmarks/results/<device>.jsonl).

--dry-run runs the same code on CPU tensors of tiny shapes with a wall-clock
timer (eager calls for a few milliseconds; no graphs) and peak RSS growth: the
numbers mean nothing. Exit status 1 when a check disagrees or a case raises; the
other cases still run.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import rows as result_rows
from bench_step import GATHERED, fused_step, reference_step, step_inputs
from ddpd.models.attention import RotaryEmbedding
from ddpd.ops import reference
from ddpd.ops.compact import compact_fixed, scatter_back
from ddpd.ops.multinomial import multinomial
from ddpd.ops.norm import norm
from ddpd.ops.planner_mask import planner_mask
from ddpd.ops.planner_select import planner_select, planner_select_mask
from ddpd.ops.rng import philox_uniform
from ddpd.ops.rotary import rotary
from ddpd.ops.sample_categorical import sample_categorical
from ddpd.ops.sample_from_hidden import sample_from_hidden
from ddpd.testing import baselines as torch_draws
from ddpd.testing.memory import peak_cuda_growth, peak_rss_growth
from ddpd.testing.timing import eager_seconds, kernel_seconds
from inputs import MASK_ID

BF16, FP32 = torch.bfloat16, torch.float32
GPT2, LLAMA3 = 50257, 128256
SHAPES = {
    "full": dict(
        # rows, vocab, dtype, controls: each truncation against the usual torch code
        controls=[(64, GPT2, BF16, "top_p"), (64, GPT2, BF16, "top_k"), (64, GPT2, BF16, "min_p"),
                  (64, GPT2, BF16, "top_k+top_p"), (64, GPT2, FP32, "top_p"), (256, LLAMA3, BF16, "top_p"),
                  (256, LLAMA3, BF16, "top_k"), (256, LLAMA3, BF16, "min_p"), (256, LLAMA3, BF16, "top_k+top_p")],
        # rows, vocab, dtype
        categorical=[(1, GPT2, FP32), (64, GPT2, FP32), (64, GPT2, BF16), (256, GPT2, BF16), (1024, GPT2, BF16),
                     (4096, 27, FP32), (64, LLAMA3, BF16)],
        hidden=[(64, 768, GPT2, BF16), (256, 768, GPT2, BF16), (64, 4096, LLAMA3, BF16), (64, 256, GPT2, FP32)],
        # head launch configurations timed at 64 x 4096 x Llama-3, the one-read-of-W target's hardest, at
        # H = 768, and with float32 operands, since multiplied as three TF32 products (tf32x3)
        hidden_configs=[(64, 4096, LLAMA3, BF16), (64, 768, GPT2, BF16), (64, 256, GPT2, FP32)],
        # 50304: GPT-2's vocabulary padded to a multiple of 64 (nanoGPT), rows 16-byte aligned
        categorical_configs=[(64, GPT2, BF16), (1024, GPT2, BF16), (1024, 50304, BF16), (64, LLAMA3, BF16)],
        planner=[(64, 1024)],  # rows, length
        step=[(64, 1024, GPT2, 256), (8, 1024, GPT2, 256)],  # B, D, V, H
        # rows, categories, k, replacement: benchmarks/bench_multinomial.py's and larger
        multinomial=[(64, GPT2, 1, True), (64, GPT2, 16, False), (64, GPT2, 16, True), (512, GPT2, 16, False),
                     (4096, 27, 16, False), (4096, 27, 1, True)],
        compact=[(256, 1024), (4096, 1024)],  # batch, length
        rotary=[(64, 4, 256, 64, BF16), (512, 4, 256, 64, BF16), (16, 12, 1024, 64, BF16)],  # B, heads, L, d
        norm=[(64, 256, 256, True, BF16), (512, 256, 256, True, BF16), (16, 1024, 768, False, BF16)],  # B, L, H
        philox=[(64, 50454), (1330, 50454)],  # rows, columns: a mask-loop chunk of GPT-2 draws
        copy_floats=2**26,
    ),
    "dry": dict(
        controls=[(4, 700, BF16, "top_p"), (3, 300, FP32, "top_k+top_p")],
        categorical=[(4, 300, BF16), (4, 300, FP32), (3, 27, FP32)],
        hidden=[(4, 32, 300, FP32), (4, 32, 300, BF16)],
        hidden_configs=[(4, 32, 300, FP32)],
        categorical_configs=[(4, 700, BF16)],
        planner=[(4, 64)],
        step=[(4, 64, 300, 32)],
        multinomial=[(4, 300, 1, True), (4, 300, 16, False), (16, 27, 16, False)],
        compact=[(16, 64)],
        rotary=[(2, 2, 16, 8, BF16)],
        norm=[(2, 16, 32, True, BF16)],
        philox=[(3, 100)],
        copy_floats=2**20,
    ),
}
STEP_TARGET = 10.0  # fused step: at least this many times faster than the paper-listing step
STEP_TARGET_SHAPE = (64, 1024, GPT2, 256)  # (B, D, V, H) where that target applies


def timed_case(op: str, shape: tuple, dtype, params: str = "") -> dict:
    """The fields that name one timed case in the results rows (its op, shape, dtype and parameters)."""
    return dict(op=op, shape=shape, dtype=str(dtype).replace("torch.", ""), params=params)


class Bench:
    """Timer, memory probe and the running tally of failed cases for one device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.failures = 0
        self.copy_gbs = float("nan")
        self.rows: list[dict] = []
        self.stamp = result_rows.make_stamp()
        self.device_name = result_rows.device_name(str(device))

    def median_ms(self, fn: Callable[[], object], rep_ms: int = 100) -> float:
        """Kernel time (do_bench on a GPU): for graph replays and the copy, not for eager calls."""
        return kernel_seconds(fn, self.cuda, rep_ms) * 1e3

    def eager_ms(self, fn: Callable[[], object], rep_ms: int = 100) -> float:
        """A normal call's time, host cost included (eager_seconds; a few ms of calls in a dry run)."""
        return eager_seconds(fn, self.cuda, rep_ms if self.cuda else 5) * 1e3

    def record(self, timed: dict, ours_ms: Optional[float], theirs: dict, mode: str,
               kind: str = torch_draws.TORCH) -> None:
        """A row per torch candidate ({label: ms}) against ours, under the case timed (timed_case);
        kind: the baseline's prefix (TORCH, or RELATED for code of another job)."""
        if ours_ms is None:
            return
        for label, ms in theirs.items():
            if ms is not None:
                self.rows.append(result_rows.row(**timed, median=ours_ms / 1e3, baseline=kind + label,
                                                 baseline_median=ms / 1e3, mode=mode, device=self.device_name,
                                                 source="benchmarks/gpu_timings.py", stamp=self.stamp))

    def peak_bytes(self, fn: Callable[[], object]) -> Optional[int]:
        return peak_cuda_growth(fn) if self.cuda else peak_rss_growth(fn)

    def gbs(self, moved: int, ms: float) -> float:
        return moved / ms / 1e6

    def check(self, name: str, got, want) -> None:
        """Print whether the op's outputs equal its reference's; count a mismatch."""
        got, want = flatten(got), flatten(want)
        problems = [problem for i, (g, w) in enumerate(zip(got, want)) if (problem := differs(i, g, w))]
        if len(got) != len(want):
            problems.append(f"{len(got)} outputs vs {len(want)}")
        if problems:
            self.failures += 1
            print(f"  check {name}: MISMATCH with the reference: {'; '.join(problems)}")
        else:
            print(f"  check {name}: same outputs as the reference")

    def check_bits(self, name: str, op: str, got: torch.Tensor, want: torch.Tensor) -> None:
        """Print whether an op that runs its reference on the CPU gave the reference's values bit
        for bit on the device; count a mismatch."""
        if not self.cuda:
            print(f"  check {name}: none (on the CPU {op} runs the reference)")
        elif not torch.equal(got, want):
            self.failures += 1
            print(f"  check {name}: MISMATCH: not the reference's values bit for bit")
        else:
            print(f"  check {name}: the reference's values bit for bit")

    def compare(self, timed: dict, name: str, ours: Callable, theirs: dict, moved: int,
                rep_ms: int = 100, related: Optional[dict] = None) -> tuple[float, dict]:
        """Time and measure ours (ddpd) and each torch candidate of theirs ({label: fn});
        print a line against the fastest, one per other candidate and one per related
        code of another job ({label: fn}: never the fastest); return our time and each
        candidate's (ms)."""
        a, peak_a = self.eager_ms(ours, rep_ms), self.peak_bytes(ours)
        times = {label: self.eager_ms(fn, rep_ms) for label, fn in theirs.items()}
        best = min(times, key=times.get)
        gbs = self.gbs(moved, a)
        print(f"{name:44s} ddpd {a * 1e3:10.1f} us | best torch ({best}) {times[best] * 1e3:10.1f} us | "
              f"{times[best] / a:7.2f}x | {moved / 1e6:8.2f} MB {gbs:7.1f} GB/s "
              f"{100 * gbs / self.copy_gbs:5.1f}% of copy | peak ddpd {mib(peak_a)} torch "
              f"{mib(self.peak_bytes(theirs[best]))}")
        for label, ms in times.items():
            if label != best:
                print(f"  also torch {label}: {ms * 1e3:10.1f} us (speed-up {ms / a:.2f}x)")
        others = {label: self.eager_ms(fn, rep_ms) for label, fn in (related or {}).items()}
        for label, ms in others.items():
            print(f"  related, another job: {label}: {ms * 1e3:10.1f} us (ratio {ms / a:.2f}x)")
        self.record(timed, a, times, "eager")
        self.record(timed, a, others, "eager", torch_draws.RELATED)
        return a, times

    def graph_ms(self, fn: Callable[[], object]) -> Optional[float]:
        """Median time of a CUDA-graph replay of fn (kernel time, no host cost); None
        where fn cannot be captured (it synchronises) or on the CPU."""
        if not self.cuda:
            return None
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
        except Exception as error:  # a synchronising op cannot be captured: report it
            print(f"  (no graph: {type(error).__name__}: {str(error).splitlines()[0][:80]})")
            torch.cuda.synchronize()
            return None
        return self.median_ms(graph.replay)

    def versus(self, timed: dict, name: str, ours: Callable, theirs: dict, read_bytes: int, read_what: str) -> None:
        """One table row: our eager time and graph-replay median, each torch candidate's,
        the ratios against the best torch code, one read of the input at the copy
        bandwidth, and our host cost not hidden by the device (eager - graph)."""
        eager, graph = self.eager_ms(ours), self.graph_ms(ours)
        rows = {label: (self.eager_ms(fn), self.graph_ms(fn)) for label, fn in theirs.items()}
        # each mode against its own fastest: a candidate's host cost can reorder them in a graph
        best_label, best_eager = fastest({label: a for label, (a, _) in rows.items()})
        graph_label, best_graph = fastest({label: b for label, (_, b) in rows.items()})
        labels = best_label if graph_label in (None, best_label) else f"{best_label} / {graph_label}"
        read_us = read_bytes / self.copy_gbs / 1e3
        us = lambda ms: "    n/a" if ms is None else f"{ms * 1e3:7.1f}"  # noqa: E731
        ratio = lambda a, b: "  n/a" if a is None or b is None else f"{b / a:5.2f}x"  # noqa: E731
        print(f"{name:40s} ddpd {us(eager)} / {us(graph)} us | best torch ({labels}) {us(best_eager)} / "
              f"{us(best_graph)} us | speed-up {ratio(eager, best_eager)} eager {ratio(graph, best_graph)} graph | "
              f"one read of {read_what} {read_us:7.1f} us, graph / read "
              f"{'n/a' if graph is None else f'{graph * 1e3 / read_us:.2f}'} | host cost "
              f"{'n/a' if graph is None else f'{(eager - graph) * 1e3:.1f} us'}")
        for label, (a, b) in rows.items():
            if label != best_label:
                print(f"  also torch {label}: {us(a)} / {us(b)} us")
        self.record(timed, eager, {label: a for label, (a, _) in rows.items()}, "eager")
        self.record(timed, graph, {label: b for label, (_, b) in rows.items()}, "graph")

    @contextlib.contextmanager
    def case(self, title: str):
        """One shape of one op: an exception is printed and counted, the next case runs."""
        try:
            yield
        except Exception:  # a broken case must not hide the results of the others
            self.failures += 1
            print(f"{title}: ERROR\n{traceback.format_exc(limit=4)}")
        finally:
            if self.cuda:
                torch.cuda.empty_cache()


def fastest(times: dict) -> tuple:
    """(label, ms) of the fastest of {label: ms or None}; (None, None) when none was timed."""
    timed = {label: ms for label, ms in times.items() if ms is not None}
    if not timed:
        return None, None
    label = min(timed, key=timed.get)
    return label, timed[label]


def flatten(outputs) -> list[torch.Tensor]:
    if outputs is None:  # a result's field not asked for
        return []
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [t for item in outputs for t in flatten(item)]


def differs(i: int, got: torch.Tensor, want: torch.Tensor) -> Optional[str]:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"output {i}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
    if got.dtype.is_floating_point:
        close = torch.isclose(got.float(), want.float(), rtol=1e-4, atol=1e-4, equal_nan=True)
        bad = int((~close).sum())
    else:
        bad = int((got != want).sum())
    return f"output {i}: {bad} of {got.numel()} differ" if bad else None


def mib(peak: Optional[int]) -> str:
    return "     n/a" if peak is None else f"{peak / 2**20:8.1f} MiB"


@contextlib.contextmanager
def section(title: str):
    print(f"# {title}")
    start = time.perf_counter()
    yield
    print(f"# {title}: {time.perf_counter() - start:.1f} s")


def randn(*shape, scale=1.0, seed=0, dtype=FP32, device="cpu") -> torch.Tensor:
    """Seeded on the CPU generator, so every device and run times the same data."""
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(device, dtype)


def copy_bandwidth(bench: Bench, floats: int) -> None:
    x = torch.empty(floats, device=bench.device)
    y = torch.empty_like(x)
    ms = bench.median_ms(lambda: y.copy_(x))
    bench.copy_gbs = bench.gbs(2 * x.numel() * x.element_size(), ms)
    print(f"copy bandwidth: {bench.copy_gbs:.0f} GB/s (a {x.numel() * 4 / 2**20:.0f} MiB copy, read + write)")


def time_sample_categorical(bench: Bench, rows: int, vocab: int, dtype: torch.dtype) -> None:
    logits = randn(rows, vocab, scale=3.0, seed=vocab, dtype=dtype, device=bench.device)
    name = f"sample_categorical ({rows}, {vocab}) {str(dtype)[6:]}"
    timed = timed_case("sample_categorical", (rows, vocab), dtype)
    bench.check(name, sample_categorical(logits, seed=1, offset=2), reference.sample_categorical(logits, seed=1,
                                                                                                 offset=2))
    bench.versus(timed, name, lambda: sample_categorical(logits, seed=1, offset=2),
                 {label: functools.partial(draw, logits) for label, draw in torch_draws.CATEGORICAL.items()},
                 logits.numel() * logits.element_size(), "the logits")
    print(f"  targets: eager >= 1.5x the best torch code; graph < 10 us at <= 64 rows (V = {GPT2}), "
          f"within 1.5x of one read at 1024 rows")


TRUNCATIONS = {"top_p": dict(top_p=0.9), "top_k": dict(top_k=50), "min_p": dict(min_p=0.05),
               "top_k+top_p": dict(top_k=50, top_p=0.9)}


def time_sample_categorical_controls(bench: Bench, rows: int, vocab: int, dtype: torch.dtype, controls: str) -> None:
    """A truncated draw of the token alone (its log-probability is checked against the
    reference's, not timed): ddpd's kernels (threshold search, tile statistics, finish)
    against the usual torch code (torch.topk / sort + cumsum + mask /
    softmax threshold over all V logits, then softmax + torch.multinomial) and the draw
    among the kept tokens only (ddpd.testing.baselines.TRUNCATED)."""
    kw = TRUNCATIONS[controls]
    logits = randn(rows, vocab, scale=3.0, seed=vocab + 1, dtype=dtype, device=bench.device)
    name = f"sample_categorical {controls} ({rows}, {vocab}) {str(dtype)[6:]}"
    timed = timed_case("sample_categorical", (rows, vocab), dtype, f"T=0.8 {controls}")
    bench.check(name, sample_categorical(logits, 0.8, seed=1, offset=2, return_logprob=True, **kw),
                reference.sample_categorical(logits, 0.8, seed=1, offset=2, return_logprob=True, **kw))
    bench.versus(timed, name, lambda: sample_categorical(logits, 0.8, seed=1, offset=2, **kw),
                 {label: functools.partial(draw, logits, 0.8, **kw) for label, draw in torch_draws.TRUNCATED.items()},
                 logits.numel() * logits.element_size(), "the logits")
    # The threshold search is one program a row looping over the row once a pass: its share
    # of the time says whether it, and not the streaming passes, needs more of the device.
    plain = lambda: sample_categorical(logits, 0.8, seed=1, offset=2)  # noqa: E731
    cut = lambda: sample_categorical(logits, 0.8, seed=1, offset=2, **kw)  # noqa: E731
    timer = bench.graph_ms if bench.cuda else bench.median_ms
    search_us = (timer(cut) - timer(plain)) * 1e3
    print(f"  target: at least 2x the usual torch code (masked V); the threshold search takes {search_us:.1f} us of it "
          "(truncated minus untruncated draw)")


def time_sample_from_hidden(bench: Bench, rows: int, width: int, vocab: int, dtype: torch.dtype) -> None:
    hidden = randn(rows, width, seed=1, dtype=dtype, device=bench.device)
    weight = randn(vocab, width, scale=2 / width**0.5, seed=2, dtype=dtype, device=bench.device)
    bias = randn(vocab, scale=0.1, seed=3, dtype=dtype, device=bench.device)
    name = f"sample_from_hidden N={rows} H={width} V={vocab} {str(dtype)[6:]}"
    timed = timed_case("sample_from_hidden", (rows, width, vocab), dtype)
    bench.check(name, sample_from_hidden(hidden, weight, bias, seed=1, offset=2),
                reference.sample_from_hidden(hidden, weight, bias, seed=1, offset=2))
    bench.versus(timed, name, lambda: sample_from_hidden(hidden, weight, bias, seed=1, offset=2),
                 {f"matmul + {label}": lambda draw=draw: draw(F.linear(hidden, weight, bias))
                  for label, draw in torch_draws.CATEGORICAL.items()},
                 weight.numel() * weight.element_size(), "W")
    print("  targets: eager >= 1.2x the best matmul + torch draw; graph within 1.5x of one read of W at N <= 64")


def time_head_configs(bench: Bench, rows: int, width: int, vocab: int, dtype: torch.dtype) -> None:
    """Graph-replay time of sample_from_hidden's GEMM under a few launch configurations
    (block rows, warps, pipeline stages), to choose head_launch's on this GPU (on CPU
    tensors the C++ path runs and the configurations change nothing)."""
    module = sys.modules["ddpd.ops.sample_from_hidden"]  # the package exports a function of that name

    hidden = randn(rows, width, seed=1, dtype=dtype, device=bench.device)
    weight = randn(vocab, width, scale=2 / width**0.5, seed=2, dtype=dtype, device=bench.device)
    default = module.head_launch
    sms = torch.cuda.get_device_properties(bench.device).multi_processor_count if bench.cuda else 4
    chosen = default(rows, width, vocab, weight.element_size(), sms)
    mine = chosen.block_n, chosen.num_warps, chosen.num_stages
    # four stages keep more of W in flight; 64 rows a block read each tile of W once
    configs = [mine, (16, 4, 3), (16, 8, 3), (32, 8, 3), (32, 4, 3), (64, 8, 3), (64, 8, 4)]
    for block_n, warps, stages in dict.fromkeys(configs):
        def launch(*args_, block_n=block_n, warps=warps, stages=stages):
            chosen = default(*args_)
            grid = (-(-rows // block_n), chosen.tiles_grid[1])
            return module.HeadLaunch(block_n, chosen.block_h, chosen.tiles_per_split, grid, chosen.finish_grid,
                                     warps, stages)

        module.head_launch = launch
        try:
            fn = lambda: sample_from_hidden(hidden, weight, None, seed=1, offset=2)  # noqa: E731
            ms = bench.graph_ms(fn) or bench.median_ms(fn)
        finally:
            module.head_launch = default
        mark = " (head_launch's)" if bench.cuda and mine == (block_n, warps, stages) else ""
        print(f"  head config N={rows} H={width} V={vocab} block_n={block_n} warps={warps} stages={stages}: "
              f"{ms * 1e3:8.1f} us{mark}")


def time_categorical_configs(bench: Bench, rows: int, vocab: int, dtype: torch.dtype) -> None:
    """Graph-replay time of sample_categorical under a few splits of its rows (programs
    per multiprocessor), chunks of tiles per load and warps a program, to choose categorical_launch's on
    this GPU (on CPU tensors the C++ path runs and the configurations change nothing)."""
    module = sys.modules["ddpd.ops.sample_categorical"]  # the package exports a function of that name
    logits = randn(rows, vocab, scale=3.0, seed=vocab, dtype=dtype, device=bench.device)
    default = module.categorical_launch
    # one warp a program: a tile of 256 is then 8 values a lane, reduced within the warp; with
    # four, rows that do not start 16-byte aligned (V = 50257 in bf16) spread each tile over
    # the four warps, and every tile's two reductions pass through shared memory and barriers
    # finish: the warps of a finish program (one a row). 32 or 16 programs a multiprocessor and 4
    # tiles a load: at 64 rows 3 or 6 tiles a program (4224 or 2112 programs, about one wave),
    # a chunk's tiles past the program's end masked off without leaving the vector loads
    for per_sm, chunk, warps, finish in [
            (8, 4, 4, 4), (32, 2, 1, 4), (64, 2, 1, 4), (64, 2, 1, 2), (64, 2, 1, 8), (64, 1, 1, 4), (128, 2, 1, 4),
            (128, 1, 1, 4), (32, 4, 1, 4), (16, 4, 1, 4), (32, 2, 2, 4)]:
        module.categorical_launch = lambda r, v, sms, per_sm=per_sm, chunk=chunk, warps=warps, finish=finish: \
            default(r, v, sms, per_sm, chunk, warps, finish_warps=finish)
        try:
            fn = lambda: sample_categorical(logits, seed=1, offset=2)  # noqa: E731
            ms = bench.graph_ms(fn) or bench.median_ms(fn)
        finally:
            module.categorical_launch = default
        mark = ""
        if bench.cuda:
            sms = torch.cuda.get_device_properties(bench.device).multi_processor_count
            if default(rows, vocab, sms) == default(rows, vocab, sms, per_sm, chunk, warps, finish_warps=finish):
                mark = " (categorical_launch's)"
        print(f"  categorical config ({rows}, {vocab}) {str(dtype)[6:]} programs/SM={per_sm} tiles/load={chunk} "
              f"warps={warps} finish warps={finish}: {ms * 1e3:8.1f} us{mark}")


def time_planner_ops(bench: Bench, rows: int, length: int) -> None:
    logits = randn(rows, length, scale=3.0, seed=length, device=bench.device)
    x = torch.randint(0, MASK_ID, (rows, length), generator=torch.Generator().manual_seed(4)).to(bench.device)
    name = f"planner_select {rows}x{length}"
    timed = timed_case("planner_select", (rows, length), FP32)
    bench.check(name, planner_select(logits, seed=1, offset=2), reference.planner_select(logits, seed=1, offset=2))
    bench.compare(timed, name, lambda: planner_select(logits, seed=1, offset=2),
                  {label: functools.partial(torch_draws.planner_select, logits, label) for label in torch_draws.SELECT},
                  logits.numel() * 4 + rows * (8 + 4 + 1))
    mask_bytes = logits.numel() * (4 + 8 + 8 + 1) + rows * 8  # logits, x in, masked and z out, count
    name = f"planner_select_mask {rows}x{length}"
    timed = timed_case("planner_select_mask", (rows, length), FP32)
    bench.check(name, planner_select_mask(logits, x, MASK_ID, seed=1, offset=2),
                reference.planner_select_mask(logits, x, MASK_ID, seed=1, offset=2))
    bench.compare(timed, name, lambda: planner_select_mask(logits, x, MASK_ID, seed=1, offset=2),
                  {label: functools.partial(torch_draws.planner_select_mask, logits, x, MASK_ID, *draws)
                   for label, draws in torch_draws.PLANNER_MASK.items()}, mask_bytes + rows * (8 + 4 + 1))
    positions = planner_select(logits, seed=5)[0]
    name = f"planner_mask {rows}x{length}"
    timed = timed_case("planner_mask", (rows, length), FP32)
    bench.check(name, planner_mask(logits, x, positions, MASK_ID, seed=1, offset=3),
                reference.planner_mask(logits, x, positions, MASK_ID, seed=1, offset=3))

    bench.compare(timed, name, lambda: planner_mask(logits, x, positions, MASK_ID, seed=1, offset=3),
                  {coin: functools.partial(torch_draws.planner_mask, logits, x, positions, MASK_ID, coin)
                   for coin in torch_draws.COIN},
                  mask_bytes + positions.numel() * 8)


def time_step(bench: Bench, batch: int, length: int, vocab: int, width: int) -> None:
    inputs = step_inputs(batch, length, vocab, width, bench.device)
    # planner logits and x read, masked and z written; the chosen hidden rows and
    # the head read; x copied and scattered into.
    moved = (batch * length * (4 + 8 + 8 + 1) + batch * width * 4 + (vocab * width + vocab) * 4
             + 2 * batch * length * 8)
    name = f"step B={batch} D={length} V={vocab} H={width}"
    timed = timed_case("step", (batch, length, vocab, width), FP32, "B x D x V x H, mask denoiser")
    # the gathered step with each token draw: which is fastest depends on the device
    ms, torch_ms = bench.compare(timed, name, lambda: fused_step(**inputs),
                                 {"paper listing": lambda: reference_step(**inputs),
                                  **{label: functools.partial(step, **inputs) for label, step in GATHERED.items()}},
                                 moved, rep_ms=200)
    target = f" (target >= {STEP_TARGET:g}x on H100)" if (batch, length, vocab, width) == STEP_TARGET_SHAPE else ""
    print(f"  fused step {torch_ms['paper listing'] / ms:.1f}x faster than the paper-listing step{target}")


def time_multinomial(bench: Bench, rows: int, categories: int, k: int, replacement: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    weights = torch.softmax(torch.randn(rows, categories, generator=g) * 3, -1).to(bench.device)
    ids = torch.arange(rows, device=bench.device)
    name = f"multinomial ({rows}, {categories}) k={k}{'' if replacement else ' without replacement'}"
    timed = timed_case("multinomial", (rows, categories), FP32, f"k={k}{'' if replacement else ' without replacement'}")
    bench.check(name, multinomial(weights, k, replacement, seed=1, row_ids=ids, check_valid=False),
                reference.multinomial(weights, k, replacement, seed=1, row_ids=ids, check_valid=False))
    same_law = ("inverse CDF", lambda: torch_draws.inverse_cdf(weights, k)) if replacement else \
        ("Gumbel-top-k", lambda: torch_draws.gumbel_top_k(weights, k))
    bench.versus(timed, name, lambda: multinomial(weights, k, replacement, seed=1, row_ids=ids, check_valid=False),
                 {"torch.multinomial": lambda: torch.multinomial(weights, k, replacement=replacement),
                  same_law[0]: same_law[1]}, weights.numel() * 4, "the weights")
    print("  target: at least 1.0x torch.multinomial")


def time_compaction(bench: Bench, batch: int, length: int) -> None:
    g = torch.Generator().manual_seed(batch)
    active = (torch.rand(batch, generator=g) < 0.6).to(bench.device)
    tokens = torch.randint(0, GPT2, (batch, length), generator=g).to(bench.device)
    logits = torch.randn(batch, length, generator=g).to(bench.device)
    n_active = int(active.sum())
    moved = 2 * n_active * length * (8 + 4)  # the active rows of both tensors, read and written

    name = f"compact_fixed {batch}x{length} x2"
    timed = timed_case("compact_fixed", (batch, length), "mixed", "tokens int64, logits float32")
    bench.check(name, compact_fixed(active, batch, tokens, logits), reference.compact_fixed(active, batch, tokens,
                                                                                          logits))
    # nonzero + index_select sends its count to the host (a sync) and packs only the active rows, no
    # count: less than compact_fixed's job, so related code; the sort does the job without a sync
    bench.compare(timed, name, lambda: compact_fixed(active, batch, tokens, logits),
                  {label: functools.partial(fn, active, batch, tokens, logits)
                   for label, fn in torch_draws.COMPACT.items()}, 2 * batch * length * 12,
                  related={label: functools.partial(fn, active, batch, tokens, logits)
                           for label, fn in torch_draws.COMPACT_RELATED.items()})
    (packed_tokens, packed_logits), index, _ = compact_fixed(active, n_active, tokens, logits)
    zeros = (torch.zeros_like(tokens), torch.zeros_like(logits))
    name = f"scatter_back {batch}x{length} x2"
    timed = timed_case("scatter_back", (batch, length), "mixed", "tokens int64, logits float32")
    bench.check(name, scatter_back(index, (packed_tokens, packed_logits), tuple(t.clone() for t in zeros)),
                reference.scatter_back(index, (packed_tokens, packed_logits), tuple(t.clone() for t in zeros)))
    out_tokens, out_logits = tokens.clone(), logits.clone()
    bench.compare(timed, name, lambda: scatter_back(index, (packed_tokens, packed_logits), (out_tokens, out_logits)),
                  {"index_copy_": lambda: (out_tokens.index_copy_(0, index, packed_tokens),
                                           out_logits.index_copy_(0, index, packed_logits))}, moved)


def time_rotary(bench: Bench, batch: int, heads: int, length: int, head_dim: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(length)
    qkv = torch.randn(batch, length, 3, heads, head_dim, generator=g).to(dtype).to(bench.device)
    q = qkv.permute(2, 0, 3, 1, 4)[0]  # as SelfAttention slices it
    table = RotaryEmbedding(head_dim, length).to(bench.device)
    name = f"rotary B={batch} heads={heads} L={length} d={head_dim} {str(dtype)[6:]}"
    timed = timed_case("rotary", (batch, heads, length, head_dim), dtype, "B x heads x L x d")
    bench.check_bits(name, "rotary", rotary(q, table.cos, table.sin), reference.rotary(q, table.cos, table.sin))
    moved = 2 * q.numel() * q.element_size() + 2 * length * head_dim // 2 * 4
    bench.compare(timed, name, lambda: rotary(q, table.cos, table.sin),
                  {"torch elementwise": lambda: reference.rotary(q, table.cos, table.sin)}, moved)


def time_philox_uniform(bench: Bench, rows: int, cols: int) -> None:
    ids = torch.arange(rows, device=bench.device) + 2**33  # 64-bit ids: the derived row keys too
    columns = torch.arange(cols, device=bench.device) + 7
    name = f"philox_uniform N={rows} M={cols}"
    timed = timed_case("philox_uniform", (rows, cols), FP32, "N x M")
    bench.check_bits(name, "philox_uniform", philox_uniform(11, 5, ids, columns),
                     reference.philox_uniform(11, 5, ids, columns))
    bench.compare(timed, name, lambda: philox_uniform(11, 5, ids, columns),
                  {"torch Philox": lambda: reference.philox_uniform(11, 5, ids, columns)}, rows * cols * 4)


def time_norm(bench: Bench, batch: int, length: int, width: int, modulated: bool, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(width)
    x = torch.randn(batch, length, width, generator=g).to(dtype).to(bench.device)
    weight, bias = (torch.randn(width, generator=g).to(bench.device) for _ in range(2))
    shift = scale = None
    if modulated:  # chunks of one adaLN projection, as a conditioned block has them
        shift, scale = (torch.randn(batch, 1, 2 * width, generator=g) * 0.1).to(dtype).to(bench.device).chunk(2, -1)
    name = f"norm B={batch} L={length} H={width}{' adaLN' if modulated else ''} {str(dtype)[6:]}"
    timed = timed_case("norm", (batch, length, width), dtype, "adaLN" if modulated else "")
    ours = norm(x, weight, bias, shift=shift, scale=scale)
    want = reference.norm(x, weight, bias, shift=shift, scale=scale)
    off = ((ours.float() - want.float()).abs() > torch.finfo(dtype).eps * want.float().abs().clamp_min(1)).sum()
    if not bench.cuda:
        print(f"  check {name}: none (on the CPU norm runs the reference)")
    elif off:
        bench.failures += 1
        print(f"  check {name}: MISMATCH: {int(off)} values more than one unit of the last place from the reference")
    else:
        print(f"  check {name}: within one unit of the last place of the reference "
              f"({100 * (ours != want).float().mean():.2f}% of the values not bit for bit)")
    weight_x, bias_x = weight.to(dtype), bias.to(dtype)

    def as_networks_had_it():  # float32 copy, norm, cast back, then the modulation in the dtype
        normed = F.layer_norm(x.float(), (width,), weight, bias).to(dtype)
        return normed if shift is None else normed * (1 + scale) + shift

    def shortest():
        normed = F.layer_norm(x, (width,), weight_x, bias_x)
        return normed if shift is None else torch.addcmul(shift, normed, 1 + scale)

    bench.compare(timed, name, lambda: norm(x, weight, bias, shift=shift, scale=scale),
                  {"as the networks had it": as_networks_had_it, "layer_norm + addcmul": shortest},
                  2 * x.numel() * x.element_size())


def describe(device: torch.device) -> str:
    import triton

    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})"
    else:
        name = f"CPU {platform.processor() or platform.machine()}, dry run: tiny shapes, numbers mean nothing"
    return (f"device {name} | torch {torch.__version__} (CUDA {torch.version.cuda}) | triton {triton.__version__} | "
            f"python {platform.python_version()} | command: python {' '.join(sys.argv)}")


# (section title, its timing function, its key in SHAPES); --only picks sections by their titles.
# The targets first, tuning last: a run stopped by its time limit keeps what matters most.
PLAN = [
    ("sample_categorical", time_sample_categorical, "categorical"),
    ("sample_from_hidden", time_sample_from_hidden, "hidden"),
    ("multinomial", time_multinomial, "multinomial"),
    ("sampler step: fused vs torch steps (benchmarks/bench_step.py)", time_step, "step"),
    ("sample_categorical with top-k / top-p / min-p", time_sample_categorical_controls, "controls"),
    ("planner_select, planner_select_mask, planner_mask", time_planner_ops, "planner"),
    ("compact_fixed, scatter_back", time_compaction, "compact"),
    ("rotary", time_rotary, "rotary"),
    ("norm", time_norm, "norm"),
    ("philox_uniform", time_philox_uniform, "philox"),
    ("sample_from_hidden launch configurations", time_head_configs, "hidden_configs"),
    ("sample_categorical launch configurations", time_categorical_configs, "categorical_configs"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU tensors (checks the script only)")
    parser.add_argument("--only", metavar="WORDS", default="",
                        help="a comma list: run only the sections whose title contains one of them "
                             "(e.g. 'launch configurations'); a word no title contains is refused")
    parser.add_argument("--rows", metavar="PATH", default=None,
                        help="write the comparisons as rows (benchmarks/rows.py) into PATH; default on a GPU "
                             "benchmarks/results/<device>.jsonl, in a dry run nowhere")
    args = parser.parse_args()
    dry_run, only = args.dry_run, [word for word in args.only.split(",") if word]
    unknown = [word for word in only if not any(word in title for title, _, _ in PLAN)]
    if unknown:  # a misspelt word would run nothing and exit 0, on a device lease too
        print(f"gpu_timings: --only {', '.join(map(repr, unknown))} names no section; the sections: "
              f"{'; '.join(title for title, _, _ in PLAN)}", file=sys.stderr)
        return 2
    if not dry_run and not torch.cuda.is_available():
        print("gpu_timings: no CUDA device visible to torch (use --dry-run to check the script)", file=sys.stderr)
        return 2
    bench = Bench(torch.device("cpu" if dry_run else "cuda"))
    shapes = SHAPES["dry" if dry_run else "full"]
    print(describe(bench.device))
    print("times: " + ("wall clock, eager calls back to back" if dry_run else
                       "eager: calls back to back between synchronisations, host clock; graph: "
                       "triton.testing.do_bench median, CUDA events"))
    copy_bandwidth(bench, shapes["copy_floats"])
    for title, fn, key in PLAN:
        if only and not any(word in title for word in only):
            continue
        with section(title):
            for shape in shapes[key]:
                with bench.case(f"{title} {shape}"):
                    fn(bench, *shape)
    target = args.rows if args.rows is not None else ("" if dry_run else str(result_rows.rows_path("cuda")))
    if target:
        print(f"gpu_timings: {result_rows.merge(Path(target), bench.rows)} rows written to {target}")
    print(f"gpu_timings: {bench.failures} failed case(s)")
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
