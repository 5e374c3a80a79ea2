r"""ddpd-eval frontier: judge NLL and entropy against network passes, sampler x policy x budget x temperature.

    ddpd-eval frontier --judge ngram --data data/wiki.txt --out-dir docs/parallel
    ddpd-eval frontier --model uniform --judge ngram --data data/wiki.txt --out-dir f/
    ddpd-eval frontier runs/bundle --judge runs/ar --policies error-budget:bound=2 threshold:0.9 \
        --budgets 16 32 64 128 --temperatures 0.9 1.0 --num-samples 64 --fused --out-dir f/

Every sampler of the bundle runs with its policies among --policies and its own default (unless
--no-defaults), at every pass budget and temperature, against the target (ddpd one at a time at
--target-steps); ddpd runs the planner + mask denoiser, or (--model uniform) the uniform model.
Writes frontier.csv after every configuration (a run into the same --out-dir resumes and adds to
it), and frontier.json, what the rows were measured with (another run's are refused). Then, from
the rows of this --seed and --num-samples, frontier.md (the rows, the passes each sampler needs to
reach the target, each ddpd policy against each baseline at matched entropy) and frontier.png.
docs/cli.md ("ddpd-eval frontier"): the details."""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from typing import Optional

from ddpd.cli.common import (
    InputError,
    Interrupted,
    UsageError,
    add_runtime_arguments,
    data_refusals,
    float_type,
    int_type,
    one_line,
)

DEFAULT_POLICIES = ["error-budget:bound=1,max_k=16", "error-budget:bound=4,max_k=16", "threshold:0.9",
                    "entropy-bound:1.0", "factor:1.0", "remdm:schedule=cap,eta=0.02"]
SETTINGS = "frontier.json"  # what every row of --out-dir was measured with beside its key
ROWS = "frontier.csv"
REPORTS = (ROWS, "frontier.md", "frontier.png", SETTINGS)
# Settings SETTINGS records since a later version: a file written before lacks them, and its rows,
# measured with unknown values, are taken as any run's (which then records its own).
LATER = ("batch_size", "fused", "model", "one_pass")
# What a user changes to change each setting, for the refusal of --out-dir's rows
# (judge_source: --data's corpus for an n-gram judge, --judge's weights for a checkpoint)
FLAGS = {"networks": "BUNDLE", "model": "--model", "one_pass": "--one-pass", "judge": "--judge",
         "judge_source": "--data", "eps": "--eps", "device": "--device", "batch_size": "--batch-size",
         "fused": "--fused"}
NGRAM_ORDER = 6  # the order of --judge ngram


