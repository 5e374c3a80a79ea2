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
The summary line on stderr gives samples/s (sampling only: loading the models and
the C++ extension is not counted), forward passes, and row-evaluations: how many
sequences went through each model in all (a forward pass over a batch of B rows
counts B), and how many early stopping saved (rows that had stopped and left the
batch; the non-fused path saves none).

--out streams: every finished batch is appended to a temporary file beside FILE and
flushed, and the file is renamed to FILE at the end, so FILE is never half written and
memory stays bounded for any --num-samples. Interrupted (Ctrl-C, SIGTERM, SIGHUP),
the samples finished so far are published to FILE and the one-line message says how
many; a reader of stdout that went away (`| head`) does not stop the file. --threads
sets the CPU threads (default $OMP_NUM_THREADS if set, else 1: see ddpd.cli.common).
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

from ddpd.cli.common import (OneLineParser, Stdout, UsageError, add_runtime_arguments, apply_threads, check_finite,
                             load_role, resolve_device, run_tool, shared_facts)

SAMPLERS = ("ddpd", "tau-leaping", "maskgit")
NUM_SAMPLES, NUM_SAMPLES_BUNDLED = 8, 4
# With the bundled model, a step budget of twice the length: option A then stops on
# the planner (every p(z = N) < eps) rather than on the budget.
BUNDLED_STEPS_PER_TOKEN = 2


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="ddpd-sample", description=__doc__.split("\n\n")[0])
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
    p.add_argument("--out", help="write the samples to this JSONL file (streamed, published atomically)")
    add_runtime_arguments(p)
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


class Models:
    """The loaded networks by role, their configs, and what they imply (V, D, schedule, tokenizer)."""

    def __init__(self, planner, denoiser, planner_config: Optional[dict], denoiser_config: Optional[dict],
                 names=("the planner", "the denoiser")):
        self.planner, self.denoiser = planner, denoiser
        self.planner_config, self.denoiser_config = planner_config, denoiser_config
        self.config = denoiser_config or planner_config
        self.bundled = False  # the default bundle of ddpd.pretrained, not models the user named
        self.kind = denoiser_config["kind"] if denoiser_config else None
        configs = [(name, c) for name, c in zip(names, (planner_config, denoiser_config)) if c]
        self.vocab_size = int(shared_facts(configs)["vocab_size"])  # also checks that the two agree
        self.max_length = min(int(c["model"]["max_seq_len"]) for _, c in configs)

    def tokenizer(self):
        from ddpd.training.data import tokenizer_from_config

        config = self.config.get("tokenizer")
        return None if config is None else tokenizer_from_config(config)


def load_models(args, device: torch.device) -> Models:
    from ddpd.checkpoint import DENOISER_KINDS, load_bundle, load_model

    if args.checkpoint and (args.planner or args.denoiser):
        raise UsageError("give either --checkpoint or --planner/--denoiser, not both")
    if args.checkpoint:
        if os.path.isdir(os.path.join(args.checkpoint, "planner")) or \
                os.path.isdir(os.path.join(args.checkpoint, "denoiser")):
            planner, denoiser, configs = load_bundle(args.checkpoint, device=str(device))
            return Models(planner, denoiser, configs["planner"], configs["denoiser"],
                          (f"{args.checkpoint}/planner", f"{args.checkpoint}/denoiser"))
        model, config = load_model(args.checkpoint, device=str(device))
        if config["kind"] == "planner":
            raise UsageError(f"{args.checkpoint} holds a planner only: give a denoiser too (--planner/--denoiser)")
        return Models(None, model, None, config, (None, args.checkpoint))
    if not args.planner and not args.denoiser:
        return _load_default_bundle(device)
    if not args.denoiser:
        raise UsageError("--planner needs a --denoiser")
    denoiser, denoiser_config = load_role("denoiser", args.denoiser, DENOISER_KINDS, device)
    planner, planner_config = load_role("planner", args.planner, ("planner",), device) if args.planner \
        else (None, None)
    return Models(planner, denoiser, planner_config, denoiser_config,
                  (f"--planner {args.planner}", f"--denoiser {args.denoiser}"))


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
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed must be in [0, 2**63), got {args.seed}")
    if args.sync_every < 1:
        raise UsageError(f"--sync-every must be >= 1, got {args.sync_every}")
    check_finite("--temperature", args.temperature)
    check_finite("--temperature-end", args.temperature_end)


def warn_if_too_few_steps(args) -> None:
    """The Gillespie sampler denoises one position per step after its parallel stage:
    a budget that cannot reach every position leaves samples mostly noise."""
    if args.sampler != "ddpd" or args.clock != "planner":
        return
    parallel = min(args.parallel_steps, args.steps)
    reachable = parallel * args.k + (args.steps - parallel)
    if reachable < args.length:
        print(f"ddpd-sample: warning: --steps {args.steps} can denoise at most {reachable} of the {args.length} "
              f"positions (one per step after --parallel-steps): the samples will be partly noise; give --steps "
              f">= {args.length}, or --k and --parallel-steps", file=sys.stderr)


