"""End-to-end sampling speed on one GPU (a part of benchmarks/gpu_check.sh).

1. The bundled text8 planner + mask denoiser, option A, 512 steps, batches 64 and 512:
   samples/s of the reference run, of the fused run in float32 without CUDA graphs (the
   fused path as it was before bfloat16 networks and graphs), of the fused run in bfloat16
   without graphs, and of the default fused run (bfloat16, CUDA graphs), with the ratio of
   the default to the float32 fused run; the time of one planner + denoiser pass in float32
   and bfloat16.
   Target: batch 64 at least 4x, batch 512 at least 3x the float32 fused samples/s.
2. A GPT-2-size pair (12 layers, d_model 768, V = 50257, D = 1024, batch 16, bfloat16,
   random weights): the fused step's time against the planner pass plus the denoiser
   trunk (hidden states, no output head) alone, and the reference step's; peak memory of
   both runs. A step's time is that of a run of 40 steps less one of 8, over 32: what a
   step costs once the run is going, without the per-run costs (the first, eager step,
   capturing the graph, the final tokens), which are printed apart. Target: fused step
   within 1.05x of planner + trunk.
   Where the default run's step goes: the device kernels of 32 fused bfloat16 steps at
   batch 64 without graphs (the kernels a graph replays), under torch.profiler: kernels
   per step, kernel time per step, and the kernels that take the most.
3. With --compile: the default fused run of part 1 at batches 64 and 512 with both
   networks torch.compile'd (ddpd.models.compile_for_sampling, as `ddpd-sample --compile`),
   and what the compilation costs.

The whole runs of part 1 are also written as rows (benchmarks/rows.py: the default run against
each other run, seconds a run) into --rows (on a GPU, by default benchmarks/results/<device>.jsonl).

Checked before anything is timed: the fused and reference runs return the same samples
from the same seed (float32, 64 steps). Whole runs are timed once each after a short
warm-up run (8 steps); other times are CUDA-event medians after a warm-up; samples/s from
whole runs (stops included).

    python benchmarks/gpu_sampling.py [--compile] # CUDA
    python benchmarks/gpu_sampling.py --dry-run   # tiny shapes on the CPU: checks the script only
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch

import rows as result_rows
from ddpd.checkpoint import load_bundle
from ddpd.models import build_model, compile_for_sampling, config_for, prepare_for_sampling
from ddpd.pretrained import BUNDLE_DIR
from ddpd.sampling import ddpd_sample
from ddpd.sampling.options import DDPDOptions, Execution
from ddpd.testing.memory import peak_cuda_growth
from ddpd.testing.timing import median_seconds

TARGETS = {64: "4x", 512: "3x"}  # batch -> default run / fused fp32 samples/s; no target at other batches
DEFAULT = "fused bf16 + graphs (default)"
ROWS: list[dict] = []  # the whole runs' comparisons (benchmarks/rows.py), written by main


# The bundled model's runs in a dry run (the CPU): enough to run every line, no more.
DRY_STEPS, DRY_BATCH = 4, 2


class Clock:
    """Median wall time of a callable on one device (ddpd.testing.timing.median_seconds: CUDA
    events on a GPU, perf_counter on the CPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable, repeats: int = 3, warm: bool = True) -> float:
        return median_seconds(fn, self.cuda, repeats, warmup=int(warm))


def peak_memory(fn: Callable, device: torch.device) -> float:
    """Peak device memory growth of one call, MiB (0 on the CPU)."""
    if device.type != "cuda":
        fn()
        return 0.0
    return peak_cuda_growth(fn) / 2**20