def add_parser(sub) -> None:
    """Add the `frontier` subcommand and its flags to ddpd-eval.

    Args:
        sub: the subparsers of ddpd-eval's parser.
    """
    p = sub.add_parser("frontier", help="judge NLL and entropy against network passes: parallel decoding policies",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", nargs="?", help="a bundle directory (default: the bundled text8 models)")
    p.add_argument("--model", choices=("pair", "uniform"), default="pair",
                   help="the networks ddpd runs: pair, the bundle's planner + mask denoiser (default), or uniform, "
                        "its single uniform model (uniform/); the mask loop runs the mask denoiser either way")
    p.add_argument("--one-pass", dest="one_pass", action="store_true",
                   help="with --model uniform: each ddpd step draws from its planning pass, a pass a step "
                        "(DDPDOptions.one_pass)")
    p.add_argument("--judge", required=True,
                   help="an ar checkpoint directory, or ngram[:ORDER] built from --data (exactly: any other value "
                        "is a directory, and ./ngram names one)")
    p.add_argument("--data", help="the corpus, a file, books, text8 or hf:NAME[:CONFIG] (its train split builds an "
                                "ngram judge)")
    p.add_argument("--samplers", nargs="+", default=["ddpd", "maskgit"], choices=("ddpd", "maskgit"),
                   help="the samplers that run (default: ddpd maskgit)")
    p.add_argument("--policies", nargs="+", default=DEFAULT_POLICIES, metavar="SPEC",
                   help="policy specs NAME[:FIELD=VALUE,...] (ddpd.sampling.policies), each of a sampler in "
                        f"--samplers (default: {' '.join(DEFAULT_POLICIES)})")
    p.add_argument("--no-defaults", dest="defaults", action="store_false",
                   help="run only --policies, not each sampler's own default (ddpd one at a time, MaskGIT) at "
                        "every budget; the target still runs")
    p.add_argument("--budgets", nargs="+", type=int_type, default=[32, 64, 128, 256],
                   help="network-pass budgets per sample: a ddpd step is a denoiser pass, plus a planner pass on "
                        "the steps that plan (every step by default; see plan_every); a mask-loop step is one "
                        "pass. Budgets that buy a configuration the same steps give it one row, the first's "
                        "(default: 32 64 128 256)")
    p.add_argument("--temperatures", nargs="+", type=float_type, default=[1.0],
                   help="denoiser temperatures to sweep (default: 1.0)")
    p.add_argument("--target-steps", type=int_type, default=512, help="steps of the one-at-a-time target (default 512)")
    p.add_argument("--target-temperature", type=float_type, default=1.0, help="its temperature (default 1.0)")
    p.add_argument("--eps", type=float_type, default=0.01, help="the ddpd stop criterion (option A; default 0.01)")
    p.add_argument("--num-samples", type=int_type, default=16, help="samples a configuration (default 16)")
    p.add_argument("--seed", type=int_type, default=0, help="seed of the samplers' Philox noise (default 0)")
    p.add_argument("--batch-size", type=int_type, default=16, help="samples per batch (default 16)")
    p.add_argument("--fused", action="store_true",
                   help="every sampler on its fused path (the same samples with float32 networks)")
    add_runtime_arguments(p)
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (shown on a terminal only)")
    p.add_argument("--out-dir", required=True, help="where the reports go: " + ", ".join(REPORTS))


def run(args: argparse.Namespace) -> None:
    """Run `ddpd-eval frontier`: sample every policy at every budget, judge the samples and
    write the reports (REPORTS) in --out-dir.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: a bad flag value, or models that do not fit.
    """
    import torch

    from ddpd.eval import frontier as fr
    from ddpd.eval.report import MissingDependency, one_set, write_text

    if args.one_pass and args.model != "uniform":
        raise UsageError("--one-pass needs --model uniform: the pair's planner and denoiser are two passes a step")
    families = _policies(args)  # the arguments first: nothing is loaded for a bad one
    plan = _plan(args, families)
    order = _judge_order(args)
    bundle = _bundle(args.checkpoint, _roles(args))
    from ddpd.cli.common import resolve_device

    device = resolve_device(args.device)
    settings = _settings(args, bundle, order, device.type)
    networks, judge, shared = _networks(args, bundle, order, device)
    vocab, length = shared["vocab_size"], shared["seq_len"]
    if judge is None:
        judge = ngram_judge(args.data, order, shared)
    configs = _configs(args, plan, networks, vocab, length, device)
    csv_path = os.path.join(args.out_dir, ROWS)
    write_text(json.dumps(settings, indent=1) + "\n", os.path.join(args.out_dir, SETTINGS))
    try:
        with torch.no_grad():
            rows = fr.run_frontier(configs, judge=judge, vocab_size=vocab, num_samples=args.num_samples,
                                   seed=args.seed, batch_size=args.batch_size, csv_path=csv_path,
                                   progress=args.progress)
    except Interrupted as stop:  # the CSV holds every finished row: say so, and how to go on
        stop.detail = _kept(csv_path, configs, args)
        raise
    # the CSV's rows of this seed and sample count (earlier runs into --out-dir add to them): rows
    # of another seed in the same curve would make it zigzag
    rows = [r for r in fr.read_frontier(csv_path) if (r["seed"], r["num_samples"]) == (args.seed, args.num_samples)]
    targets = [r for r in rows if r["sampler"] == "ddpd" and r["policy"] == "one-at-a-time"
               and r["steps"] == args.target_steps]  # never empty: _plan puts the target first
    target = min(targets, key=lambda r: abs(float(r["temperature"]) - args.target_temperature))
    model = (" (the uniform model, one pass a step)" if args.one_pass else " (the uniform model)") \
        if args.model == "uniform" else ""
    label = f"ddpd one at a time{model}, {args.target_steps} steps, T={target['temperature']}"
    reach = _reach(rows, target, label)
    text = fr.frontier_markdown(rows, reach, label, fr.against_baselines(rows, _short))
    with one_set():
        write_text(text, os.path.join(args.out_dir, "frontier.md"))
        try:
            point = {"judge_nll": float(target["judge_nll"]), "entropy": float(target["entropy"])}
            fr.plot_frontier(rows, os.path.join(args.out_dir, "frontier.png"),
                             point if all(map(math.isfinite, point.values())) else None, _short)
        except MissingDependency as err:
            print(f"ddpd-eval: plot skipped: {err}", file=sys.stderr)
    args.stdout.print(text)  # a reader that went away (| head) is no failure: the reports are written


def _kept(csv_path: str, configs: list, args: argparse.Namespace) -> str:
    """What an interrupted sweep leaves: its own rows, apart from those of earlier sweeps (other
    seeds, other points) that the CSV also holds."""
    from ddpd.eval import frontier as fr

    every = fr.read_frontier(csv_path) if os.path.exists(csv_path) else []
    ours = len(fr.rows_of(every, configs, args.num_samples, args.seed))
    if not ours:
        return "; no configuration was finished"
    others = f" ({len(every)} in all)" if len(every) > ours else ""
    return (f"; the {ours} row(s) of this sweep measured so far are in {csv_path}{others}, and the same command "
            "resumes from them")


def _reach(rows: list[dict], target: dict, label: str) -> list[dict]:
    """passes_to_reach against the target row; none, with a warning, when the target's judge NLL or
    entropy is not finite (every family then read "not reached", without a word why)."""
    from ddpd.eval import frontier as fr

    nll, entropy = float(target["judge_nll"]), float(target["entropy"])
    if not (math.isfinite(nll) and math.isfinite(entropy)):
        print(f"ddpd-eval: warning: the target ({label}) has judge NLL {nll} and entropy {entropy}; "
              "the table of passes to reach it is left out", file=sys.stderr)
        return []
    return fr.passes_to_reach([r for r in rows if r is not target], nll, entropy, target=target, label=_short)


def _short(family: str) -> str:
    """A family's name in the tables and the legend: its policy's fields at their defaults left out."""
    from ddpd.sampling.policies import parse_policy, policy_spec

    sampler, _, spec = family.partition(" ")
    if spec == "one-at-a-time":
        return family
    try:
        return f"{sampler} {policy_spec(parse_policy(spec), defaults=False)}"
    except (ValueError, TypeError):  # a spec of another version of the policies
        return family


def _roles(args) -> dict:
    """{role: the kinds it may hold}: the bundle's directories the sweep loads. ddpd runs the
    planner + mask denoiser, or the single uniform model (--model uniform), beside which the
    mask loop, when --samplers runs it, needs the mask denoiser."""
    if args.model == "pair":
        return {"planner": ("planner",), "denoiser": ("mask-denoiser",)}
    return {"uniform": ("uniform",), **({"denoiser": ("mask-denoiser",)} if "maskgit" in args.samplers else {})}


def _bundle(path, roles: dict) -> str:
    """The bundle directory, `path` or the default one; UsageError where it lacks a role's
    directory (a pair's, or uniform/ with what the mask loop needs)."""
    if not path:
        from ddpd.pretrained import BundleNotFoundError, default_bundle

        try:
            path = default_bundle(own="a BUNDLE argument", model="uniform" if "uniform" in roles else "pair")
        except BundleNotFoundError as err:
            raise UsageError(str(err)) from None
    missing = [role for role in roles if not os.path.isdir(os.path.join(path, role))]
    if missing and "uniform" not in roles:
        raise UsageError(f"{path}: not a bundle (a planner/ and a denoiser/ checkpoint)")
    if missing:
        why = " (--samplers runs the mask loop on it)" if missing == ["denoiser"] else ""
        raise UsageError(f"--model uniform: the bundle {path} holds no {' and no '.join(r + '/' for r in missing)}"
                         f"{why}; python -m ddpd.pretrained PLANNER DENOISER --uniform DIR writes one with both")
    return path


def _settings(args, bundle: str, order, device: str) -> dict:
    """What the rows depend on beside their key: the networks, the judge (files by content, a
    corpus that needs no file by name), eps, the kind of device (its precision), the batch size
    and the path (near-ties of the confidence policies round with both). UsageError
    when --out-dir already holds rows measured with other settings: they would be taken for
    this run's and not measured again. A directory without SETTINGS or without frontier.csv
    (a run stopped before its first row) is taken as this run's, a SETTINGS without a setting
    recorded later (LATER) as of this run's value of it.

    Args:
        args: the parsed command line.
        bundle: the bundle directory.
        order: the n-gram judge's order, or None for a checkpoint judge.
        device: the device type ("cpu", "cuda").

    Returns:
        {name: value}, what SETTINGS records.
    """
    source = _digest(args.judge) if order is None else ngram_judge_source(args.data)
    # the pair's digest is of planner/ and denoiser/, as before --model, so that its rows stay valid;
    # the uniform model's of denoiser/ (where the bundle has one) and uniform/, whichever --samplers run
    roles = ["planner", "denoiser"] if args.model == "pair" else \
        [role for role in ("denoiser", "uniform") if os.path.isdir(os.path.join(bundle, role))]
    settings = {"networks": _digest(*(os.path.join(bundle, role) for role in roles)), "model": args.model,
                "one_pass": args.one_pass,
                "judge": "ar" if order is None else f"ngram:{order}", "judge_source": source, "eps": args.eps,
                "device": device, "batch_size": args.batch_size, "fused": args.fused}
    path = os.path.join(args.out_dir, SETTINGS)
    if os.path.exists(path) and os.path.exists(os.path.join(args.out_dir, ROWS)):
        before = _recorded_settings(path)
        changed = [name for name, value in settings.items()
                   if (name in before or name not in LATER) and before.get(name) != value]
        if changed:
            flags = dict(FLAGS, judge_source="--data" if order is not None else "--judge")
            named = ", ".join(f"{name} ({flags[name]})" for name in changed)
            raise UsageError(f"--out-dir {args.out_dir} holds a frontier measured with other {named} ({path}); use "
                             "another --out-dir")
    return settings


def _recorded_settings(path: str) -> dict:
    """The JSON object of an existing SETTINGS file; an InputError naming it when it is damaged
    (exit status 1, as a damaged frontier.csv beside it or a corrupt checkpoint)."""
    try:
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
        raise InputError(f"{path} is damaged (not JSON: {one_line(err)}); remove it, or use another "
                         "--out-dir") from None
    if not isinstance(before, dict):
        raise InputError(f"{path} is damaged (not a JSON object); remove it, or use another --out-dir")
    return before


def _digest(*paths: str) -> str:
    """sha256 (16 hex digits) of the files under paths, by relative name and content."""
    digest = hashlib.sha256()
    for root in paths:
        files = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, name) for d, _, names in os.walk(root) for name in names)
        for file in files:
            digest.update(os.path.relpath(file, root).encode() + b"\0")
            content = hashlib.sha256()
            with open(file, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):  # a checkpoint need not fit in memory
                    content.update(chunk)
            digest.update(content.digest())
    return digest.hexdigest()[:16]


