r"""ddpd-eval: likelihood bounds, sample quality and convergence of ddpd models.

    ddpd-eval elbo --planner runs/planner --denoiser runs/mask --data books --out elbo.json
    ddpd-eval quality --planner runs/planner --denoiser runs/mask --judge runs/ar \
        --data books --steps 64 128 256 512 --temperatures 0.8 0.9 1.0 --out-dir q/
    ddpd-eval convergence --planner runs/planner --denoiser runs/mask --steps 512 --out-dir conv/
    ddpd-eval merge q1/sweep.csv q2/sweep.csv --out-dir q/   # a sweep run in parts (--samplers)
    ddpd-eval training runs/planner runs/mask runs/ar --out-dir docs/   # what the training runs cost
    ddpd-eval compare q/sweep.csv --baselines dfm-eta0 dfm-eta15   # NLL differences at matched entropy
    ddpd-eval frontier --judge ngram --data data/wiki.txt --out-dir f/   # quality against passes

Every result is reproducible from --seed; every report is written atomically and locked
against a second writer. docs/cli.md ("ddpd-eval") describes each subcommand and its
flags, docs/evaluation.md the estimators."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from ddpd.cli import frontier
from ddpd.cli.common import (
    DTYPE_CHOICES,
    Interrupted,
    OneLineParser,
    UsageError,
    add_runtime_arguments,
    apply_threads,
    check_checkpoints,
    check_data,
    check_first,
    check_seed,
    check_threads,
    data_refusals,
    float_type,
    int_type,
    load_role,
    refuse_empty_paths,
    refuse_outputs_over_inputs,
    resolve_device,
    run_tool,
    shared_facts,
    warn_if_lengths_differ,
)
from ddpd.cli.samplers import add_truncation_arguments, needs, truncation_from
from ddpd.streams import Stdout, standard_streams
from ddpd.training.sources import LABELLED_SUFFIX, is_labelled

if TYPE_CHECKING:
    import torch

DEFAULT_ETAS = [0.0, 15.0]  # quality's --eta: the dfm-eta0 and dfm-eta15 samplers
DEFAULT_EPS = 0.01  # quality's --eps: the stop of the ddpd-A-* samplers
DEFAULT_T_MAX = 0.999  # elbo's --t-max: ddpd.eval.elbo.DEFAULT_T_MAX, written out so that parsing imports no torch
DEFAULT_REFERENCE_SEQUENCES = 256  # quality's --reference-sequences: held-out text of --data
SAMPLER_HELP = ("ddpd-{A,AB,ABC}-{mask,uniform,uniform-model}, ddpd-{A,AB,ABC}-uniform-model-one-pass, "
                "tau-planned-{mask,uniform}, dfm-eta<eta>, dfm-uni, maskgit (default: every one the checkpoints "
                "allow)")


def _common(p: argparse.ArgumentParser, *, data_required: Optional[bool]) -> None:
    """The flags of the commands that load networks; data_required None: the command reads
    no text (and takes no single uniform model)."""
    p.add_argument("--planner", help="planner checkpoint directory")
    p.add_argument("--denoiser", nargs="+", default=[], metavar="DIR",
                   help="mask-denoiser and/or uniform-denoiser checkpoint directories")
    if data_required is not None:
        p.add_argument("--uniform", help="single uniform-diffusion model checkpoint directory")
        p.add_argument("--data", required=data_required,
                       help="held-out text: a file (text8 format for text8 models), books, text8 or "
                            "hf:NAME[:CONFIG]")
        p.add_argument("--split", default="test", choices=("train", "validation", "test"),
                       help="which 90/5/5 split of --data to use (default test)")
    p.add_argument("--seed", type=int_type, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--batch-size", type=int_type, default=32, help="sequences per batch (default 32)")
    add_runtime_arguments(p)
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars (shown on a terminal only)")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ddpd-eval and its subcommands.

    Returns:
        The OneLineParser.
    """
    parser = OneLineParser(prog="ddpd-eval", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    p = sub.add_parser("elbo", help="ELBO terms and denoising performance on held-out text (bits per token)")
    _common(p, data_required=True)
    p.add_argument("--num-sequences", type=int_type, help="held-out sequences (default: all chunks of the split)")
    p.add_argument("--mc-samples", type=int_type, default=1, help="Monte-Carlo samples per sequence (default 1)")
    p.add_argument("--t-max", type=float_type, default=DEFAULT_T_MAX,
                   help=f"truncation time of the bound (default {DEFAULT_T_MAX})")
    p.add_argument("--alpha", type=float_type, default=0.85,
                   help="corruption level of the denoising table (default 0.85)")
    p.add_argument("--out", help="write the results as JSON here, and the printed Markdown beside it (.md)")

    p = sub.add_parser("quality", help="judge NLL and unigram entropy of samples: sampler x steps x temperature")
    _common(p, data_required=False)
    p.add_argument("--judge", required=True,
                   help="autoregressive judge checkpoint (kind ar), or ngram[:ORDER] built from the train split of "
                        "--data (as ddpd-eval frontier's)")
    p.add_argument("--samplers", nargs="+", help=SAMPLER_HELP)
    p.add_argument("--steps", nargs="+", type=int_type, default=[64, 128, 256, 512],
                   help="step budgets to sweep (default: 64 128 256 512)")
    p.add_argument("--temperatures", nargs="+", type=float_type, default=[0.8, 0.9, 1.0],
                   help="denoiser temperatures to sweep (default: 0.8 0.9 1.0)")
    p.add_argument("--eta", nargs="+", type=float_type, default=DEFAULT_ETAS,
                   help="DFM tau-leaping stochasticities (default: 0 15)")
    p.add_argument("--eps", type=float_type, default=DEFAULT_EPS, help="stop criterion of DDPD option A (default 0.01)")
    add_truncation_arguments(p)
    p.add_argument("--num-samples", type=int_type, default=64, help="samples a configuration (default 64)")
    p.add_argument("--fused", action="store_true",
                   help="every sampler on its fused path (ddpd.sampling.draws): faster, the same samples with "
                        "float32 networks (with bfloat16 ones, the same law)")
    _dtype(p)
    p.add_argument("--reference-sequences", type=int_type, default=DEFAULT_REFERENCE_SEQUENCES,
                   help="held-out sequences scored as the reference point (needs --data; default 256)")
    p.add_argument("--out-dir", required=True, help="where the reports go: " + ", ".join(REPORTS["quality"][:3]))

    p = sub.add_parser("merge", help="merge the sweep.csv files of a quality sweep run in parts")
    p.add_argument("sweeps", nargs="+", metavar="CSV", help="sweep.csv files written by ddpd-eval quality")
    p.add_argument("--out-dir", required=True, help="where to write the merged sweep.csv, sweep.md and sweep.png")

    p = sub.add_parser("compare", help="judge NLL of samplers minus baselines at matched entropy, per step budget")
    p.add_argument("sweep", metavar="CSV", help="a sweep.csv written by ddpd-eval quality or merge")
    p.add_argument("--samplers", nargs="+", help="default: every ddpd-* and tau-planned-* sampler in the sweep")
    p.add_argument("--baselines", nargs="+", help="default: every dfm-* sampler and maskgit in the sweep")
    p.add_argument("--out", help="also write the Markdown table here")

    p = sub.add_parser("training", help="size, steps, time and losses of ddpd-train checkpoints")
    p.add_argument("runs", nargs="+", metavar="DIR", help="checkpoint directories written by ddpd-train")
    p.add_argument("--out-dir", help="also write training.md and training.json (with the loss histories) here")

    p = sub.add_parser("convergence", help="noise left and stopped samples along the DDPD steps")
    _common(p, data_required=None)
    p.add_argument("--steps", type=int_type, default=512, help="step budget of the DDPD runs (default 512)")
    p.add_argument("--num-samples", type=int_type, default=64, help="samples drawn (default 64)")
    p.add_argument("--eps", nargs="+", type=float_type, default=[0.05, 0.01],
                   help="stop criteria to track (default: 0.05 0.01)")
    p.add_argument("--temperature", type=float_type, default=1.0, help="denoiser temperature (default 1.0)")
    _dtype(p, judge=False)
    p.add_argument("--out-dir", required=True, help="where the reports go: " + ", ".join(REPORTS["convergence"]))
    frontier.add_parser(sub)
    return parser


def _dtype(p: argparse.ArgumentParser, judge: bool = True) -> None:
    """--dtype; judge: whether the command has a --judge, which it leaves as it is."""
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help=f"precision of the sampling networks{' (not the judge)' if judge else ''}: auto (bfloat16 on "
                        "CUDA, float32 on the CPU), float32, bfloat16, float16")