def bundled(args, device: torch.device, clock: Clock) -> None:
    planner, denoiser, configs = load_bundle(str(BUNDLE_DIR), device=str(device))
    length, vocab = configs["denoiser"]["model"]["max_seq_len"], configs["denoiser"]["model"]["out_dim"]
    steps = 512 if not args.dry_run else DRY_STEPS
    batches = (64, 512) if not args.dry_run else (DRY_BATCH,)
    low = [prepare_for_sampling(m, "auto", device) for m in load_bundle(str(BUNDLE_DIR), device=str(device))[:2]]
    variants = {  # name: (planner, denoiser, Execution); "fused fp32" is the fused path before bf16/graphs
        "reference fp32": (planner, denoiser, Execution(dtype="float32")),
        "fused fp32": (planner, denoiser, Execution(dtype="float32", fused=True, graphs="off")),
        "fused bf16": (*low, Execution(fused=True, graphs="off")),
        "fused bf16 + graphs (default)": (*low, Execution(fused=True)),
    }

    def run(batch, name, n_steps=steps):
        p, d, execution = variants[name]
        return lambda: ddpd_sample(p, d, batch, length, vocab, steps=n_steps, denoiser_type="mask", seed=0,
                                   device=device, execution=execution)

    print(f"## bundled text8 planner + mask denoiser, option A, {steps} steps, D = {length}")
    stamp, device_name = result_rows.make_stamp(), result_rows.device_name(str(device))
    with torch.inference_mode():
        check = [run(batches[0], name, min(steps, 64))() for name in ("reference fp32", "fused fp32")]
        assert torch.equal(check[0].tokens, check[1].tokens), "fused and reference runs differ"
        print(f"check: the fused fp32 run draws the reference run's samples ({min(steps, 64)} steps, same seed)")
        print("| batch | " + " | ".join(variants) + " | default / fused fp32 | target |")
        print("|---" * (len(variants) + 3) + "|")
        for batch in batches:
            names = [n for n in variants if batch <= 64 or n != "reference fp32"]  # measured before at 512
            for name in names:
                run(batch, name, min(steps, 8))()  # warm-up: compiles, caches, graph pools
            timed = {name: clock(run(batch, name), repeats=1, warm=False) for name in names}
            rate = {name: batch / timed[name] for name in names}
            cells = " | ".join(f"{rate[n]:.1f}/s" if n in rate else "-" for n in variants)
            gain = rate[DEFAULT] / rate["fused fp32"]
            print(f"| {batch} | {cells} | {gain:.2f}x | {TARGETS.get(batch, '-')} |")
            record_runs(stamp, device_name, (batch, length, vocab),
                        f"bundled text8 planner + mask denoiser, {steps} steps", timed)
    x = torch.randint(0, vocab, (batches[0], length), device=device)
    t = torch.rand(batches[0], device=device)
    repeats, profiled = (10, 32) if not args.dry_run else (2, 2)  # a dry run checks the code, not the numbers
    with torch.inference_mode():
        for name, (p, d) in (("float32", (planner, denoiser)), ("bfloat16", low)):
            seconds = clock(lambda: (p(x), d(x, t)), repeats=repeats)
            print(f"one planner + denoiser pass, batch {batches[0]}, {name}: {seconds * 1e3:.2f} ms")
        kernels(run(batches[0], "fused bf16", profiled), profiled, device, batches[0],
                str(next(low[1].parameters()).dtype)[6:])


def record_runs(stamp: dict, name: str, shape: tuple, params: str, seconds: dict) -> None:
    """Rows of the default run against each other whole run ({variant: seconds a run}), on the
    device `name`, with the run's stamp (result_rows.make_stamp)."""
    for variant, theirs in seconds.items():
        if variant != DEFAULT:
            ROWS.append(result_rows.row("ddpd_sample", shape, "bfloat16", seconds[DEFAULT], variant, theirs,
                                        params=params, mode="run", device=name, source="benchmarks/gpu_sampling.py",
                                        stamp=stamp))


