"""Parallel decoding on one GPU: tokens per second of the commit policies.

DDPD's commit policy and the mask loop's policies against today's default sampler (a part of
benchmarks/gpu_check.sh, `--only parallel`).

Models, as bfloat16 networks on the fused path (ddpd.models.prepare_for_sampling "auto"):
(a) the bundled text8 planner + mask denoiser, 256 characters; (b) a GPT-2-size planner +
mask denoiser with random weights (12 layers, d_model 768, V = 50257, L = 1024). Batches 64
and 1. Configurations, those of `ddpd-eval frontier` (which measures their quality on the
CPU, docs/parallel.md; this script measures speed only):
- default: ddpd_sample(..., denoiser_type="mask", execution=Execution(fused=True)), option A
  (sigmoid selection, eps stop, eps 0.01), ddpd-sample's default steps (ddpd.cli.sample.default_steps:
  2 x L for the bundled model, L for the GPT-2-size pair), CUDA graphs on ("auto");
- ddpd + ErrorBudget (ddpd.sampling.policies; --policy, repeatable, a spec as the frontier's
  --policies; default POLICIES, the frontier's DDPD policies: "ddpd policy 1" without planner
  passes, which reached the quality of the default's 512 steps at 64 passes, and "ddpd policy
  2", which revises with the planner every 4 steps) at 64 and 128 network passes (the steps
  that cost them: a denoiser pass a step and a planner pass every plan_every steps, as the
  frontier counts them), option A, CUDA graphs on;
- MaskGIT and ConfidenceThreshold(0.9) (mask_sample, fused) at 64 and 128 passes (steps),
  CUDA graphs on, and MaskGIT at 64 passes with its steps eager ("maskgit, eager"), as the
  field's samplers run.
Per configuration: samples/s, tokens/s (samples/s x L), mean network passes per sample
(SampleResult.passes), tokens committed per pass (SampleResult.tokens_per_pass) and the
ratio of its samples/s to the default's at the same model and batch. The targets,
at matched quality (read off the frontier): >= 4x the default's samples/s at batch 1, >= 3x
at batch 64. The main comparison is measured first, so that a run cut short still answers it
(docs/text8/README.md, "One GPU lease for both device scripts"): the bundled model's default,
policy 1 and MaskGIT at 64 passes, at batch 64 then 1; then its other configurations; the
GPT-2-size pair last. Each row is printed as soon as it is measured.

Each run is timed whole, once, after a short warm-up run of the same configuration (Triton
compiles, cuBLAS plans, graph pools), with gpu_sampling.Clock (CUDA events). A timed run
includes its CUDA-graph captures, as a user's call does (each ddpd_sample call captures its
own): a short run pays them over fewer steps than the default's. The GPT-2-size
default (1024 steps; random weights never let the eps stop end a row early) would take
minutes at batch 64: it is timed at two shorter budgets and extrapolated to L steps
(fixed cost + steps x cost of a step), marked so in the table. Every run's tokens are
checked to lie in [0, V): for the mask loop's runs, no mask left (the mask id is V or
more); DDPD runs start from uniform noise, never the mask id, so for them only the range.

    python benchmarks/gpu_parallel.py            # CUDA, an estimated 4 minutes on an H200
    python benchmarks/gpu_parallel.py --policy error-budget:bound=4,max_k=64,spread=linear
    python benchmarks/gpu_parallel.py --dry-run  # tiny shapes on the CPU: checks the script only
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ddpd.checkpoint import load_bundle
from ddpd.cli.sample import default_steps
from ddpd.models import build_model, config_for, prepare_for_sampling
from ddpd.pretrained import BUNDLE_DIR
from ddpd.sampling import (
    ConfidenceThreshold,
    DDPDOptions,
    ErrorBudget,
    Execution,
    MaskGIT,
    SampleResult,
    ddpd_sample,
    mask_sample,
)
from ddpd.sampling.policies import ddpd_steps, parse_policy, policy_spec
from gpu_sampling import Clock

POLICIES = ("error-budget:bound=0,max_k=256,spread=cosine,known_noise=true,plan_every=1000,choice_temperature=4.5",
            "error-budget:bound=1,max_k=256,spread=cosine,known_noise=true,"
            "plan_every=4,choice_temperature=4.5,revise_above=0.5")
TARGETS = {1: "4x", 64: "3x"}  # batch -> policy / default samples/s at matched quality


@dataclass
class Pair:
    """A planner + mask denoiser to time, whether it is the bundled pair (which sets the
    default run's steps, as in ddpd-sample), and how its default run is timed: whole, or
    (extrapolate) at two shorter step budgets."""

    name: str
    planner: torch.nn.Module
    denoiser: torch.nn.Module
    length: int
    vocab: int
    extrapolate: Optional[tuple[int, int]] = None
    bundled: bool = False


@dataclass
class Row:
    """One configuration's measurement."""

    sampler: str
    steps: int
    samples_per_s: float
    passes: float
    tokens_per_pass: float
    note: str = ""


@dataclass(frozen=True)
class Sizes:
    """What a run measures: the real run's sizes, or the dry run's tiny ones (seconds on a CPU)."""

    budgets: tuple[int, ...] = (64, 128)  # network passes per sample of the parallel configurations
    batches: tuple[int, ...] = (64, 1)
    warm_steps: int = 8  # the warm-up run's steps
    graphs: str = "auto"
    bundled_length: Optional[int] = None  # the bundled model's own 256 unless set


DRY_RUN = Sizes(budgets=(4, 8), batches=(2, 1), warm_steps=1, graphs="emulate", bundled_length=16)
MAIN = 3  # samplers' first runs, measured first at every batch: the default, policy 1, MaskGIT


def bundled(device: torch.device, sizes: Sizes) -> Pair:
    planner, denoiser, configs = load_bundle(str(BUNDLE_DIR), device=str(device))
    model = configs["denoiser"]["model"]
    return Pair("bundled text8 planner + mask denoiser", prepare_for_sampling(planner, "auto", device),
                prepare_for_sampling(denoiser, "auto", device), sizes.bundled_length or model["max_seq_len"],
                model["out_dim"], bundled=True)


def gpt2_pair(device: torch.device, dry_run: bool) -> Pair:
    if dry_run:
        vocab, length, fields, extrapolate = 300, 32, dict(d_model=32, n_layers=2, n_heads=2), (4, 8)
    else:
        vocab, length, fields, extrapolate = 50257, 1024, dict(d_model=768, n_layers=12, n_heads=12), (16, 80)
    torch.manual_seed(0)
    planner, denoiser = (prepare_for_sampling(build_model(kind, config_for(kind, vocab, length, **fields)), "auto",
                                              device) for kind in ("planner", "mask-denoiser"))
    name = (f"GPT-2-size planner + mask denoiser (random weights): {fields['n_layers']} layers, "
            f"d {fields['d_model']}, V {vocab}")
    return Pair(name, planner, denoiser, length, vocab, extrapolate)


def samplers(pair: Pair, policies: list[ErrorBudget], budgets: tuple[int, ...], graphs: str
             ) -> list[tuple[str, int, Callable]]:
    """(name, steps, run(batch, steps) -> SampleResult) of every configuration: first the MAIN
    comparison, the default against the first policy and MaskGIT at the smallest budget (matched
    passes), then the rest. A DDPD step is two network passes (planner + denoiser), a mask-loop
    step one."""
    execution = Execution(fused=True, graphs=graphs)

    def ddpd(options: DDPDOptions) -> Callable:
        return lambda batch, steps: ddpd_sample(pair.planner, pair.denoiser, batch, pair.length, pair.vocab,
                                                steps=steps, denoiser_type="mask", seed=0, device=pair_device(pair),
                                                ddpd=options, execution=execution)

    def masked(mask_policy, graphs: str = graphs) -> Callable:
        return lambda batch, steps: mask_sample(pair.denoiser, batch, pair.length, pair.vocab, steps=steps,
                                                policy=mask_policy, seed=0, device=pair_device(pair),
                                                execution=Execution(fused=True, graphs=graphs))

    runs = [("ddpd default (one at a time)", default_steps(pair.length, pair.bundled), ddpd(DDPDOptions()))]
    for number, policy in enumerate(policies, 1):
        runs += [(f"ddpd policy {number}", ddpd_steps(passes, policy), ddpd(DDPDOptions(policy=policy)))
                 for passes in budgets]
    for name, run in (("maskgit", masked(MaskGIT())), ("mask threshold:0.9", masked(ConfidenceThreshold(0.9)))):
        runs += [(name, passes, run) for passes in budgets]
    runs.append(("maskgit, eager", budgets[0], masked(MaskGIT(), "off")))  # what graphs bring it, at one budget
    main = (0, 1, 1 + len(policies) * len(budgets))  # the default, policy 1 and MaskGIT at budgets[0]
    return [runs[i] for i in main] + [run for i, run in enumerate(runs) if i not in main]


def pair_device(pair: Pair) -> torch.device:
    return next(pair.denoiser.parameters()).device


def checked(result: SampleResult, pair: Pair) -> SampleResult:
    """The result, once its tokens all lie in [0, vocab): for a mask-loop run no mask id is
    left (it is vocab or more); a DDPD run starts from uniform noise, so only the range."""
    tokens = result.tokens
    if not bool(((tokens >= 0) & (tokens < pair.vocab)).all()):
        raise AssertionError(f"{pair.name}: a sample holds a token outside [0, {pair.vocab})")
    return result


def measure(clock: Clock, pair: Pair, run: Callable, batch: int, steps: int, warm_steps: int
            ) -> tuple[float, SampleResult]:
    """(seconds, result) of one whole run, after a warm-up run of at most warm_steps steps."""
    run(batch, min(steps, warm_steps))
    out: list[SampleResult] = []
    seconds = clock(lambda: out.append(run(batch, steps)), repeats=1, warm=False)
    return seconds, checked(out[-1], pair)


def extrapolated(clock: Clock, pair: Pair, run: Callable, batch: int, steps: int, warm_steps: int) -> Row:
    """The default run's row from runs of the two shorter budgets pair.extrapolate: a run of n
    steps costs fixed + n x step, while no row stops early (checked: else the estimate is
    flagged)."""
    short, long = pair.extrapolate
    (a, _), (b, result) = (measure(clock, pair, run, batch, n, warm_steps) for n in (short, long))
    step = (b - a) / (long - short)
    seconds = a + (steps - short) * step
    per_step = float(result.passes.float().mean()) / long
    ran_out = bool((result.stop_step == long).all())
    note = f"extrapolated from runs of {short} and {long} steps"
    if not ran_out or step <= 0:  # the estimate assumes every step of the budget runs and costs time
        note += ", NOT VALID: " + ("rows stopped early" if not ran_out else "the longer run was not slower")
    return Row("", steps, batch / seconds, per_step * steps, result.tokens_per_pass, note)


def say(line: str) -> None:
    """Print a line and flush it: a run killed by its timeout keeps every line printed before,
    also where Python buffers its output (a pipe, without PYTHONUNBUFFERED)."""
    print(line, flush=True)


def table(pair: Pair, clock: Clock, policies: list[ErrorBudget], sizes: Sizes) -> int:
    """Print the pair's rows as they are measured (a run cut short keeps those done); the
    number of configurations that failed."""
    runs = samplers(pair, policies, sizes.budgets, sizes.graphs)
    say(f"## {pair.name}, L = {pair.length}, {str(next(pair.denoiser.parameters()).dtype)[6:]} networks")
    say("| batch | sampler | steps | passes / sample | tokens / pass | samples/s | tokens/s | x default | note |")
    say("|---" * 9 + "|")
    failed = 0
    default = {batch: float("nan") for batch in sizes.batches}
    # the main comparison at every batch, then the rest: a run cut short answers the main question
    order = [(batch, i) for part in (range(MAIN), range(MAIN, len(runs))) for batch in sizes.batches for i in part]
    with torch.inference_mode():
        for batch, i in order:
            name, steps, run = runs[i]
            try:
                row = one_row(clock, pair, name, run, batch, steps, sizes.warm_steps, first=i == 0)
            except Exception as error:  # report and go on: one failure must not hide the other numbers
                say(f"| {batch} | {name} | {steps} | - | - | - | - | - | FAILED: {type(error).__name__}: "
                    f"{str(error)[:200]} |")
                failed += 1
                continue
            default[batch] = row.samples_per_s if i == 0 else default[batch]
            say(f"| {batch} | {row.sampler} | {row.steps} | {row.passes:.1f} | {row.tokens_per_pass:.2f} | "
                f"{row.samples_per_s:.2f} | {row.samples_per_s * pair.length:.0f} | "
                f"{row.samples_per_s / default[batch]:.2f}x | {row.note} |")
    return failed


def one_row(clock: Clock, pair: Pair, name: str, run: Callable, batch: int, steps: int, warm_steps: int,
            first: bool) -> Row:
    if first and pair.extrapolate is not None:
        row = extrapolated(clock, pair, run, batch, steps, warm_steps)
        row.sampler = name
        return row
    seconds, result = measure(clock, pair, run, batch, steps, warm_steps)
    return Row(name, steps, batch / seconds, float(result.passes.float().mean()), result.tokens_per_pass)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (checks the script only)")
    parser.add_argument("--policy", action="append", help="a DDPD commit policy, an error-budget spec as "
                        "ddpd-eval frontier --policies reads it; repeatable (default: "
                        + " and ".join(POLICIES) + ")")
    args = parser.parse_args(argv)
    policies = []
    for spec in args.policy or POLICIES:
        try:
            policy = parse_policy(spec)
        except ValueError as err:
            parser.error(f"--policy: {err}")
        if not isinstance(policy, ErrorBudget):
            parser.error(f"--policy must be an error-budget spec (the DDPD policy), got {spec!r}")
        policies.append(policy)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_parallel: no CUDA device (use --dry-run to check the script)", file=sys.stderr)
        return 1
    device = torch.device("cpu" if args.dry_run else "cuda")
    if args.dry_run:
        torch.set_num_threads(1)  # tiny shapes: threads only wait on each other
    for number, policy in enumerate(policies, 1):
        say(f"ddpd policy {number}: {policy_spec(policy)} (its quality: ddpd-eval frontier --policies "
            f"{policy_spec(policy)})")
    say(f"targets at matched quality: policy / default samples/s >= "
        f"{', '.join(f'{v} at batch {k}' for k, v in TARGETS.items())}")
    clock = Clock(device)
    failed = 0
    sizes = DRY_RUN if args.dry_run else Sizes()
    for build in (lambda: bundled(device, sizes), lambda: gpt2_pair(device, args.dry_run)):
        try:
            failed += table(build(), clock, policies, sizes)
        except Exception as error:  # report and go on: one model's failure must not hide the other's numbers
            say(f"gpu_parallel: FAILED: {type(error).__name__}: {error}")
            failed += 1
    say(f"gpu_parallel: {failed} failed")
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main())