def ngram_order(judge: str) -> Optional[int]:
    """The order of an n-gram --judge, `ngram` (NGRAM_ORDER) or `ngram:ORDER`, or None for a
    checkpoint directory: any other value, so that a directory named `ngram_ar` is one.

    Args:
        judge: the value of --judge.

    Returns:
        The order as given (its range is _judge_order's to check), or None.

    Raises:
        UsageError: `ngram:` and no digits after it (`ngram:`, `ngram:x`), and no such directory.
    """
    spec = re.fullmatch(r"ngram(?::([0-9]+))?", judge)
    if spec:
        return int(spec.group(1) or NGRAM_ORDER)
    if re.fullmatch(r"ngram:[^/]*", judge) and not os.path.isdir(judge):  # a spec mistyped, not a path
        raise UsageError(f"--judge must be a checkpoint directory or ngram[:ORDER], got {judge!r}")
    return None


def _judge_order(args):
    """The n-gram order of --judge ngram[:ORDER], or None for a checkpoint (with which --data,
    read by nothing else, would be ignored: a UsageError)."""
    order = ngram_judge_order(args.judge, args.data)
    if order is None and args.data is not None:
        raise UsageError(f"--data builds an ngram judge, and --judge {args.judge} is a checkpoint: leave --data "
                         "out (or give --judge ngram[:ORDER])")
    return order