# ---------------------------------------------------------------- checkpoints


@dataclass
class Loaded:
    """Models by role and what they must share: vocab_size, tokenizer, schedule, seq_len."""

    device: torch.device
    models: dict[str, torch.nn.Module] = field(default_factory=dict)
    shared: dict[str, object] = field(default_factory=dict)
    corpora: dict[str, object] = field(default_factory=dict)  # the corpus fingerprint each checkpoint records
    judge_id: Optional[str] = None  # the sha256 of the judge's weights, which a sweep's rows record

    @property
    def vocab_size(self) -> int:
        return self.shared["vocab_size"]

    @property
    def seq_len(self) -> int:
        return self.shared["seq_len"]

    @property
    def schedule(self) -> str:
        return self.shared["schedule"]

    @property
    def tokenizer(self) -> Optional[dict]:
        return self.shared.get("tokenizer")


ROLES = {"planner": ("planner",), "uniform": ("uniform",), "judge": ("ar",),
         "denoiser": ("mask-denoiser", "uniform-denoiser")}


def load_models(args: argparse.Namespace) -> Loaded:
    """Load every checkpoint given, check kinds and that they agree on the vocabulary,
    tokenizer and schedule.

    Args:
        args: the parsed command line.

    Returns:
        The Loaded models, their device and shared facts.

    Raises:
        UsageError: a kind given twice, or checkpoints that differ.
        CheckpointError: a checkpoint that cannot be loaded.
    """
    from ddpd.checkpoint import WEIGHTS

    loaded = Loaded(device=resolve_device(args.device))
    judge = getattr(args, "judge", None)
    given = [("planner", args.planner), ("uniform", getattr(args, "uniform", None)),
             ("judge", None if judge is None or frontier.ngram_order(judge) is not None else judge)]
    given += [("denoiser", d) for d in args.denoiser]
    configs = []
    for role, path in given:
        if path is None:
            continue
        model, config = load_role(role, path, ROLES[role], loaded.device)
        key = config["kind"] if role == "denoiser" else role
        if key in loaded.models:
            raise UsageError(f"--{role} {path}: a {config['kind']} checkpoint was already given")
        configs.append((f"--{role} {path}", config))
        loaded.models[key] = model
        if role == "judge":
            loaded.judge_id = "sha256:" + config["sha256"][WEIGHTS][:16]  # load_model checked it
        if config.get("corpus") is not None:
            loaded.corpora[f"--{role} {path}"] = config["corpus"]
    loaded.shared = shared_facts(configs)
    warn_if_lengths_differ("ddpd-eval", loaded.shared["seq_lens"])
    return loaded


