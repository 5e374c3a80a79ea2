"""ddpd-sample: draw sequences from trained ddpd models and decode them.

    ddpd-sample --fused
    ddpd-sample --checkpoint runs/bundle --steps 256 --num-samples 16 --out samples.jsonl
    ddpd-sample --planner runs/planner --denoiser runs/mask-denoiser --option A+B+C --steps 512
    ddpd-sample --checkpoint runs/mask-denoiser --sampler tau-leaping --eta 15 --steps 1024
    ddpd-sample --checkpoint runs/mask-denoiser --sampler maskgit --steps 16
    ddpd-sample --checkpoint runs/bundle --fused --sync-every 8 --num-samples 512 --batch-size 256

--checkpoint is a sampling bundle (planner/ and denoiser/ checkpoints) or a single
checkpoint written by ddpd-train. With none of --checkpoint/--planner/--denoiser the
default bundle of ddpd.pretrained is used (the text8 planner + mask denoiser shipped
with the package, see docs/pretrained.md, or the bundle in $DDPD_PRETRAINED_DIR),
with 256 characters, --steps 512 and --num-samples 4 unless given. Which sampler a set of models supports:
  ddpd:        planner + uniform-denoiser or mask-denoiser; or one uniform model
  tau-leaping: one mask-denoiser (DFM, --eta); one uniform model (DFM-Uni);
               planner + uniform-denoiser or mask-denoiser (P x D)
  maskgit:     one mask-denoiser
Samples are printed decoded and, with --out, written as JSON lines
{"index", "text", "tokens", "steps", "stop_step"}. Sample i draws its noise from
Philox row i of --seed, so it does not depend on --batch-size.

--fused runs the fused path of the sampler (ddpd.sampling.fused): the same samples
from the same seed, with the per-step work in the ddpd.ops kernels, the denoiser's
output head applied at the denoised positions only, and rows that stop early
leaving the batch at a stop check every --sync-every steps (the only host
synchronisation). Not available for ddpd with one uniform model or --clock exact.
The summary line on stderr gives samples/s, forward passes, row-evaluations run
(sequences through each model) and those early stopping saved.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import sys
import time
from typing import List, Optional

import torch

SAMPLERS = ("ddpd", "tau-leaping", "maskgit")
NUM_SAMPLES, NUM_SAMPLES_BUNDLED = 8, 4
# With the bundled model, a step budget of twice the length: option A then stops on
# the planner (every p(z = N) < eps) rather than on the budget.
BUNDLED_STEPS_PER_TOKEN = 2


class _OneLineParser(argparse.ArgumentParser):
    """Argument errors as a single line on stderr (exit status 2), no usage dump."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}\n")