def ngram_judge_order(judge: str, data: Optional[str]) -> Optional[int]:
    """The order of --judge ngram[:ORDER], checked against its range and for the --data it is
    built from; None for a checkpoint judge.

    Args:
        judge: the value of --judge.
        data: the value of --data, or None.

    Returns:
        The order, or None.

    Raises:
        UsageError: an order out of range, or an n-gram judge without --data.
    """
    from ddpd.eval.ngram import MAX_ORDER as MAX_NGRAM_ORDER

    order = ngram_order(judge)
    if order is None:
        return None
    if not 1 <= order <= MAX_NGRAM_ORDER:
        raise UsageError(f"--judge must be a checkpoint directory or ngram[:ORDER] with ORDER in "
                         f"[1, {MAX_NGRAM_ORDER}], got {judge!r}")
    if not data:
        raise UsageError("--judge ngram needs --data (its train split builds the judge)")
    return order


def _networks(args, bundle: str, order, device):
    """({role: network} of _roles, the AR judge or None for an n-gram one, their shared facts):
    checked, before any sampling, to share the vocabulary, tokenizer and length (as ddpd-sample
    and ddpd-eval quality check theirs)."""
    from ddpd.cli.common import load_role, max_length, shared_facts, warn_if_lengths_differ

    loaded = {role: load_role(role, path, kinds, device, name=f"the bundle's {role}/ ({path})")
              for role, kinds in _roles(args).items() for path in [os.path.join(bundle, role)]}
    entries = [(os.path.join(bundle, role), config) for role, (_, config) in loaded.items()]
    judge = None
    if order is None:
        judge, judge_config = load_role("judge", args.judge, ("ar",), device)
        entries.append((f"--judge {args.judge}", judge_config))
    shared = shared_facts(entries)
    warn_if_lengths_differ("ddpd-eval", shared["seq_lens"])
    if judge is not None and max_length(judge_config) - 1 < shared["seq_len"]:
        raise UsageError(f"--judge: scores sequences of up to {max_length(judge_config) - 1} tokens, "
                         f"the samples have {shared['seq_len']}")
    return {role: network for role, (network, _) in loaded.items()}, judge, shared