def _model_set(loaded: Loaded):
    from ddpd.eval import ModelSet

    m = loaded.models
    return ModelSet(vocab_size=loaded.vocab_size, planner=m.get("planner"), uniform_denoiser=m.get("uniform-denoiser"),
                    mask_denoiser=m.get("mask-denoiser"), uniform_model=m.get("uniform"))


def _heldout(args: argparse.Namespace, loaded: Loaded, num: Optional[int], flag: str) -> torch.Tensor:
    """The held-out sequences of --data; num: the value of `flag` (more than the split
    holds is a usage error naming it)."""
    from ddpd.eval import heldout_sequences
    from ddpd.training.data import load_text, tokenizer_from_config

    if loaded.tokenizer is None:
        raise UsageError("the checkpoints do not record their tokenizer; cannot encode --data")
    tokenizer = tokenizer_from_config(loaded.tokenizer)
    try:
        with data_refusals(args.data):
            text = load_text(args.data)
            _warn_if_trained_on_other_text(args, loaded, text)
            sequences = heldout_sequences(args.data, tokenizer, loaded.seq_len, args.split, num, text=text)
    except ValueError as err:
        if str(err).startswith("num_sequences:"):
            raise UsageError(f"{flag}:{str(err)[len('num_sequences:'):]}".replace("num_sequences=", f"{flag} "))
        if str(err).startswith("seq_len:"):  # the length is the checkpoints', not a flag
            raise UsageError(f"--data:{str(err)[len('seq_len:'):]} (the checkpoints' length)") from None
        raise
    return sequences.to(loaded.device)


def _warn_if_trained_on_other_text(args: argparse.Namespace, loaded: Loaded, text: str) -> None:
    """A checkpoint trained on another corpus than --data (a prefix of it, say) may have seen
    the split evaluated: say so on stderr (evaluating on other text is legitimate)."""
    from ddpd.training.data import fingerprint

    corpus = fingerprint(text)
    others = [name for name, recorded in loaded.corpora.items() if recorded != corpus]
    if others:
        print(f"ddpd-eval: warning: {', '.join(others)} {'was' if len(others) == 1 else 'were'} trained on another "
              f"corpus than --data {args.data} (the fingerprints differ): the {args.split} split is held out of "
              "--data only, not of the text the networks were trained on", file=sys.stderr)


# ---------------------------------------------------------------- elbo


