"""Per-call host cost of every ddpd op: the public Python function against the raw
torch.ops.ddpd.* call of the same kernel on the same (tiny) inputs.

On CPU tensors of a few elements the kernels take a microsecond or two, so the
difference between the two medians is what the wrapper adds: argument checks,
stream resolution, custom-op dispatch. Target: under 20 us per op.

    python benchmarks/host_cost.py            # CPU
    python benchmarks/host_cost.py --cuda     # CUDA tensors: the raw call of the Triton
                                              # ops is then their registered custom op,
                                              # the path traced code takes (eager minus
                                              # CUDA-graph time is in gpu_timings.py)

Prints one line per op: public, raw, difference (microseconds per call), each the
minimum over REPEATS timings of CALLS calls (on a shared machine other work only
adds time, so the minimum is the steadiest estimate of the cost itself).

    python benchmarks/host_cost.py --cuda --profile sample_categorical

also profiles the public call of that op (cProfile, CALLS x REPEATS calls) and prints
where its host time goes, by function (time in the function itself, microseconds per
call): our checks and launch arithmetic, torch's allocations, Triton's launcher.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from typing import Callable

import torch

from ddpd.ops.bernoulli import bernoulli
from ddpd.ops.compact import compact_fixed, scatter_back
from ddpd.ops.multinomial import multinomial
from ddpd.ops.planner_mask import planner_mask
from ddpd.ops.planner_select import planner_select, planner_select_mask
from ddpd.ops.sample_categorical import sample_categorical
from ddpd.ops.sample_from_hidden import sample_from_hidden
from ddpd.testing.timing import best_per_call

CALLS, REPEATS = 300, 9
TARGET_US = 20.0


def per_call_us(public: Callable[[], object], raw: Callable[[], object],
                sync: Callable[[], None]) -> tuple[float, float]:
    """Microseconds per call of both, timed in alternation so both see the same load."""
    a, b = best_per_call(public, raw, calls=CALLS, repeats=REPEATS, sync=sync)
    return a * 1e6, b * 1e6


def cases(device: torch.device) -> dict:
    """op name -> (public call, raw torch.ops call) on tiny inputs (on CUDA, also
    sample_categorical at 64 x 50257)."""
    ops = torch.ops.ddpd  # the kernels of ddpd._C are registered by the first op call below
    cpu = device.type == "cpu"
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 40, generator=g).to(device)
    planner = torch.randn(4, 16, generator=g).to(device)
    x = torch.randint(0, 27, (4, 16), generator=g).to(device)
    positions = torch.zeros(4, 1, dtype=torch.long, device=device)
    hidden, weight = torch.randn(4, 8, generator=g).to(device), torch.randn(40, 8, generator=g).to(device)
    weights = torch.rand(4, 40, generator=g).to(device)
    rows = torch.arange(4, device=device)
    active = torch.tensor([True, False, True, True], device=device)
    packed, index, _ = compact_fixed(active, 4, x)
    out = x.clone()
    ids = torch.tensor([0], device=device)
    probs = torch.rand(4, 16, generator=g).to(device)
    raw_categorical = ops.sample_categorical_cpu if cpu else ops.sample_categorical
    raw_hidden = ops.sample_from_hidden_cpu if cpu else ops.sample_from_hidden
    raw_select = ops.planner_select_cpu if cpu else ops.planner_select
    raw_mask = ops.planner_mask_cpu if cpu else ops.planner_mask
    raw_select_mask = ops.planner_select_mask_cpu if cpu else ops.planner_select_mask
    table = {
        "sample_categorical": (lambda: sample_categorical(logits, 0.9, [0], seed=1, offset=2),
                               lambda: raw_categorical(logits, 0.9, None, ids, None, None, 0, None, 1.0, None,
                                                       -float("inf"), None, None, 1, 2, None, None, None, False, 0)),
        "sample_categorical unseeded": (lambda: sample_categorical(logits, 0.9),  # the seed drawn from torch's
                                        lambda: raw_categorical(logits, 0.9, None, None, None, None, 0, None, 1.0,
                                                                None, -float("inf"), None, None, 1, 2, None, None,
                                                                None, False, 0)),  # generator, as most calls do
        "sample_categorical top_p": (lambda: sample_categorical(logits, 0.9, top_p=0.9, seed=1, offset=2),
                                     lambda: raw_categorical(logits, 0.9, None, None, None, None, 0, None, 0.9, None,
                                                             -float("inf"), None, None, 1, 2, None, None, None, False,
                                                             0)),
        "sample_from_hidden": (lambda: sample_from_hidden(hidden, weight, None, 0.9, [0], seed=1, offset=2),
                               lambda: raw_hidden(hidden, weight, None, 0.9, None, ids, None, None, None, 1, 2, None,
                                                  None, None, False, 0)),
        "planner_select": (lambda: planner_select(planner, 1, "sigmoid", 1.0, 0.01, seed=1, offset=2),
                           lambda: raw_select(planner, 1, False, 1.0, 0.01, None, 1, 2, None, None, None)),
        "planner_mask": (lambda: planner_mask(planner, x, positions, 27, seed=1, offset=2),
                         lambda: raw_mask(planner, x, positions, 27, None, 1, 2, None, None, None)),
        "planner_select_mask": (lambda: planner_select_mask(planner, x, 27, 1, seed=1, offset=2),
                                lambda: raw_select_mask(planner, x, 27, 1, False, 1.0, 0.01, None, None, 1, 2, 3, None,
                                                        None, None, None)),
        "bernoulli": (lambda: bernoulli(probs, seed=1, offset=2),
                      lambda: (ops.bernoulli_cpu if cpu else ops.bernoulli)(probs, None, 1, 2, None, None, None)),
        "multinomial": (lambda: multinomial(weights, 1, True, seed=1, row_ids=rows, check_valid=False),
                        lambda: ops.multinomial_kernel(weights, 1, True, None, 1, 0, rows, None, None)),
        "compact_fixed": (lambda: compact_fixed(active, 4, x), lambda: ops.compact_fixed_kernel(active, 4, [x])),
        "scatter_back": (lambda: scatter_back(index, packed, (out,)),
                         lambda: ops.scatter_back_kernel(index, packed[0], out)),
    }
    if not cpu:  # the benchmarks' shape too, whose vocabulary is split over programs (two kernels,
        # whose device time is below a call's host time, so a call still costs that time)
        wide = torch.randn(64, 50257, generator=g).to(device)
        table["sample_categorical 64x50257"] = (
            lambda: sample_categorical(wide, 0.9, [0], seed=1, offset=2),
            lambda: raw_categorical(wide, 0.9, None, ids, None, None, 0, None, 1.0, None, -float("inf"), None, None, 1,
                                    2, None, None, None, False, 0))
    return table


def profile(name: str, public: Callable[[], object], sync: Callable[[], None], top: int = 14) -> None:
    """Where one public call's host time goes: the functions with the most time of their
    own, in microseconds per call."""
    calls = CALLS * REPEATS
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        public()
    sync()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])  # (file, line, function) -> (.., tottime, ..)
    total = sum(row[1][2] for row in rows)
    print(f"profile of {name} (cProfile adds its own cost to every call): {total / calls * 1e6:.1f} us a call")
    for (file, line, function), (_, _, own, cumulative, _) in rows[:top]:
        where = function if file == "~" else f"{function} ({file.split('site-packages/')[-1]}:{line})"
        print(f"  {own / calls * 1e6:7.1f} us own {cumulative / calls * 1e6:7.1f} us with callees  {where}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuda", action="store_true", help="time CUDA tensors instead of CPU ones")
    parser.add_argument("--profile", metavar="OP", help="also profile the public call of this op (e.g. "
                                                        "sample_categorical)")
    args = parser.parse_args()
    device = torch.device("cuda" if args.cuda else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("host_cost: no CUDA device visible to torch (run it without --cuda to time CPU tensors)",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    table = cases(device)
    if args.profile is not None and args.profile not in table:
        print(f"host_cost: --profile must be one of {', '.join(table)}, got {args.profile!r}", file=sys.stderr)
        return 2
    print(f"host cost per call on {device} (torch {torch.__version__}), best of {REPEATS} x {CALLS} calls, "
          f"target < {TARGET_US:g} us")
    print(f"{'op':28s} {'public':>9s} {'raw':>9s} {'added':>9s}")
    worst = 0.0
    for name, (public, raw) in table.items():
        a, b = per_call_us(public, raw, sync)
        worst = max(worst, a - b)
        print(f"{name:28s} {a:7.1f}us {b:7.1f}us {a - b:7.1f}us{'' if a - b < TARGET_US else '  over target'}")
    print(f"largest added cost: {worst:.1f} us")
    if args.profile is not None:
        profile(args.profile, table[args.profile][0], sync)
    return 0


if __name__ == "__main__":
    sys.exit(main())