def ngram_judge(data: str, order: int, shared: dict):
    """The n-gram judge of --judge ngram:ORDER, built from the train split of --data.

    Args:
        data: the value of --data.
        order: the n-gram order (ngram_judge_order).
        shared: the networks' shared facts (ddpd.cli.common.shared_facts): tokenizer, vocab_size.

    Returns:
        The ddpd.eval.ngram.NGramJudge.

    Raises:
        UsageError: networks that record no tokenizer, or a train split too short for `order`.
    """
    from ddpd.eval.ngram import NGramJudge
    from ddpd.training.data import load_splits, tokenizer_from_config

    if shared["tokenizer"] is None:
        raise UsageError("the networks' checkpoints do not record their tokenizer; cannot encode --data for "
                         "--judge ngram")
    with data_refusals(data):
        train = load_splits(data, tokenizer_from_config(shared["tokenizer"]))["train"]
    if train.numel() <= order:  # NGramJudge's own error would name neither the flag nor the file
        raise UsageError(f"--data {data}: its train split holds {train.numel()} "
                         f"token{'' if train.numel() == 1 else 's'}, too few for --judge ngram:{order} (it needs "
                         f"more than {order})")
    return NGramJudge(train, shared["vocab_size"], order)


def ngram_judge_source(data: str) -> str:
    """What names the corpus of an n-gram judge in a report: the digest of the file or
    directory --data resolves to, else the corpus name (books, hf:NAME).

    Args:
        data: the value of --data.

    Returns:
        A 16-hex-digit digest or the corpus name.
    """
    from ddpd.training.sources import resolve_source

    path = resolve_source(data)
    return _digest(path) if os.path.exists(path) else path


def _policies(args) -> dict:
    """{family: [policy, ...]}: each family's own default (unless --no-defaults), then its --policies."""
    from ddpd.sampling.policies import ErrorBudget, MaskGIT, parse_policy

    by_family = {"ddpd": [None], "maskgit": [MaskGIT()]} if args.defaults else {"ddpd": [], "maskgit": []}
    for spec in args.policies:
        try:
            policy = parse_policy(spec)
        except ValueError as err:
            raise UsageError(f"--policies: {err}") from None
        family = "ddpd" if isinstance(policy, ErrorBudget) else "maskgit"  # parse_policy strips the name
        if family in args.samplers:
            by_family[family].append(policy)
        elif args.policies is not DEFAULT_POLICIES:  # the defaults of a sampler left out are left out
            raise UsageError(f"--policies {spec} is a policy of the {family} sampler, which --samplers leaves out")
    return by_family


def _steps(family: str, policy, budget: int, one_pass: bool = False) -> int:
    """The steps that cost `budget` network passes: a mask-loop step is one pass, and so is a
    ddpd step with one_pass (--one-pass)."""
    from ddpd.sampling.policies import ddpd_steps

    return ddpd_steps(budget, policy, one_pass) if family == "ddpd" else budget


def _name(family: str, policy) -> str:
    """A sampler and policy as the reports name them."""
    from ddpd.sampling.policies import policy_spec

    return _short(f"{family} {'one-at-a-time' if policy is None else policy_spec(policy)}")