def run_elbo(args: argparse.Namespace) -> None:
    """Run `ddpd-eval elbo`: ELBO terms and denoising rows on held-out text, printed and
    written to --out (JSON) and its Markdown twin.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: an --out that is its own twin, checkpoints that give no row, a planner
            without a denoiser, a --t-max
            out of range, or an unusable --data.
    """
    import torch

    from ddpd.eval import evaluate_denoising, evaluate_elbo
    from ddpd.eval.likelihood import denoising_kinds, denoising_markdown, elbo_markdown, elbo_methods
    from ddpd.eval.report import one_set, write_json, write_text
    from ddpd.process import get_schedule

    markdown = None if args.out is None else markdown_twin(args.out)
    if markdown is not None and os.path.normcase(os.path.abspath(markdown)) == os.path.normcase(
            os.path.abspath(args.out)):
        raise UsageError(f"--out {args.out}: the JSON results go to --out and the Markdown beside it as .md, "
                         "the same file here; give a .json path")
    loaded = load_models(args)
    models = _model_set(loaded)
    methods = elbo_methods(models)
    if not methods and not denoising_kinds(models):
        raise UsageError("these checkpoints give neither an ELBO nor a denoising row: give --planner with "
                         "--denoiser, --denoiser alone (mask or uniform), or --uniform")
    if models.planner is not None and models.mask_denoiser is None and models.uniform_denoiser is None:
        raise UsageError("--planner: its rows need a --denoiser (mask or uniform); --uniform's rows do not read it")
    alpha_max = float(get_schedule(loaded.schedule).alpha(torch.tensor(args.t_max, dtype=torch.float64)))
    if methods and not 0.0 < alpha_max < 1.0:  # the denoising rows do not read it
        raise UsageError(f"--t-max {args.t_max}: alpha(t_max) under the checkpoints' {loaded.schedule} schedule "
                         f"must be in (0, 1), got {alpha_max}")
    sequences = _heldout(args, loaded, args.num_sequences, "--num-sequences")
    common = dict(schedule=loaded.schedule, seed=args.seed, batch_size=args.batch_size, progress=args.progress)
    elbo_rows = evaluate_elbo(models, sequences, mc_samples=args.mc_samples, t_max=args.t_max, **common) \
        if methods else []
    denoising_rows = evaluate_denoising(models, sequences, alpha=args.alpha, **common) \
        if denoising_kinds(models) else []
    tokens = f"{sequences.shape[0]} x {sequences.shape[1]} tokens of the {args.split} split"
    parts = []
    if elbo_rows:
        parts.append(f"ELBO terms on {tokens} (bits per token, lower is better; t_max={args.t_max}, "
                     f"{args.mc_samples} MC sample(s))\n\n" + elbo_markdown(elbo_rows))
    if denoising_rows:
        if not elbo_rows:
            parts.append(f"On {tokens}\n")
        parts.append(f"Denoising at alpha = {args.alpha}\n\n" + denoising_markdown(denoising_rows))
    report = "\n".join(parts)
    if args.out:  # written before the report is printed: a reader of stdout may go away
        settings = {k: v for k, v in vars(args).items() if k not in ("command", "progress", "stdout")}
        with one_set():
            write_json({"settings": settings, "elbo": elbo_rows, "denoising": denoising_rows}, args.out)
            write_text(report, markdown)
    args.stdout.print(report)


# ---------------------------------------------------------------- samplers


def sampler_specs(loaded: Loaded, etas: list[float], eps: float, fused: bool = False,
                  dtype: str = "auto", truncation=None) -> dict[str, object]:
    """Every sampler the loaded checkpoints allow, by name (the table of ddpd.cli.samplers,
    which ddpd-sample runs too). Truncation cuts are named in each sampler's name in the
    sweep (' top-p=0.9'), so that sweeps with and without them merge and compare as
    different samplers.

    Args:
        loaded: the Loaded models.
        etas: the eta values of the dfm-eta{eta} samplers.
        eps: the ddpd samplers' stop threshold.
        fused: each on its fused path (the same draws).
        dtype: the precision the networks run in.
        truncation: the cuts of every token draw (ddpd.sampling.Truncation), or None.

    Returns:
        The SamplerSpecs by name.
    """
    from ddpd.cli.samplers import Settings, truncation_label, variants
    from ddpd.eval import SamplerSpec
    from ddpd.sampling import DDPDOptions, Execution, PhiloxNoise, Truncation

    truncation = truncation or Truncation()
    base = Settings(loaded.seq_len, loaded.vocab_size, steps=1, schedule=loaded.schedule, device=loaded.device,
                    execution=Execution(fused=fused, dtype=dtype), ddpd=DDPDOptions(eps=eps), truncation=truncation)

    def spec(variant) -> SamplerSpec:
        def run(n, steps, temperature, seed, first_row):
            settings = dataclasses.replace(base, steps=steps, temperature=temperature)
            return variant.call(loaded.models, settings, n, PhiloxNoise(seed, first_row=first_row), first_row)
        return SamplerSpec(variant.name + truncation_label(truncation), run)

    kinds = [kind for kind in loaded.models if kind != "judge"]
    return {name: spec(variant) for name, variant in variants(kinds, etas).items()}


def _prepare(loaded: Loaded, dtype: str) -> str:
    """Cast the networks that sample (not the judge) to --dtype; returns its resolved name."""
    from ddpd.models import prepare_for_sampling, resolve_dtype

    resolved = resolve_dtype(dtype, loaded.device)
    for kind, model in loaded.models.items():
        if kind != "judge":
            prepare_for_sampling(model, resolved, loaded.device)
    return str(resolved).replace("torch.", "")