class UsageError(Exception):
    """A problem with the command line or the models given: reported in one line, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="ddpd-sample", description=__doc__.split("\n\n")[0])
    models = p.add_argument_group("models (default: the bundled text8 planner + mask denoiser, ddpd.pretrained)")
    models.add_argument("--checkpoint", help="a bundle (planner/ + denoiser/) or a single checkpoint directory")
    models.add_argument("--planner", help="planner checkpoint directory")
    models.add_argument("--denoiser", help="denoiser checkpoint directory (mask-denoiser, uniform-denoiser, uniform)")
    p.add_argument("--sampler", choices=SAMPLERS, default="ddpd")
    p.add_argument("--steps", type=int, help="step budget T (default: the sequence length; twice that with the "
                                             "bundled default model)")
    p.add_argument("--length", type=int, help="sequence length D (default: the models' max_seq_len)")
    p.add_argument("--num-samples", dest="num_samples", type=int,
                   help=f"default {NUM_SAMPLES}; {NUM_SAMPLES_BUNDLED} with the bundled default model")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0, help="denoiser logit temperature")
    p.add_argument("--temperature-end", dest="temperature_end", type=float,
                   help="anneal the temperature linearly to this value over the steps")
    p.add_argument("--out", help="write the samples to this JSONL file")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--quiet", action="store_true", help="do not print the samples")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (shown on a terminal: one tick per denoiser pass)")
    p.add_argument("--fused", action="store_true",
                   help="fused path: ops kernels, head at the denoised positions only, early-stop compaction "
                        "(same samples as without)")
    p.add_argument("--sync-every", dest="sync_every", type=int, default=8,
                   help="--fused: steps between stop checks, where finished rows leave the batch (default 8)")
    ddpd = p.add_argument_group("ddpd sampler (appendix 'Implementation details': A, +B, +C)")
    ddpd.add_argument("--option", help="letters of A, B, C: B runs the whole budget, C selects by softmax "
                                       "(e.g. A, A+B, A+B+C); overrides --stop and --selection")
    ddpd.add_argument("--stop", choices=("eps", "budget"), help="eps (A, default) or budget (B)")
    ddpd.add_argument("--selection", choices=("sigmoid", "softmax"), default="sigmoid",
                      help="sigmoid (A, default) or softmax (C) of the planner logits")
    ddpd.add_argument("--eps", type=float, default=0.01, help="stop when every p(z = N) < eps (option A)")
    ddpd.add_argument("--k", type=int, default=1, help="positions denoised per step in the parallel stage")
    ddpd.add_argument("--parallel-steps", dest="parallel_steps", type=int, default=0,
                      help="steps that denoise --k positions before one-at-a-time refinement")
    ddpd.add_argument("--clock", choices=("planner", "exact"), default="planner",
                      help="planner: time estimated from the planner (paper); exact: exact CTMC clock")
    ddpd.add_argument("--t-end", dest="t_end", type=float, default=1.0 - 1e-4, help="end time of --clock exact")
    baselines = p.add_argument_group("baselines")
    baselines.add_argument("--eta", type=float, default=0.0, help="remasking stochasticity of mask tau-leaping")
    baselines.add_argument("--choice-temperature", dest="choice_temperature", type=float, default=4.5,
                           help="MaskGIT: scale of the Gumbel noise on the confidences")
    return p


def parse_option(option: str) -> dict:
    """--option letters -> ddpd_sample keyword arguments (A: eps stop + sigmoid selection)."""
    letters = set(option.upper().replace("+", ""))
    if not letters or not letters <= set("ABC"):
        raise UsageError(f"--option must combine the letters A, B, C (e.g. A+B+C), got {option!r}")
    return {"stop": "budget" if "B" in letters else "eps", "selection": "softmax" if "C" in letters else "sigmoid"}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return device


class Models:
    """The loaded networks by role, their configs, and what they imply (V, D, schedule, tokenizer)."""

    def __init__(self, planner, denoiser, planner_config: Optional[dict], denoiser_config: Optional[dict]):
        self.planner, self.denoiser = planner, denoiser
        self.planner_config, self.denoiser_config = planner_config, denoiser_config
        self.config = denoiser_config or planner_config
        self.bundled = False  # the default bundle of ddpd.pretrained, not models the user named
        self.kind = denoiser_config["kind"] if denoiser_config else None
        self.vocab_size = int(self.config["model"]["out_dim"]) if denoiser_config else \
            int(planner_config["model"]["vocab_size"])
        self.max_length = min(int(c["model"]["max_seq_len"]) for c in (planner_config, denoiser_config) if c)
        if planner_config and denoiser_config:
            self._check_pair()

    def _check_pair(self) -> None:
        v = int(self.planner_config["model"]["vocab_size"])
        if v != self.vocab_size:
            raise UsageError(f"the planner reads {v} symbols but the denoiser predicts {self.vocab_size}")
        if self.planner_config.get("tokenizer") != self.denoiser_config.get("tokenizer"):
            raise UsageError("the planner and the denoiser were trained with different tokenizers")
        if self.planner_config.get("schedule", "linear") != self.denoiser_config.get("schedule", "linear"):
            raise UsageError("the planner and the denoiser were trained with different schedules")

    def tokenizer(self):
        from ddpd.training.data import tokenizer_from_config

        config = self.config.get("tokenizer")
        return None if config is None else tokenizer_from_config(config)


def load_models(args, device: torch.device) -> Models:
    from ddpd.checkpoint import load_bundle, load_model

    if args.checkpoint and (args.planner or args.denoiser):
        raise UsageError("give either --checkpoint or --planner/--denoiser, not both")
    if args.checkpoint:
        if os.path.isdir(os.path.join(args.checkpoint, "planner")) or \
                os.path.isdir(os.path.join(args.checkpoint, "denoiser")):
            planner, denoiser, configs = load_bundle(args.checkpoint, device=str(device))
            return Models(planner, denoiser, configs["planner"], configs["denoiser"])
        model, config = load_model(args.checkpoint, device=str(device))
        if config["kind"] == "planner":
            raise UsageError(f"{args.checkpoint} holds a planner only: give a denoiser too (--planner/--denoiser)")
        return Models(None, model, None, config)
    if not args.planner and not args.denoiser:
        return _load_default_bundle(device)
    if not args.denoiser:
        raise UsageError("--planner needs a --denoiser")
    denoiser, denoiser_config = load_model(args.denoiser, device=str(device))
    planner, planner_config = (None, None)
    if args.planner:
        planner, planner_config = load_model(args.planner, device=str(device))
        if planner_config["kind"] != "planner":
            raise UsageError(f"--planner {args.planner} holds a {planner_config['kind']!r} model, not a planner")
    return Models(planner, denoiser, planner_config, denoiser_config)


def _load_default_bundle(device: torch.device) -> Models:
    from ddpd.checkpoint import load_bundle
    from ddpd.pretrained import BundleNotFoundError, default_bundle

    try:
        path = default_bundle()
    except BundleNotFoundError as err:
        raise UsageError(str(err)) from None
    planner, denoiser, configs = load_bundle(path, device=str(device))
    models = Models(planner, denoiser, configs["planner"], configs["denoiser"])
    models.bundled = True
    return models


def make_sampler(args, models: Models):
    """A function (batch_size, noise) -> SampleResult for the chosen sampler and models."""
    from ddpd import sampling

    kind = models.kind
    planner = models.planner if models.planner_config and models.planner_config["kind"] == "planner" else None
    common = dict(steps=args.steps, temperature=args.temperature, temperature_end=args.temperature_end,
                  schedule=models.config.get("schedule", "linear"), device=args.device_obj)
    # The fused path's options: every sampler but the single-model DDPD; sync_every where rows stop early.
    fused = dict(fused=True) if args.fused else {}
    stops = dict(fused, sync_every=args.sync_every) if args.fused else {}
    D, V = args.length, models.vocab_size
    if args.sampler == "ddpd":
        options = dict(stop=args.stop, selection=args.selection, eps=args.eps, k=args.k,
                       parallel_steps=args.parallel_steps, clock=args.clock, t_end=args.t_end)
        if args.option:
            options.update(parse_option(args.option))
        if kind == "uniform" and planner is None:
            if args.fused:
                raise UsageError("--fused is not available for --sampler ddpd with one uniform model")
            return lambda n, noise: sampling.ddpd_sample_uniform(models.denoiser, n, D, V, noise=noise, **options,
                                                                 **common)
        if planner is not None and kind in ("mask-denoiser", "uniform-denoiser"):
            denoiser_type = "mask" if kind == "mask-denoiser" else "uniform"
            return lambda n, noise: sampling.ddpd_sample(planner, models.denoiser, n, D, V, noise=noise,
                                                         denoiser_type=denoiser_type, **options, **stops, **common)
        raise UsageError(f"--sampler ddpd needs a planner with a mask-denoiser or uniform-denoiser, or one uniform "
                         f"model; got {_describe(models)}")
    if args.sampler == "tau-leaping":
        if planner is not None and kind in ("mask-denoiser", "uniform-denoiser"):
            denoiser_type = "mask" if kind == "mask-denoiser" else "uniform"
            return lambda n, noise: sampling.tau_leaping_planned(planner, models.denoiser, n, D, V, noise=noise,
                                                                 denoiser_type=denoiser_type, **fused, **common)
        if planner is None and kind == "mask-denoiser":
            return lambda n, noise: sampling.tau_leaping_mask(models.denoiser, n, D, V, noise=noise, eta=args.eta,
                                                              **stops, **common)
        if planner is None and kind == "uniform":
            return lambda n, noise: sampling.tau_leaping_uniform(models.denoiser, n, D, V, noise=noise, **fused,
                                                                 **common)
        raise UsageError(f"--sampler tau-leaping needs one mask-denoiser, one uniform model, or a planner with a "
                         f"denoiser; got {_describe(models)}")
    if planner is None and kind == "mask-denoiser":
        return lambda n, noise: sampling.maskgit_sample(models.denoiser, n, D, V, noise=noise,
                                                        choice_temperature=args.choice_temperature, **fused,
                                                        **common)
    raise UsageError(f"--sampler maskgit needs one mask-denoiser; got {_describe(models)}")


def _describe(models: Models) -> str:
    parts = [f"{role} {c['kind']!r}" for role, c in (("planner", models.planner_config),
                                                    ("denoiser", models.denoiser_config)) if c]
    return " and ".join(parts)


def check_args(args) -> None:
    if args.num_samples is not None and args.num_samples < 1:
        raise UsageError(f"--num-samples must be >= 1, got {args.num_samples}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed must be in [0, 2**63), got {args.seed}")
    if args.sync_every < 1:
        raise UsageError(f"--sync-every must be >= 1, got {args.sync_every}")


def run(args) -> int:
    from ddpd.sampling import PhiloxNoise

    check_args(args)
    args.device_obj = resolve_device(args.device)
    models = load_models(args, args.device_obj)
    if args.length is None:
        args.length = models.max_length
    if not 1 <= args.length <= models.max_length:
        raise UsageError(f"--length must be in [1, {models.max_length}] (the models' max_seq_len), got {args.length}")
    if args.steps is None:
        args.steps = args.length * (BUNDLED_STEPS_PER_TOKEN if models.bundled else 1)
    if args.num_samples is None:
        args.num_samples = NUM_SAMPLES_BUNDLED if models.bundled else NUM_SAMPLES
    tokenizer = models.tokenizer()
    if tokenizer is not None and tokenizer.vocab_size != models.vocab_size:
        raise UsageError(f"the tokenizer has {tokenizer.vocab_size} symbols but the models {models.vocab_size}")
    sample = make_sampler(args, models)

    records = []
    calls = dict.fromkeys(("planner_calls", "denoiser_calls", "planner_rows", "denoiser_rows", "planner_rows_saved",
                           "denoiser_rows_saved"), 0)
    if args.fused:
        # The first call of any torch.library custom op imports torch._dynamo (about
        # 2 s, once per process); like model loading, keep it out of samples/s.
        importlib.import_module("torch._dynamo")
    start = time.perf_counter()
    with torch.inference_mode(), _progress(args, models) as advance:
        for batch, first in enumerate(range(0, args.num_samples, args.batch_size)):
            n = min(args.batch_size, args.num_samples - first)
            result = sample(n, PhiloxNoise(args.seed, first_row=first))
            advance((batch + 1) * args.steps)  # a batch that stopped early ends its share of the bar
            for key in calls:
                calls[key] += getattr(result, key)
            for row in range(n):
                tokens = result.tokens[row].tolist()
                records.append({"index": first + row, "text": tokenizer.decode(tokens) if tokenizer else None,
                                "tokens": tokens, "steps": result.steps, "stop_step": int(result.stop_step[row])})
    elapsed = time.perf_counter() - start

    if not args.quiet:
        for r in records:
            print(r["text"] if r["text"] is not None else " ".join(map(str, r["tokens"])))
    if args.out:
        _write_jsonl(args.out, records)
    rate = args.num_samples / elapsed if elapsed > 0 else math.inf
    passes = ", ".join(f"{model} {calls[model + '_calls']} ({calls[model + '_rows']} row-evaluations, "
                       f"{calls[model + '_rows_saved']} saved by early stopping)" for model in ("planner", "denoiser"))
    print(f"ddpd-sample: {args.num_samples} samples of {args.length} tokens in {elapsed:.2f} s ({rate:.2f} samples/s)"
          f"{', fused' if args.fused else ''}; forward passes: {passes}", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _progress(args, models: Models):
    """A progress bar over the step budget of every batch, ticked by each forward pass
    of the denoiser (one per step in every sampler); yields advance(to) for the end of a
    batch. tqdm shows it on a terminal only, or never with --no-progress."""
    from tqdm.auto import tqdm

    batches = -(-args.num_samples // args.batch_size)
    bar = tqdm(total=args.steps * batches, desc="ddpd-sample", unit="step", leave=False,
               disable=None if args.progress else True)
    network = models.denoiser if models.denoiser is not None else models.planner
    embed = getattr(getattr(network, "backbone", None), "embed", None)

    def tick(*_) -> None:  # a forward hook must return None, or it replaces the output
        bar.update(1)

    # every forward pass of a ddpd network (forward or hidden) embeds its tokens once
    hook = embed.register_forward_hook(tick) if isinstance(embed, torch.nn.Module) else None

    def advance(to: int) -> None:
        bar.update(max(to - bar.n, 0))

    try:
        yield advance
    finally:
        if hook is not None:
            hook.remove()
        bar.close()


def _write_jsonl(path: str, records: List[dict]) -> None:
    """Written to a temporary file then renamed: never a half-written output."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"--out {path}: directory {directory} does not exist")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(tmp, path)


def main(argv: Optional[List[str]] = None) -> int:
    from ddpd.checkpoint import CheckpointError

    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (CheckpointError, OSError) as err:
        print(f"ddpd-sample: error: {err}", file=sys.stderr)
        return 1
    except (UsageError, ValueError, TypeError) as err:  # the samplers' argument checks
        print(f"ddpd-sample: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