def run(args, stdout: Optional[Stdout] = None) -> int:
    from ddpd.files import StreamedFile

    stdout = stdout or Stdout()
    check_args(args)
    threads = apply_threads(args.threads)
    args.device_obj = resolve_device(args.device)
    out = StreamedFile(args.out) if args.out else None  # an unwritable --out fails before any work
    try:
        models = load_models(args, args.device_obj)
        if args.length is None:
            args.length = models.max_length
        if not 1 <= args.length <= models.max_length:
            raise UsageError(f"--length must be in [1, {models.max_length}] (the models' max_seq_len), "
                             f"got {args.length}")
        if args.steps is None:
            args.steps = args.length * (BUNDLED_STEPS_PER_TOKEN if models.bundled else 1)
        if args.num_samples is None:
            args.num_samples = NUM_SAMPLES_BUNDLED if models.bundled else NUM_SAMPLES
        tokenizer = models.tokenizer()
        if tokenizer is not None and tokenizer.vocab_size != models.vocab_size:
            raise UsageError(f"the tokenizer has {tokenizer.vocab_size} symbols but the models {models.vocab_size}")
        sample = make_sampler(args, models)
        warn_if_too_few_steps(args)
        _warm_up(args)
        calls, elapsed = _sample_all(args, models, sample, tokenizer, out, stdout)
        if out is not None:
            out.publish()
    finally:
        if out is not None and not out.published:
            out.discard()
    rate = args.num_samples / elapsed if elapsed > 0 else math.inf
    passes = ", ".join(f"{model} {calls[model + '_calls']} ({calls[model + '_rows']} row-evaluations, "
                       f"{calls[model + '_rows_saved']} saved by early stopping)" for model in ("planner", "denoiser"))
    where = f"{threads} CPU thread{'s' if threads > 1 else ''}" if args.device_obj.type == "cpu" \
        else str(args.device_obj)
    print(f"ddpd-sample: {args.num_samples} samples of {args.length} tokens in {elapsed:.2f} s ({rate:.2f} samples/s, "
          f"{where}){', fused' if args.fused else ''}; forward passes: {passes}", file=sys.stderr)
    return 0


def _warm_up(args) -> None:
    """Load what the first sampling call would otherwise load on the clock: the C++
    extension (compiled on first use where the install did not build it) and
    torch._dynamo (imported by the first call of any torch.library custom op)."""
    if args.fused:
        from ddpd.ops import load_extension

        load_extension()
        importlib.import_module("torch._dynamo")


def _sample_all(args, models: Models, sample, tokenizer, out, stdout: Stdout):
    """Sample every batch; each one's records go to `out` (flushed) and its texts to
    stdout as soon as it is done, and are not kept. Returns (call counts, seconds).
    Interrupted, the finished samples are published to `out` and the message says so."""
    from ddpd.cli.common import Interrupted
    from ddpd.sampling import PhiloxNoise

    calls = dict.fromkeys(("planner_calls", "denoiser_calls", "planner_rows", "denoiser_rows", "planner_rows_saved",
                           "denoiser_rows_saved"), 0)
    done = 0
    start = time.perf_counter()
    try:
        with torch.inference_mode(), _progress(args, models) as advance:
            for batch, first in enumerate(range(0, args.num_samples, args.batch_size)):
                n = min(args.batch_size, args.num_samples - first)
                result = sample(n, PhiloxNoise(args.seed, first_row=first))
                advance((batch + 1) * args.steps)  # a batch that stopped early ends its share of the bar
                for key in calls:
                    calls[key] += getattr(result, key)
                tokens = result.tokens.tolist()
                texts = [tokenizer.decode(row) if tokenizer else None for row in tokens]
                if out is not None:
                    out.write("".join(json.dumps({"index": first + row, "text": texts[row], "tokens": tokens[row],
                                                  "steps": result.steps,
                                                  "stop_step": int(result.stop_step[row])}) + "\n"
                                      for row in range(n)))
                done += n
                if not args.quiet:
                    for row in range(n):
                        stdout.print(texts[row] if texts[row] is not None else " ".join(map(str, tokens[row])))
                if stdout.closed and out is None:
                    break  # nobody reads the samples any more
    except Interrupted as stop:
        if out is not None and done:
            out.publish()
            stop.detail = f"; wrote the {done} finished sample(s) to {args.out}"
        elif out is not None:
            stop.detail = f"; no sample was finished, {args.out} not written"
        raise
    return calls, time.perf_counter() - start


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


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    stdout = Stdout()
    return run_tool("ddpd-sample", lambda: run(args, stdout), value_error_status=2)


if __name__ == "__main__":
    sys.exit(main())