def run_quality(args: argparse.Namespace) -> None:
    """Run `ddpd-eval quality`: sample every sampler at every budget and temperature, judge the
    samples, write the sweep's reports in --out-dir (the rows so far in sweep.partial.csv until
    the reports are published together).

    Args:
        args: the parsed command line.

    Raises:
        UsageError: a judge too short for the samples, checkpoints that run no
            sampler, or unknown --samplers.
    """
    import torch

    from ddpd._interrupts import signals_held
    from ddpd.eval import run_sweep, write_sweep
    from ddpd.eval.quality import sweep_markdown
    from ddpd.eval.report import one_set, write_csv
    from ddpd.files import partial_path, remove_partial

    truncation = truncation_from(args)  # before any model is loaded
    order = frontier.ngram_judge_order(args.judge, args.data)
    loaded = load_models(args)
    if order is None:
        judge = loaded.models["judge"]
        if loaded.seq_len > judge.config.max_seq_len - 1:
            raise UsageError(f"--judge: scores sequences of up to {judge.config.max_seq_len - 1} tokens, the samples "
                             f"have {loaded.seq_len}")
    else:  # named by the corpus it counts, so that merge refuses parts judged by another one
        judge = frontier.ngram_judge(args.data, order, loaded.shared)
        loaded.judge_id = f"ngram:{order}:{frontier.ngram_judge_source(args.data)}"
    available = sampler_specs(loaded, args.eta, args.eps, args.fused, _prepare(loaded, args.dtype), truncation)
    if not available:  # a planner alone, or a uniform denoiser without one
        raise UsageError(f"these checkpoints run no sampler: a sampler needs {needs()}")
    names = args.samplers or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        # a dfm-eta<ETA> missing for its --eta, not for the checkpoints: say which flag adds it
        hint = (f"; dfm-eta<ETA> runs at each --eta, here {' '.join(f'{eta:g}' for eta in args.eta)}"
                if any(n.startswith("dfm-eta") for n in unknown) and any(n.startswith("dfm-eta") for n in available)
                else "")
        raise UsageError(f"--samplers: {unknown} not available with these checkpoints; available: "
                         f"{list(available)}{hint}")
    if args.eta != DEFAULT_ETAS and not any(n.startswith("dfm-eta") for n in names):  # it would be ignored
        raise UsageError(f"--eta {' '.join(f'{eta:g}' for eta in args.eta)} acts on the dfm-eta<ETA> samplers "
                         "(one mask denoiser) only, and this sweep runs none of them")
    if args.eps != DEFAULT_EPS and not any(n.startswith("ddpd-A-") for n in names):  # option A's stop alone reads it
        raise UsageError(f"--eps {args.eps:g} acts on the eps stop of the ddpd-A-* samplers only, and this sweep "
                         "runs none of them")
    reference = _heldout(args, loaded, args.reference_sequences, "--reference-sequences") if args.data else None
    # the rows so far, rewritten after every configuration: never sweep.csv, which with sweep.md and
    # sweep.png is the last complete sweep's until this one ends
    csv_path = os.path.join(args.out_dir, "sweep.csv")
    partial, finished = partial_path(csv_path), []

    def keep(rows: list[dict]) -> None:
        with signals_held():  # a finished row is in the file, and counted, before a signal stops the run
            write_csv(rows, partial)
            finished[:] = [len(rows)]

    try:
        with torch.no_grad():
            rows = run_sweep([available[n] for n in names], steps=args.steps, temperatures=args.temperatures,
                             num_samples=args.num_samples, judge=judge,
                             vocab_size=loaded.vocab_size, seed=args.seed, batch_size=args.batch_size,
                             reference=reference, progress=args.progress, on_row=keep, judge_id=loaded.judge_id)
    except Interrupted as stop:
        stop.detail = f"; the {finished[0]} finished row(s) are in {partial}" if finished else \
            "; no row was finished, nothing written" + (f" ({partial} is an earlier run's)" if
                                                         os.path.exists(partial) else "")
        raise
    with one_set():
        paths = write_sweep(rows, args.out_dir)
    remove_partial(csv_path)
    args.stdout.print(sweep_markdown(rows))
    _report_paths(args, paths)


def _report_paths(args: argparse.Namespace, paths: dict[str, Optional[str]]) -> None:
    written = [p for k, p in paths.items() if p and k != "plot_skipped"]
    args.stdout.print("wrote " + ", ".join(written))
    if paths.get("plot_skipped"):
        print(f"ddpd-eval: plot skipped: {paths['plot_skipped']}", file=sys.stderr)


def run_merge(args: argparse.Namespace) -> None:
    """Run `ddpd-eval merge`: merge sweep files into one sweep's reports in --out-dir.

    Args:
        args: the parsed command line.
    """
    from ddpd.eval import merge_sweeps, read_sweep, write_sweep
    from ddpd.eval.quality import sweep_markdown
    from ddpd.eval.report import one_set

    rows = merge_sweeps([read_sweep(path) for path in args.sweeps], args.sweeps)
    with one_set():
        paths = write_sweep(rows, args.out_dir)
    args.stdout.print(sweep_markdown(rows))
    _report_paths(args, paths)