def kernels(fn: Callable, steps: int, device: torch.device, batch: int, dtype: str, top: int = 12) -> None:
    """The kernels of `steps` sampler steps (fn runs them) under torch.profiler: how many a
    step launches, their time a step, and the `top` that take the most (CPU ops on the CPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    fn()  # warm-up: the first run compiles and fills caches
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    own = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, own) > 0]
    events.sort(key=lambda e: -getattr(e, own))
    total = sum(getattr(e, own) for e in events)
    count = sum(e.count for e in events)
    what = "kernels" if cuda else "CPU ops"
    print(f"{what} of the fused {dtype} run without graphs, batch {batch}: "
          f"{count / steps:.0f} a step, {total / steps / 1e3:.3f} ms a step; the {top} that take the most:")
    for e in events[:top]:
        print(f"  {getattr(e, own) / steps:8.1f} us a step  {e.count / steps:5.1f} a step  {e.key[:90]}")


def compiled(args, device: torch.device, clock: Clock) -> None:
    """The default fused run with both networks torch.compile'd: samples/s at batches 64 and
    512 beside the compile and warm-up time each costs."""
    for batch in (64, 512) if not args.dry_run else (DRY_BATCH,):
        compiled_run(args, device, clock, batch)


def compiled_run(args, device: torch.device, clock: Clock, batch: int) -> None:
    steps = 512 if not args.dry_run else DRY_STEPS
    torch._dynamo.reset()  # a fresh compilation: the cache of an earlier batch would be reused as dynamic
    bundle = load_bundle(str(BUNDLE_DIR), device=str(device))
    length, vocab = bundle[2]["denoiser"]["model"]["max_seq_len"], bundle[2]["denoiser"]["model"]["out_dim"]
    # The dry run checks this code path, not Inductor's C++ compile of the CPU kernels (slow).
    backend = "eager" if args.dry_run else "inductor"
    planner, denoiser = [compile_for_sampling(prepare_for_sampling(m, "auto", device), backend) for m in bundle[:2]]

    def run(n_steps):
        return lambda: ddpd_sample(planner, denoiser, batch, length, vocab, steps=n_steps, denoiser_type="mask", seed=0,
                                   device=device, execution=Execution(fused=True))

    with torch.inference_mode():
        begin = time.perf_counter()
        run(min(steps, 8))()
        warm = time.perf_counter() - begin
        seconds = clock(run(steps), repeats=1, warm=False)
    print(f"## torch.compile of both networks, default fused run, batch {batch}, {steps} steps: "
          f"{batch / seconds:.1f} samples/s (compile and warm-up {warm:.0f} s)")


def gpt2_pair(args, device: torch.device, clock: Clock) -> None:
    if args.dry_run:
        vocab, length, batch, fields = 300, 32, 2, dict(d_model=32, n_layers=2, n_heads=2)
    else:
        vocab, length, batch, fields = 50257, 1024, 16, dict(d_model=768, n_layers=12, n_heads=12)
    short, long = (8, 40) if not args.dry_run else (2, 4)
    torch.manual_seed(0)
    planner = prepare_for_sampling(build_model("planner", config_for("planner", vocab, length, **fields)), "auto",
                                   device)
    denoiser = prepare_for_sampling(build_model("uniform-denoiser", config_for("uniform-denoiser", vocab, length,
                                                                               **fields)), "auto", device)
    x = torch.randint(0, vocab, (batch, length), device=device)
    t = torch.rand(batch, device=device)

    def run(fused: bool, steps: int):
        return lambda: ddpd_sample(planner, denoiser, batch, length, vocab, steps=steps,
                                   ddpd=DDPDOptions(stop="budget"), seed=0, device=device,
                                   execution=Execution(fused=fused))

    def step_and_fixed(fused: bool) -> tuple:
        """(seconds a step, seconds a run costs besides its steps)."""
        a, b = (clock(run(fused, steps), repeats=3) for steps in (short, long))
        step = (b - a) / (long - short)
        return step, a - short * step

    with torch.inference_mode():
        networks = clock(lambda: (planner(x), denoiser.hidden(x, t)), repeats=5)
        fused, fused_fixed = step_and_fixed(True)
        reference, reference_fixed = step_and_fixed(False)
        memory = {name: peak_memory(run(name == "fused", short), device) for name in ("fused", "reference")}
    print(f"## GPT-2-size pair: {fields['n_layers']} layers, d {fields['d_model']}, V {vocab}, D {length}, "
          f"batch {batch}, {next(planner.parameters()).dtype} weights (random)")
    print(f"planner pass + denoiser trunk: {networks * 1e3:.2f} ms")
    print(f"fused step: {fused * 1e3:.2f} ms ({fused / networks:.3f}x the networks; target <= 1.05x), "
          f"peak memory {memory['fused']:.0f} MiB; a run's fixed cost, estimated {fused_fixed * 1e3:.1f} ms")
    print(f"reference step: {reference * 1e3:.2f} ms ({reference / networks:.3f}x), "
          f"peak memory {memory['reference']:.0f} MiB; a run's fixed cost, estimated {reference_fixed * 1e3:.1f} ms")
    print(f"(a step: runs of {long} less runs of {short} steps, over {long - short}; a run's fixed cost: what the "
          f"{short}-step run takes beyond {short} such steps, which noise can make negative)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (checks the script only)")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile'd networks (batches 64 and 512)")
    parser.add_argument("--rows", metavar="PATH", default=None,
                        help="write the whole runs' comparisons as rows (benchmarks/rows.py) into PATH; default on "
                             "a GPU benchmarks/results/<device>.jsonl, in a dry run nowhere")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_sampling: no CUDA device (use --dry-run to check the script)", file=sys.stderr)
        return 1
    device = torch.device("cpu" if args.dry_run else "cuda")
    clock = Clock(device)
    failed = 0
    for part in (bundled, gpt2_pair) + ((compiled,) if args.compile else ()):
        try:
            part(args, device, clock)
        except Exception as error:  # report and go on: one part's failure must not hide the other's numbers
            print(f"gpu_sampling: {part.__name__} FAILED: {type(error).__name__}: {error}")
            failed = 1
    target = args.rows if args.rows is not None else ("" if args.dry_run else str(result_rows.rows_path("cuda")))
    if target:
        print(f"gpu_sampling: {result_rows.merge(Path(target), ROWS)} rows written to {target}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