def _plan(args, by_family: dict) -> dict:
    """{(family, policy, steps, temperature): budget}, the target first: every budget of
    --budgets, each turned into the steps it buys. A budget below one ddpd step's cost is a
    UsageError (it bought a step all the same, labelled a budget it overspent); budgets that buy
    a configuration the same steps give one row, the first's, which a warning says."""
    from ddpd.sampling.policies import ddpd_passes

    plan = {("ddpd", None, args.target_steps, args.target_temperature): [ddpd_passes(args.target_steps, None,
                                                                                     args.one_pass)]}
    for family in args.samplers:
        for policy in by_family[family]:
            least = ddpd_passes(1, policy, args.one_pass) if family == "ddpd" else 1
            for budget in args.budgets:
                if budget < least:
                    raise UsageError(f"--budgets {budget} buys no step of {_name(family, policy)}: one costs "
                                     f"{least} network passes")
                steps = _steps(family, policy, budget, args.one_pass)
                _check_table(family, policy, budget, steps)
                for temperature in args.temperatures:
                    budgets = plan.setdefault((family, policy, steps, temperature), [])
                    if budget not in budgets:
                        budgets.append(budget)
    _warn_collapsed(args, plan)
    return {key: budgets[0] for key, budgets in plan.items()}


def _check_table(family: str, policy, budget: int, steps: int) -> None:
    """UsageError naming --budgets where the steps a budget buys exceed the step table of the
    policy (MaskGIT's and the cosine spread's cosines, ReMDM's rates), which the sampler refused
    only when the configuration ran, after the ones before it had been sampled."""
    from ddpd.sampling.policies import MAX_TABLE_STEPS, ErrorBudget, MaskGIT, ReMDM

    tabled = isinstance(policy, (MaskGIT, ReMDM)) or (isinstance(policy, ErrorBudget) and policy.spread == "cosine")
    if tabled and steps > MAX_TABLE_STEPS:
        raise UsageError(f"--budgets {budget} buys {_name(family, policy)} {steps} steps, more than its step table "
                         f"holds ({MAX_TABLE_STEPS})")


def _warn_collapsed(args, plan: dict) -> None:
    """One line on stderr for each configuration that two budgets give the same steps."""
    said = set()
    target = ("ddpd", None, args.target_steps, args.target_temperature)
    for key, budgets in plan.items():
        family, policy, steps, temperature = key
        if len(budgets) < 2 or (family, policy, steps, tuple(budgets)) in said:
            continue
        said.add((family, policy, steps, tuple(budgets)))
        if key == target:  # at the target's temperature alone
            named = (f"--budgets {', '.join(map(str, budgets[1:]))} and the target (--target-steps "
                     f"{args.target_steps}, {budgets[0]} passes)")
            where = f" at T={temperature:g}"
        else:
            named, where = f"--budgets {', '.join(map(str, budgets[:-1]))} and {budgets[-1]}", ""
        print(f"ddpd-eval: warning: {named} give {_name(family, policy)} the same {steps} steps{where}: the "
              f"rows of budget {budgets[0]} stand for {'both' if len(budgets) == 2 else 'all'}", file=sys.stderr)


def _configs(args, plan: dict, networks: dict, vocab: int, length: int, device) -> list:
    from ddpd.eval.frontier import Config
    from ddpd.sampling import DDPDOptions, Execution, ddpd_sample, ddpd_sample_uniform, mask_sample
    from ddpd.sampling.policies import policy_spec

    execution = Execution(fused=args.fused)

    def runner(family, policy, steps, temperature):
        def go(n, first):
            from ddpd.sampling import PhiloxNoise

            # the run's tensors on the networks' device: a time on the CPU fails the uniform model on a GPU
            shared = dict(steps=steps, temperature=temperature, noise=PhiloxNoise(args.seed, first_row=first),
                          execution=execution, device=device)
            if family != "ddpd":
                return mask_sample(networks["denoiser"], n, length, vocab, policy=policy, **shared)
            ddpd = DDPDOptions(eps=args.eps, policy=policy, one_pass=args.one_pass)
            if "uniform" in networks:
                return ddpd_sample_uniform(networks["uniform"], n, length, vocab, ddpd=ddpd, **shared)
            return ddpd_sample(networks["planner"], networks["denoiser"], n, length, vocab, denoiser_type="mask",
                               ddpd=ddpd, **shared)
        return go

    return [Config(family, "one-at-a-time" if policy is None else policy_spec(policy), steps, temperature,
                   runner(family, policy, steps, temperature), budget)
            for (family, policy, steps, temperature), budget in plan.items()]