def run_compare(args: argparse.Namespace) -> None:
    """Run `ddpd-eval compare`: samplers against baselines at matched entropy, printed and
    written to --out.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: samplers or baselines empty or not in the sweep, or no step budget with
            rows of both.
    """
    from ddpd.eval import read_sweep
    from ddpd.eval.quality import REFERENCE, compare_markdown, matched_entropy
    from ddpd.eval.report import write_text

    rows = [r for r in read_sweep(args.sweep) if r["sampler"] != REFERENCE]
    present = list(dict.fromkeys(r["sampler"] for r in rows))
    samplers = args.samplers or [n for n in present if n.startswith(("ddpd-", "tau-planned-"))]
    baselines = args.baselines or [n for n in present if n.startswith(("dfm-", "maskgit"))]
    unknown = [n for n in samplers + baselines if n not in present]
    for flag, names, kinds in (("--samplers", samplers, "ddpd-* or tau-planned-*"),
                               ("--baselines", baselines, "dfm-* or maskgit")):
        if not names and not unknown:  # the defaults found none: an empty table would say nothing
            raise UsageError(f"compare: {args.sweep} has no {flag[2:-1]} rows ({kinds}) to compare; name them "
                             f"with {flag}; the sweep has {present}")
    if unknown:
        raise UsageError(f"compare: samplers {samplers} and baselines {baselines} must be in the sweep; not there: "
                         f"{unknown}; the sweep has {present}")
    budgets = sorted({r["steps"] for r in rows})
    table = [c for steps in budgets for b in baselines for s in samplers
             if (c := matched_entropy(rows, s, b, steps)) is not None]
    if not table:
        raise UsageError(f"compare: no step budget of {args.sweep} has rows of both a sampler {samplers} and a "
                         f"baseline {baselines}: nothing to compare")
    text = compare_markdown(table)
    if args.out:
        write_text(text, args.out)
    args.stdout.print(text)
    if args.out:
        args.stdout.print(f"wrote {args.out}")


def run_training(args: argparse.Namespace) -> None:
    """Run `ddpd-eval training`: the training runs' table, printed and written to --out-dir.

    Args:
        args: the parsed command line.
    """
    from ddpd.eval.report import one_set, write_json, write_text
    from ddpd.eval.training import training_markdown, training_rows

    rows = training_rows(args.runs)
    table = training_markdown(rows)
    paths = {"markdown": os.path.join(args.out_dir, "training.md"),
             "json": os.path.join(args.out_dir, "training.json")} if args.out_dir else {}
    if paths:
        with one_set():
            write_text(table, paths["markdown"])
            write_json(rows, paths["json"])
    args.stdout.print(table)
    if paths:
        _report_paths(args, paths)


# ---------------------------------------------------------------- convergence


def run_convergence(args: argparse.Namespace) -> None:
    """Run `ddpd-eval convergence`: the planner's noise estimate and the stopped fraction
    over the steps, written to --out-dir.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: no --planner, or not exactly one --denoiser.
    """
    import torch
    from tqdm.auto import tqdm

    from ddpd import sampling
    from ddpd.eval import PlannerRecorder, convergence_rows, stopped_fraction, write_convergence
    from ddpd.eval.report import one_set

    loaded = load_models(args)
    m = loaded.models
    kinds = [k for k in ("mask-denoiser", "uniform-denoiser") if k in m]
    if "planner" not in m or len(kinds) != 1:
        raise UsageError("convergence: give --planner and exactly one --denoiser")
    dtype = _prepare(loaded, args.dtype)
    recorder = PlannerRecorder(m["planner"], args.eps)
    eps = min(args.eps)  # the option-A run stops at the strictest criterion tracked
    common = dict(denoiser_type="mask" if kinds[0] == "mask-denoiser" else "uniform", steps=args.steps,
                  temperature=args.temperature, schedule=loaded.schedule, device=loaded.device,
                  execution=sampling.Execution(dtype=dtype))
    stops = []
    starts = range(0, args.num_samples, args.batch_size)
    with torch.no_grad():
        for first in tqdm(starts, desc="convergence", unit="batch", disable=None if args.progress else True):
            n = min(args.batch_size, args.num_samples - first)
            noise = sampling.PhiloxNoise(args.seed, first_row=first)
            recorder.start_run(n)  # option B: every sample runs (and is recorded) every step
            sampling.ddpd_sample(recorder, m[kinds[0]], n, loaded.seq_len, loaded.vocab_size,
                                 ddpd=sampling.DDPDOptions(stop="budget"), noise=noise, **common)
            result = sampling.ddpd_sample(m["planner"], m[kinds[0]], n, loaded.seq_len, loaded.vocab_size,
                                          ddpd=sampling.DDPDOptions(stop="eps", eps=eps), noise=noise, **common)
            stops.append(result.stop_step.cpu())
    rows = convergence_rows(recorder.rows(), stopped_fraction(torch.cat(stops), args.steps), eps)
    with one_set():
        paths = write_convergence(rows, args.out_dir)
    last = rows[-1]
    stopped = next(value for key, value in last.items() if key.startswith("stopped_eps_"))
    # the last row is the planner's look at step steps - 1, before that step's move
    args.stdout.print(f"at step {last['step']} of {args.steps} (before its move): noise left "
                      f"{last['noise_left']:.4f}, stopped (eps={eps}) {stopped:.3f}")
    _report_paths(args, paths)


COMMANDS = {"elbo": run_elbo, "quality": run_quality, "merge": run_merge, "compare": run_compare,
            "training": run_training, "convergence": run_convergence, "frontier": frontier.run}


# The numeric flags of every command with the bounds the evaluation enforces, checked
# before any model is loaded, so that a bad value is a usage error naming its flag
# (--seed by check_seed, in ddpd-sample's range).
INT_FLAGS = {"batch_size": (1, None), "num_sequences": (1, None), "mc_samples": (1, None),
             "num_samples": (1, None), "reference_sequences": (1, None), "steps": (1, None), "budgets": (1, None),
             "target_steps": (1, None)}
# name: (low, high, open below, open above); temperatures up to MAX_TEMPERATURE
FLOAT_FLAGS = {"t_max": (0.0, 1.0, True, True), "alpha": (0.0, 1.0, True, True), "eps": (0.0, 1.0, True, True),
               "temperature": (0.0, None, False, False), "temperatures": (0.0, None, False, False),
               "target_temperature": (0.0, None, False, False),
               "eta": (0.0, math.inf, False, True)}
# The lists of a sweep, each value one configuration: a value given twice would sample it twice
# and write rows that the sweep's readers refuse as repeated.
SWEEP_LISTS = ("samplers", "baselines", "policies", "steps", "budgets", "temperatures", "eta", "eps")


# The reports each command writes into --out-dir, published as one set (report.one_set)
# and locked for the whole run (locked_outputs); elbo and compare write --out (and its twin).
# quality's rows so far go to sweep.partial.csv (ddpd.files.partial_path) until the set is published.
REPORTS = {"quality": ("sweep.csv", "sweep.md", "sweep.png", "sweep.partial.csv"),
           "merge": ("sweep.csv", "sweep.md", "sweep.png"),
           "training": ("training.md", "training.json"), "convergence": ("convergence.csv", "convergence.png"),
           "frontier": frontier.REPORTS}


def report_files(args: argparse.Namespace) -> list[str]:
    """The files this run of the command may write.

    Args:
        args: the parsed command line.

    Returns:
        Their paths.
    """
    if args.command == "elbo":
        return [args.out, markdown_twin(args.out)] if args.out else []
    if args.command == "compare":
        return [args.out] if args.out else []
    out_dir = getattr(args, "out_dir", None)
    return [os.path.join(out_dir, name) for name in REPORTS[args.command]] if out_dir else []


@contextmanager
def locked_outputs(args: argparse.Namespace) -> Iterator[None]:
    """Hold the OutputLock of every report the command writes (as ddpd-sample holds its
    --out's), so that two evaluators on one --out-dir cannot mix their reports: the second
    is refused at its start, in one line naming the holder. A set of reports that a killed
    run left half renamed is finished first (ddpd.files.remove_stale_temps).

    Args:
        args: the parsed command line.

    Yields:
        None, with the locks held.
    """
    from ddpd.files import OutputLock, destination, remove_stale_temps

    with ExitStack() as locks:
        for path in dict.fromkeys(map(destination, report_files(args))):  # elbo's --out x.md is its own twin
            locks.enter_context(OutputLock(path))
            remove_stale_temps(path)
        yield


def markdown_twin(out: str) -> str:
    """Where elbo writes the Markdown of its JSON results `out`: beside it, as .md.

    Args:
        out: the --out path.

    Returns:
        The .md path.
    """
    return os.path.splitext(out)[0] + ".md"


def check_outputs(args: argparse.Namespace) -> None:
    """--out and --out-dir are checked before any model is loaded: a directory given as --out,
    a file in the way of --out-dir, an unwritable place fail at once, not after the work.

    Args:
        args: the parsed command line.

    Raises:
        OutputError: an output that cannot be written (ddpd.files.check_output).
    """
    from ddpd.files import check_output

    if getattr(args, "out", None):
        check_output(args.out)
        if args.command == "elbo":
            check_output(markdown_twin(args.out))
    if getattr(args, "out_dir", None):
        check_output(args.out_dir, directory=True)


def _values(args: argparse.Namespace, name: str) -> list:
    value = getattr(args, name, None)
    return [] if value is None else value if isinstance(value, list) else [value]


def check_command_line(args: argparse.Namespace) -> None:
    """What the command line alone decides, checked before torch is imported (check_first):
    the inputs it names (checkpoint directories, --data, sweep files) and its outputs.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: an empty output path, a bad --threads, a missing sweep file, no model to
            evaluate, an unusable or labelled --data, or an output that would replace an input.
        InputError: a checkpoint directory that is not there.
        OutputError: an output that cannot be written.
    """
    refuse_empty_paths(args, "out", "out_dir")
    if hasattr(args, "threads"):
        check_threads(args.threads)
    for path in _values(args, "sweeps") + _values(args, "sweep"):  # merge, compare: a missing input is a usage error
        if not os.path.isfile(path):
            raise UsageError(f"no such sweep file: {path}")
    check_checkpoints(*(path for _, path in _checkpoints(args)))
    _check_some_model(args)
    _refuse_reference_without_data(args)
    if getattr(args, "data", None) is not None:
        check_data(args.data)
        if is_labelled(args.data):
            raise UsageError(f"--data: {args.data} is a labelled corpus ({LABELLED_SUFFIX}); "
                             "ddpd-eval reads plain text")
    check_outputs(args)
    refuse_outputs_over_inputs(*_outputs_and_inputs(args))


def _check_some_model(args: argparse.Namespace) -> None:
    """A command that loads networks (elbo, quality, convergence) needs one to evaluate: a
    --judge alone is none."""
    if not hasattr(args, "planner") or args.planner or args.denoiser or getattr(args, "uniform", None):
        return
    # convergence takes no --uniform: naming it would send the user to an unrecognized argument
    hint = "--planner with --denoiser, and/or --uniform" if hasattr(args, "uniform") else \
        "--planner and exactly one --denoiser"
    raise UsageError(f"no model to evaluate: give {hint}")


def _refuse_reference_without_data(args: argparse.Namespace) -> None:
    """quality's --reference-sequences and --split choose the held-out text of --data: given off
    their defaults without --data they would be ignored (as --eta is refused without a dfm-eta)."""
    if args.command != "quality" or args.data is not None:
        return
    for flag, value, default in (("--reference-sequences", args.reference_sequences, DEFAULT_REFERENCE_SEQUENCES),
                                 ("--split", args.split, "test")):
        if value != default:
            raise UsageError(f"{flag} {value} chooses the held-out text of --data, and none is given: give --data "
                             f"or leave {flag} out")


def _outputs_and_inputs(args: argparse.Namespace) -> tuple[list, list, list]:
    """The arguments of refuse_outputs_over_inputs: the reports this run writes, the files and
    the checkpoint directories it reads, each with the flag that names it."""
    flag = "--out" if args.command in ("elbo", "compare") else "--out-dir"
    outputs = [(f"{flag} {getattr(args, flag[2:].replace('-', '_'))}", path) for path in report_files(args)]
    files = [(f"the sweep {path}", path) for path in _values(args, "sweeps") + _values(args, "sweep")]
    data = getattr(args, "data", None)
    if data is not None and os.path.isfile(data):  # a file of that name comes before the corpus of that name
        files.append((f"--data {data}", data))
    return outputs, files, _checkpoints(args)


def _checkpoints(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(the flag and value naming it, path) of every checkpoint directory the run reads: not
    an n-gram --judge (frontier.ngram_order), which names none."""
    names = {"checkpoint": "the bundle", "runs": "the run"}
    return [(f"{names.get(name, '--' + name)} {path}", path)
            for name in ("checkpoint", "planner", "denoiser", "uniform", "judge", "runs")
            for path in _values(args, name)
            if not (name == "judge" and frontier.ngram_order(path) is not None)]


def check_args(args: argparse.Namespace) -> None:
    """The numeric flags of every command against the bounds the evaluation enforces
    (--seed, INT_FLAGS, FLOAT_FLAGS), and the sweep's lists against repeats (SWEEP_LISTS), before any
    model is loaded.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: a value out of range or repeated, naming its flag.
    """
    from ddpd.sampling.options import MAX_TEMPERATURE
    from ddpd.validation import check_float, check_int

    values = functools.partial(_values, args)
    check_seed(getattr(args, "seed", None))
    try:
        for name, (low, high) in INT_FLAGS.items():
            for value in values(name):
                check_int("--" + name.replace("_", "-"), value, low, high)
        for name, (low, high, open_low, open_high) in FLOAT_FLAGS.items():
            for value in values(name):
                check_float("--" + name.replace("_", "-"), value, low, MAX_TEMPERATURE if high is None else high,
                            open_min=open_low, open_max=open_high)
    except (TypeError, ValueError) as err:
        raise UsageError(str(err)) from None
    for name in SWEEP_LISTS:
        given = _values(args, name)
        repeated = sorted({str(v) for v in given if given.count(v) > 1})
        if repeated:
            raise UsageError(f"--{name}: {', '.join(repeated)} given more than once (each value is one configuration)")


def main(argv: Optional[list[str]] = None) -> int:
    """The ddpd-eval entry point.

    Args:
        argv: the arguments, or None for sys.argv[1:].

    Returns:
        The exit status.
    """
    standard_streams()
    args = build_parser().parse_args(argv)
    args.stdout = Stdout()  # what the commands print: reports go on when its reader is gone

    status = check_first("ddpd-eval", lambda: check_command_line(args))
    if status is not None:
        return status

    def body() -> int:
        check_args(args)
        if hasattr(args, "threads"):
            apply_threads(args.threads)
        with locked_outputs(args):  # a second ddpd-eval writing the same reports is refused here
            COMMANDS[args.command](args)
        args.stdout.check("the files are written")
        return 0

    return run_tool("ddpd-eval", body)


if __name__ == "__main__":
    sys.exit(main())
