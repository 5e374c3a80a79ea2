"""ddpd-sample: draw sequences from trained ddpd models and decode them.

    ddpd-sample --fused
    ddpd-sample --prompt "the history of " --fused
    ddpd-sample --infill "the ______ of the city" --fused
    ddpd-sample --checkpoint runs/bundle --steps 256 --num-samples 16 --out samples.jsonl
    ddpd-sample --checkpoint runs/mask-denoiser --sampler maskgit --steps 16 --top-p 0.9
    ddpd-sample --checkpoint runs/toy --labels 0 1 --guidance-scale 2
    torchrun --standalone --nproc_per_node 2 -m ddpd.cli.sample --num-samples 64 --out s.jsonl

Without a model argument it samples from the bundled text8 pair (ddpd.pretrained). Sample
i draws from Philox row i of --seed, whatever --batch-size or the number of processes;
--out is streamed to a temporary file and renamed, never half written. docs/cli.md
("ddpd-sample") describes every flag, the samplers each set of models supports
(ddpd.cli.samplers), prompts, class labels and several processes."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import re
import sys
import time
import warnings
from typing import TYPE_CHECKING, Optional

from ddpd.cli.common import (
    DTYPE_CHOICES,
    Interrupted,
    OneLineParser,
    UsageError,
    add_runtime_arguments,
    apply_threads,
    check_checkpoints,
    check_finite,
    check_first,
    check_seed,
    check_threads,
    flag_error,
    float_type,
    int_type,
    load_role,
    max_length,
    refuse_empty_paths,
    refuse_outputs_over_inputs,
    run_tool,
    shared_facts,
    warn_if_lengths_differ,
)
from ddpd.cli.samplers import (
    FAMILIES,
    FLOAT32_MAX,
    MASKGIT_CHOICE_TEMPERATURE,
    add_truncation_arguments,
    truncation_from,
)
from ddpd.streams import Stdout, standard_streams

if TYPE_CHECKING:
    import torch

NUM_SAMPLES, NUM_SAMPLES_BUNDLED = 8, 4
# With the bundled model, a step budget of twice the length: option A then stops on
# the planner (every p(z = N) < eps) rather than on the budget.
BUNDLED_STEPS_PER_TOKEN = 2
GAP = "_"  # --infill: a position to generate


def default_steps(length: int, bundled: bool) -> int:
    """ddpd-sample's step budget when --steps is not given.

    Args:
        length: the sequence length.
        bundled: whether the models are the bundled default pair.

    Returns:
        2 x length with the bundled pair (BUNDLED_STEPS_PER_TOKEN), length otherwise.
    """
    return length * (BUNDLED_STEPS_PER_TOKEN if bundled else 1)


SYNC_EVERY = 8  # --fused: steps between stop checks
# The flags only one --sampler reads: given (off their defaults) with another, they are refused.
SAMPLER_FLAGS = {**dict.fromkeys(("option", "stop", "selection", "eps", "k", "parallel_steps", "clock", "t_end",
                                  "one_pass"), "ddpd"), "eta": "tau-leaping", "choice_temperature": "maskgit"}
# The --policy names with a choice_temperature field (ddpd.sampling.policies, which imports torch)
CHOICE_TEMPERATURE_POLICIES = ("error-budget", "maskgit")
COUNTS = ("planner_calls", "denoiser_calls", "planner_rows", "denoiser_rows", "planner_rows_saved",
          "denoiser_rows_saved", "planner_nan_passes", "denoiser_nan_passes")
PER_ROW = ("planner_passes", "denoiser_passes", "commits")  # summed over the samples
BUNDLE_MODELS = ("pair", "uniform")  # ddpd.pretrained.MODELS, named here without importing torch
# A sample is printed on one line: the line breaks of its text (GPT-2's newline tokens) as escapes,
# backslashes doubled so that the line reads back unambiguously; --out keeps the text as decoded.
ONE_LINE = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\v": "\\v", "\f": "\\f", "\x1c": "\\x1c",
                          "\x1d": "\\x1d", "\x1e": "\\x1e", "\x85": "\\x85", "\u2028": "\\u2028",
                          "\u2029": "\\u2029"})


def build_parser() -> argparse.ArgumentParser:
    """The command line of ddpd-sample.

    Returns:
        The OneLineParser.
    """
    p = OneLineParser(prog="ddpd-sample", description=__doc__.split("\n\n")[0])
    models = p.add_argument_group("models (default: the bundled text8 planner + mask denoiser, ddpd.pretrained)")
    models.add_argument("--checkpoint", help="a bundle (planner/ + denoiser/, and optionally uniform/) or a single "
                                              "checkpoint directory")
    models.add_argument("--planner", help="planner checkpoint directory")
    models.add_argument("--denoiser", help="denoiser checkpoint directory (mask-denoiser, uniform-denoiser, uniform)")
    models.add_argument("--model", choices=BUNDLE_MODELS,
                        help="the networks of the bundle (the default one, or --checkpoint's): pair, its planner + "
                             "mask denoiser (the default), or uniform, its single uniform model (DDPD-DFM-Uni)")
    p.add_argument("--sampler", choices=FAMILIES, default="ddpd",
                   help="the sampler (default %(default)s); the models each one takes: docs/cli.md")
    p.add_argument("--steps", type=int_type, help="step budget T (default: the sequence length; twice that with the "
                                             "bundled default model)")
    p.add_argument("--length", type=int_type, help="sequence length D (default: the models' max_seq_len)")
    p.add_argument("--num-samples", dest="num_samples", type=int_type,
                   help=f"default {NUM_SAMPLES}; {NUM_SAMPLES_BUNDLED} with the bundled default model; the number "
                        "of lines of --prompts/--infills")
    p.add_argument("--batch-size", dest="batch_size", type=int_type, default=64,
                   help="samples per batch and process (default %(default)s)")
    p.add_argument("--seed", type=int_type, default=0, help="seed of the Philox noise (default %(default)s)")
    p.add_argument("--temperature", type=float_type, default=1.0,
                   help="denoiser logit temperature (0: greedy, the most probable token; default %(default)s)")
    p.add_argument("--temperature-end", dest="temperature_end", type=float_type,
                   help="anneal the temperature linearly to this value over the steps (over the run's time for "
                        "the ddpd samplers that stop early: eps stop, exact clock)")
    add_truncation_arguments(p)
    p.add_argument("--out", help="write the samples to this JSONL file (streamed, published atomically)")
    add_runtime_arguments(p)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="precision of the networks: auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16, "
                        "float16")
    p.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                   help="torch.compile the networks (BACKEND: inductor, the default, or eager / aot_eager, which "
                        "trace only); the progress bar then moves once per batch")
    p.add_argument("--quiet", action="store_true", help="do not print the samples")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (shown on a terminal: one tick per denoiser pass, per batch with "
                        "--compile)")
    p.add_argument("--fused", action="store_true",
                   help="fused path of every sampler: ops kernels, head at the denoised positions only, early-stop "
                        "compaction (the same samples as without with float32 networks; the same law below)")
    p.add_argument("--sync-every", dest="sync_every", type=int_type,
                   help=f"--fused: steps between stop checks, where finished rows leave the batch (default "
                        f"{SYNC_EVERY})")
    conditions = p.add_argument_group("prompts and class labels")
    prompts = conditions.add_mutually_exclusive_group()
    prompts.add_argument("--prompt", metavar="TEXT", help="a prefix every sample starts with")
    prompts.add_argument("--infill", metavar="TEXT", help=f"fixed text in which each {GAP!r} is a token to generate "
                                                          "(positions after the text are generated too)")
    prompts.add_argument("--prompts", metavar="FILE", help="one --prompt per line; sample i takes line i modulo "
                                                           "their number")
    prompts.add_argument("--infills", metavar="FILE", help="one --infill per line; sample i takes line i modulo "
                                                           "their number")
    conditions.add_argument("--labels", type=int_type, nargs="+", metavar="C",
                            help="class labels of a class-conditional denoiser; sample i takes label i modulo their "
                                 "number")
    conditions.add_argument("--guidance-scale", dest="guidance_scale", type=float_type, default=1.0,
                            help="classifier-free guidance weight w of --labels: u + w (c - u) on the denoiser "
                                 "logits (default 1: no guidance)")
    ddpd = p.add_argument_group("ddpd sampler (appendix 'Implementation details': A, +B, +C)")
    ddpd.add_argument("--option", help="letters of A, B, C: B runs the whole budget, C selects by softmax "
                                       "(e.g. A, A+B, A+B+C); overrides --stop and --selection")
    ddpd.add_argument("--stop", choices=("eps", "budget"),
                      help="eps (A, default on the planner clock) or budget (B, default and only choice on the "
                           "exact clock)")
    ddpd.add_argument("--selection", choices=("sigmoid", "softmax"), default="sigmoid",
                      help="sigmoid (A, default) or softmax (C) of the planner logits")
    ddpd.add_argument("--eps", type=float_type, default=0.01,
                      help="stop when every p(z = N) < eps (option A; default %(default)s)")
    ddpd.add_argument("--k", type=int_type, default=1,
                      help="positions denoised per step in the parallel stage (default %(default)s)")
    ddpd.add_argument("--parallel-steps", dest="parallel_steps", type=int_type, default=0,
                      help="steps that denoise --k positions before one-at-a-time refinement (default %(default)s)")
    p.add_argument("--policy", metavar="SPEC",
                   help="parallel decoding: how many drawn tokens a step keeps, NAME[:FIELD=VALUE,...]; "
                        "--sampler ddpd: error-budget (bound=1,max_k=16,order=risk); --sampler maskgit: "
                        "maskgit, threshold (Fast-dLLM), factor (Fast-dLLM), entropy-bound (EB-sampler), remdm "
                        "(ddpd.sampling.policies, docs/parallel.md)")
    ddpd.add_argument("--clock", choices=("planner", "exact"), default="planner",
                      help="planner: time estimated from the planner (paper); exact: exact CTMC clock")
    ddpd.add_argument("--one-pass", dest="one_pass", action="store_true",
                      help="one uniform model on the planner clock: a step draws from its planning pass, one pass "
                           "a step instead of two (docs/sampling.md)")
    # ddpd.sampling.options.T_END written out: this parser imports no torch
    ddpd.add_argument("--t-end", dest="t_end", type=float_type, default=1.0 - 1e-4, help="end time of --clock exact")
    baselines = p.add_argument_group("baselines")
    baselines.add_argument("--eta", type=float_type, default=0.0,
                           help="remasking stochasticity of mask tau-leaping, on one mask-denoiser (default "
                                "%(default)s)")
    baselines.add_argument("--choice-temperature", dest="choice_temperature", type=float_type,
                           help="MaskGIT's default policy: scale of the Gumbel noise on the confidences (default "
                                f"{MASKGIT_CHOICE_TEMPERATURE}); with --policy give the policy's own field, e.g. "
                                "maskgit:choice_temperature=2")
    return p


def parse_option(option: str) -> dict:
    """--option letters -> DDPDOptions fields (A: eps stop + sigmoid selection).

    Args:
        option: letters of A, B, C, e.g. "A+B+C".

    Returns:
        A dict of the stop and selection fields.

    Raises:
        UsageError: letters other than A, B, C, or none.
    """
    letters = set(option.upper().replace("+", ""))
    if not letters or not letters <= set("ABC"):
        raise UsageError(f"--option must combine the letters A, B, C (e.g. A+B+C), got {option!r}")
    return {"stop": "budget" if "B" in letters else "eps", "selection": "softmax" if "C" in letters else "sigmoid"}


class Models:
    """The loaded networks by role, their configs, and what they imply (V, D, schedule, tokenizer, classes)."""

    def __init__(self, planner, denoiser, planner_config: Optional[dict], denoiser_config: Optional[dict],
                 names=("the planner", "the denoiser")):
        self.planner, self.denoiser = planner, denoiser
        self.planner_config, self.denoiser_config = planner_config, denoiser_config
        self.names = names
        self.config = denoiser_config or planner_config
        self.bundled = False  # the default bundle of ddpd.pretrained, not models the user named
        self.kind = denoiser_config["kind"] if denoiser_config else None
        configs = [(name, c) for name, c in zip(names, (planner_config, denoiser_config)) if c]
        self.vocab_size = int(shared_facts(configs)["vocab_size"])  # also checks that the two agree
        self.lengths = {name: max_length(c) for name, c in configs}
        self.max_length = min(self.lengths.values())

    @property
    def has_planner(self) -> bool:
        return self.planner_config is not None and self.planner_config["kind"] == "planner"

    def num_classes(self, role: str) -> int:
        """The classes a class-conditional network of `role` takes.

        Args:
            role: "planner" or "denoiser".

        Returns:
            Its num_classes, 0 for an unconditional network or none given.
        """
        config = self.planner_config if role == "planner" else self.denoiser_config
        return int(config["model"].get("num_classes", 0)) if config else 0

    def by_kind(self) -> dict:
        """The networks as the sampler table names them: planner, mask-denoiser, ...

        Returns:
            A dict of the networks by kind (the planner None without one).
        """
        return {"planner": self.planner if self.has_planner else None, self.kind: self.denoiser}

    def prepare(self, dtype: torch.dtype, device: torch.device, backend: Optional[str] = None) -> None:
        """Cast the networks for sampling in `dtype` (ddpd.models.prepare_for_sampling) and,
        with a `backend`, torch.compile them (ddpd.models.compile_for_sampling).

        Args:
            dtype: the dtype to sample in.
            device: the device to sample on.
            backend: a torch.compile backend, or None.
        """
        import torch

        from ddpd.models import compile_for_sampling, prepare_for_sampling

        for network in (self.planner, self.denoiser):
            if isinstance(network, torch.nn.Module):
                compile_for_sampling(prepare_for_sampling(network, dtype, device), backend)

    def tokenizer(self):
        """The tokenizer the checkpoints record.

        Returns:
            The tokenizer, or None when they record none.
        """
        from ddpd.training.data import tokenizer_from_config

        config = self.config.get("tokenizer")
        return None if config is None else tokenizer_from_config(config)


def load_models(args, device: torch.device) -> Models:
    """The models of --checkpoint, --planner/--denoiser or the default bundle (how they may be
    combined: check_command_line).

    Args:
        args: the parsed command line.
        device: the device to load them on.

    Returns:
        The Models.

    Raises:
        UsageError: a planner alone, models of the wrong kind, or no default bundle.
        CheckpointError: a checkpoint that cannot be loaded.
    """
    from ddpd.checkpoint import DENOISER_KINDS, load_model

    if args.checkpoint:
        if os.path.isdir(os.path.join(args.checkpoint, "planner")) or \
                os.path.isdir(os.path.join(args.checkpoint, "denoiser")):
            return _load_bundle(args.checkpoint, args.model or "pair", device)
        if args.model:
            raise UsageError(f"--model chooses networks of a bundle, and --checkpoint {args.checkpoint} is a single "
                             "checkpoint: leave --model out")
        model, config = load_model(args.checkpoint, device=str(device))
        if config["kind"] == "planner":
            raise UsageError(f"{args.checkpoint} holds a planner only: give a denoiser too (--planner/--denoiser)")
        return Models(None, model, None, config, (None, args.checkpoint))
    if not args.planner and not args.denoiser:
        return _load_default_bundle(args.model or "pair", device)
    denoiser, denoiser_config = load_role("denoiser", args.denoiser, DENOISER_KINDS, device)
    planner, planner_config = load_role("planner", args.planner, ("planner",), device) if args.planner \
        else (None, None)
    return Models(planner, denoiser, planner_config, denoiser_config,
                  (f"--planner {args.planner}", f"--denoiser {args.denoiser}"))


def _load_bundle(path: str, model: str, device: torch.device, named: bool = True) -> Models:
    """The networks `model` (pair or uniform) of the bundle at `path`; named: errors name them
    by their paths (a bundle the user gave), else by their roles."""
    from ddpd.checkpoint import load_bundle

    if model == "uniform":
        if not os.path.isdir(os.path.join(path, "uniform")):
            raise UsageError(f"--model uniform: the bundle {path} holds no uniform/ (a single uniform model); "
                             "python -m ddpd.pretrained --uniform DIR writes one")
        network, config = load_role("uniform", os.path.join(path, "uniform"), ("uniform",), device,
                                    name=f"the bundle's uniform/ ({path}/uniform)")
        return Models(None, network, None, config, (None, f"{path}/uniform" if named else "the uniform model"))
    planner, denoiser, configs = load_bundle(path, device=str(device))
    names = (f"{path}/planner", f"{path}/denoiser") if named else ("the planner", "the denoiser")
    return Models(planner, denoiser, configs["planner"], configs["denoiser"], names)


def _load_default_bundle(model: str, device: torch.device) -> Models:
    from ddpd.pretrained import BundleNotFoundError, default_bundle

    own = "--checkpoint UNIFORM_CHECKPOINT (or --checkpoint BUNDLE --model uniform)" if model == "uniform" else \
        "--checkpoint BUNDLE (or --planner DIR --denoiser DIR)"
    try:
        path = default_bundle(own=own, model=model)
    except BundleNotFoundError as err:
        raise UsageError(str(err)) from None
    models = _load_bundle(path, model, device, named=False)
    models.bundled = True
    return models


# ---------------------------------------------------------------- prompts and labels


def _encode(tokenizer, text: str, gaps: bool, length: int, where: str) -> list[int]:
    """Token ids of `text`, -1 for each GAP when `gaps`; UsageError naming `where` for text
    the tokenizer cannot encode or longer than `length`."""
    pieces = text.split(GAP) if gaps else [text]
    ids: list[int] = []
    try:
        if gaps:  # first the whole text, each gap as a space, so that an error's positions and counts are the text's
            tokenizer.encode(text.replace(GAP, " "))
        for i, piece in enumerate(pieces):
            ids += ([-1] if i else []) + tokenizer.encode(piece)
    except ValueError as err:
        reason = str(err).split(": ", 1)[-1]  # without the tokenizer's own prefix
        raise UsageError(f"{where}: cannot encode the text: {reason}") from None
    if len(ids) > length:
        raise UsageError(f"{where} is {len(ids)} tokens long, more than the {length} of a sample (--length)")
    return ids


def read_prompts(args) -> Optional[tuple[list[str], bool, list[str]]]:
    """The texts of --prompt/--infill/--prompts/--infills.

    Args:
        args: the parsed command line.

    Returns:
        (texts, gaps, where), or None without prompts: gaps says whether GAP marks the
        positions to generate, `where` names each text in errors (the option, or FILE line N).

    Raises:
        UsageError: a prompts file that cannot be read, is not UTF-8 or holds no line.
    """
    for option, gaps in (("prompt", False), ("infill", True)):
        text = getattr(args, option)
        if text is not None:
            shown = text if len(text) <= 40 else text[:37] + "..."
            return [text], gaps, [f"--{option} {shown!r}"]
    for option, gaps in (("prompts", False), ("infills", True)):
        path = getattr(args, option)
        if path is None:
            continue
        try:
            # universal newlines: \r\n and \r read as \n; utf-8-sig: the byte-order mark some editors
            # write is not text (the GPT-2 tokenizer would fix its 3 bytes into every sample)
            with open(path, encoding="utf-8-sig") as f:
                lines = f.read().split("\n")  # not splitlines(): it also splits at form feeds, U+2028, ...
            if lines[-1] == "":
                lines.pop()  # the end of the last line
        except UnicodeDecodeError as err:
            raise UsageError(f"--{option} {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        except OSError as err:
            raise UsageError(f"--{option} {path}: {err.strerror or err}") from None
        if not lines:
            raise UsageError(f"--{option} {path} holds no line")
        return lines, gaps, [f"--{option} {path} line {i + 1}" for i in range(len(lines))]
    return None


def encode_prompts(prompts, tokenizer, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as a sampler's Prompt fields: each text's tokens from position 0, -1
    (generated) at its gaps and after it.

    Args:
        prompts: (texts, gaps, where) as read_prompts returns them.
        tokenizer: the checkpoints' tokenizer, or None.
        length: D.

    Returns:
        (x_init Long[P, D], frozen Bool[P, D]).

    Raises:
        UsageError: no tokenizer, text it cannot encode, or a text longer than D.
    """
    import torch

    texts, gaps, where = prompts
    if tokenizer is None:
        raise UsageError(f"{where[0].split(' ')[0]} needs a tokenizer, and the checkpoints record none")
    x_init = torch.full((len(texts), length), -1, dtype=torch.long)
    for row, (text, name) in enumerate(zip(texts, where)):
        ids = _encode(tokenizer, text, gaps, length, name)
        x_init[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return x_init, x_init >= 0


def conditions(args, models: Models, tokenizer, prompts, planner: bool = True) -> dict:
    """The Settings fields of the prompts (read_prompts) and labels given: x_init, frozen,
    labels, guidance_scale, conditional_planner (--guidance-scale: check_command_line).

    Args:
        args: the parsed command line.
        models: the loaded Models.
        tokenizer: the checkpoints' tokenizer, or None.
        prompts: as read_prompts returns them, or None.
        planner: whether the sampler runs the planner (a bundle's may go unused: its classes then do not matter).

    Returns:
        A dict of the fields given.

    Raises:
        UsageError: labels for an unconditional denoiser, out of range, or a planner the sampler
            runs whose classes differ from the denoiser's; prompts that cannot be encoded.
    """
    import torch

    fields = {}
    if prompts is not None:
        fields["x_init"], fields["frozen"] = encode_prompts(prompts, tokenizer, args.length)
    if args.labels is None:
        return fields
    classes = models.num_classes("denoiser")
    if classes == 0:
        raise UsageError(f"--labels: {models.names[1]} is not class-conditional (trained without --num-classes)")
    bad = [label for label in args.labels if not 0 <= label < classes]
    if bad:
        raise UsageError(f"--labels must be classes in [0, {classes}) of {models.names[1]}, got {bad[0]}")
    planner_classes = models.num_classes("planner") if planner and models.has_planner else 0
    if planner_classes and planner_classes != classes:
        raise UsageError(f"{models.names[0]} has {planner_classes} classes, but {models.names[1]} has {classes}: "
                         "they cannot be used together")
    fields.update(labels=torch.tensor(args.labels, dtype=torch.long), guidance_scale=args.guidance_scale,
                  conditional_planner=planner_classes > 0)
    return fields


# ---------------------------------------------------------------- the sampler


def make_sampler(args, models: Models, tokenizer=None, prompts=None):
    """The sampler of the command line, with the chosen sampler (ddpd.cli.samplers).

    Args:
        args: the parsed command line.
        models: the loaded Models.
        tokenizer: the checkpoints' tokenizer, or None.
        prompts: as read_prompts returns them, or None.

    Returns:
        (sample, settings): sample(n, first) -> SampleResult draws samples first ..
        first + n - 1, each from Philox row `first + row` of --seed; settings: what it runs
        with (ddpd.cli.samplers.Settings).

    Raises:
        UsageError: a sampler the models do not fit, or a setting the sampling layer refuses
            (`k must be ...`), naming its flag.
    """
    flags = [action.dest for action in build_parser()._actions]
    try:
        sample, settings = _make_sampler(args, models, tokenizer, prompts)
    except (TypeError, ValueError) as err:
        raise option_error(err, args, flags) from None

    def checked(n: int, first: int):
        try:
            return sample(n, first)
        except (TypeError, ValueError) as err:
            raise flag_error(err, flags) from None

    return checked, settings


def _make_sampler(args, models: Models, tokenizer, prompts):
    from ddpd.cli.samplers import Settings, find, needs
    from ddpd.sampling import DDPDOptions, Execution, PhiloxNoise

    row = find(args.sampler, models.has_planner, models.kind)
    if row is None and models.has_planner and not args.planner:  # a bundle's planner, not asked for by name
        row = find(args.sampler, False, models.kind)
    if row is None:
        raise UsageError(f"--sampler {args.sampler} needs {needs(args.sampler)}; got {_describe(models)}")
    if args.eta != 0 and row.function != "tau_leaping_mask":
        raise UsageError(f"--eta is a setting of mask tau-leaping (one mask-denoiser); with {_describe(models)} "
                         f"--sampler {args.sampler} runs {row.name}, which has none")
    if args.one_pass and row.function != "ddpd_sample_uniform":
        raise UsageError(f"--one-pass needs one uniform model (--model uniform, or a uniform checkpoint); with "
                         f"{_describe(models)} a step's plan and draws are two networks' passes")
    ddpd = DDPDOptions()
    if row.family == "ddpd":
        ddpd = DDPDOptions(**ddpd_fields(args)).check(args.length, args.steps)
    settings = Settings(args.length, models.vocab_size, args.steps, temperature=args.temperature,
                        temperature_end=args.temperature_end, schedule=models.config.get("schedule", "linear"),
                        device=args.device_obj, ddpd=ddpd, eta=args.eta, choice_temperature=args.choice_temperature,
                        policy=command_policy(args, "maskgit"),
                        execution=Execution(fused=args.fused, sync_every=args.sync_every, dtype=args.dtype_name),
                        truncation=truncation_from(args),
                        **conditions(args, models, tokenizer, prompts, row.planner))
    networks = models.by_kind()
    return (lambda n, first: row.call(networks, settings, n, PhiloxNoise(args.seed, first_row=first), first),
            settings)


def _describe(models: Models) -> str:
    parts = [f"{role} {c['kind']!r}" for role, c in (("planner", models.planner_config),
                                                    ("denoiser", models.denoiser_config)) if c]
    return " and ".join(parts)


def ddpd_fields(args) -> dict:
    """The DDPDOptions fields of the ddpd sampler's flags (--option overrides --stop and --selection).

    Args:
        args: the parsed command line.

    Returns:
        A dict of DDPDOptions' keywords.

    Raises:
        UsageError: a bad --option or --policy.
    """
    fields = dict(stop=args.stop, selection=args.selection, eps=args.eps, k=args.k,
                  parallel_steps=args.parallel_steps, clock=args.clock, t_end=args.t_end,
                  policy=command_policy(args, "ddpd"), one_pass=args.one_pass)
    fields.update(parse_option(args.option) if args.option is not None else {})
    return fields


def option_error(err: BaseException, args, flags) -> UsageError:
    """flag_error, saying where --option set the --stop or --selection an error names.

    Args:
        err: the error the sampling layer raised.
        args: the parsed command line.
        flags: the parser's dests.

    Returns:
        The UsageError (to raise).
    """
    error = flag_error(err, flags)
    if args.option and re.search(r"--(stop|selection) ", str(error)):
        return UsageError(f"{error} (--option {args.option} sets --stop and --selection)")
    return error


def command_policy(args, family: str):
    """The --policy of `family`'s sampler.

    Args:
        args: the parsed command line.
        family: "ddpd" or "maskgit".

    Returns:
        The policy, or None when not given or of the other family.

    Raises:
        UsageError: a spec parse_policy refuses, or a policy of another sampler than --sampler.
    """
    if not args.policy:
        return None
    from ddpd.sampling.policies import ErrorBudget, parse_policy

    try:
        policy = parse_policy(args.policy)
    except ValueError as err:
        raise UsageError(f"--policy: {err}") from None
    # by the policy parsed, not the spec's text: parse_policy strips the name (' error-budget ')
    owner = "ddpd" if isinstance(policy, ErrorBudget) else "maskgit"
    if owner != args.sampler:
        raise UsageError(f"--policy {args.policy} is a policy of --sampler {owner}, not of --sampler {args.sampler}")
    return policy if owner == family else None


def check_command_line(args) -> None:
    """What the command line alone decides, checked before torch is imported (check_first):
    flag values, the checkpoint directories and --prompts/--infills files it names (read
    here into args.texts).

    Args:
        args: the parsed command line; sync_every and texts are set.

    Raises:
        UsageError: a flag value out of range, flags that do not go together, or an --out
            that would replace an input.
        InputError: a checkpoint directory that is not there.
    """
    check_threads(args.threads)
    if args.checkpoint and (args.planner or args.denoiser):
        raise UsageError("give either --checkpoint or --planner/--denoiser, not both")
    if args.model and (args.planner or args.denoiser):
        raise UsageError("--model chooses networks of a bundle (the default one or --checkpoint's): with "
                         "--planner/--denoiser, name the networks there")
    if args.planner and not args.denoiser:
        raise UsageError("--planner needs a --denoiser")
    for flag in ("num_samples", "batch_size", "steps", "length"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    check_seed(args.seed)
    if args.sync_every is None:
        args.sync_every = SYNC_EVERY
    elif not args.fused:  # the reference run checks its stops every step
        raise UsageError("--sync-every is a setting of the fused run: give --fused too")
    elif args.sync_every < 1:
        raise UsageError(f"--sync-every must be >= 1, got {args.sync_every}")
    refuse_empty_paths(args, "out")
    check_finite("--temperature", args.temperature)  # 0: greedy
    check_finite("--temperature-end", args.temperature_end)
    check_finite("--guidance-scale", args.guidance_scale)
    if args.guidance_scale > FLOAT32_MAX:  # the guided logits are float32
        raise UsageError(f"--guidance-scale must be at most {FLOAT32_MAX:g}, got {args.guidance_scale:g}")
    if args.sampler == "ddpd" and args.k > 1 and args.parallel_steps == 0:  # it would be ignored
        raise UsageError(f"--k {args.k} acts in the parallel stage only: give --parallel-steps N too (not with "
                         "--policy, which decides how many positions a step denoises)")
    check_finite("--eta", args.eta)  # checked whether or not the sampler reads them
    if args.policy is not None and not args.policy.strip():
        raise UsageError(f"--policy must be NAME[:FIELD=VALUE,...], got {args.policy!r}")
    if args.choice_temperature is not None:
        check_finite("--choice-temperature", args.choice_temperature)
        if args.policy:  # it would be ignored: the policy has its own field, or none
            name = args.policy.partition(":")[0].strip()
            advice = ("give the policy's choice_temperature field instead" if name in CHOICE_TEMPERATURE_POLICIES
                      else "it has none: leave --choice-temperature out")
            raise UsageError(f"--choice-temperature sets the default maskgit policy's; with --policy {args.policy} "
                             f"{advice}")
    refuse_flags_of_other_samplers(args)
    if args.sampler == "ddpd":
        refuse_ignored_ddpd_flags(args)
    if args.choice_temperature is None:
        args.choice_temperature = MASKGIT_CHOICE_TEMPERATURE
    if args.labels is None and args.guidance_scale != 1.0:
        raise UsageError("--guidance-scale needs --labels (the classes to guide towards)")
    if args.option is not None:
        parse_option(args.option)
    check_checkpoints(args.checkpoint or None, args.planner or None, args.denoiser or None)
    args.texts = read_prompts(args)  # a missing or unreadable file fails before any work
    if args.out:
        refuse_outputs_over_inputs([(f"--out {args.out}", args.out)],
                                   files=[(f"--{name} {getattr(args, name)}", getattr(args, name))
                                          for name in ("prompts", "infills") if getattr(args, name)],
                                   checkpoints=[(f"--{name} {getattr(args, name)}", getattr(args, name))
                                                for name in ("checkpoint", "planner", "denoiser")
                                                if getattr(args, name)])


def refuse_flags_of_other_samplers(args) -> None:
    """A flag that only another --sampler reads (SAMPLER_FLAGS), given off its default, is an
    error rather than ignored.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: naming the flag and the sampler that reads it.
    """
    parser = build_parser()
    for dest, owner in SAMPLER_FLAGS.items():
        if owner != args.sampler and getattr(args, dest) != parser.get_default(dest):
            raise UsageError(f"--{dest.replace('_', '-')} is a setting of --sampler {owner}, not of "
                             f"--sampler {args.sampler}")


def refuse_ignored_ddpd_flags(args) -> None:
    """--t-end and --eps, given off their defaults where the ddpd sampler would not read
    them (--t-end off the exact clock, --eps without the eps stop), are errors rather
    than ignored.

    Args:
        args: the parsed command line of --sampler ddpd.

    Raises:
        UsageError: naming the flag and what would make it act.
    """
    parser = build_parser()
    if args.clock != "exact" and args.t_end != parser.get_default("t_end"):
        raise UsageError(f"--t-end {args.t_end} acts on the exact clock only: give --clock exact too")
    stop = ddpd_fields(args)["stop"]  # --option over --stop, as the sampler reads them
    if args.eps == parser.get_default("eps") or stop == "eps" or (stop is None and args.clock == "planner"):
        return
    source, fix = ((f"--option {args.option} runs the whole budget", "give --option without B")
                   if args.option is not None else ("--stop budget runs the whole budget", "give --stop eps")
                   if args.stop else ("--clock exact runs to --t-end", "give --clock planner"))
    raise UsageError(f"--eps {args.eps} acts with the eps stop (option A) only, and {source}: {fix}")


def check_args(args) -> None:
    """The checks that need torch, before any model is loaded: --compile's backend, the
    truncation and the ddpd sampler's settings (those against --length and --steps wait
    for the models, which give their defaults).

    Args:
        args: the parsed command line.

    Raises:
        UsageError: a value refused, naming its flag.
    """
    from ddpd.models.precision import compile_backends
    from ddpd.sampling import DDPDOptions

    if args.compile is not None and args.compile not in compile_backends():
        raise UsageError(f"--compile must be one of {', '.join(compile_backends())}, got {args.compile!r}")
    truncation_from(args)
    command_policy(args, args.sampler)
    if args.sampler == "ddpd":
        try:
            DDPDOptions(**ddpd_fields(args))
        except (TypeError, ValueError) as err:
            raise option_error(err, args, [action.dest for action in build_parser()._actions]) from None


def warn_if_too_few_steps(args, frozen: Optional[torch.Tensor]) -> None:
    """The Gillespie sampler denoises one position per step after its parallel stage (the
    exact clock at most one per step, a candidate event; a --policy at most max_k per step,
    one under bound 0 without a spread): a budget that cannot reach every position a prompt
    leaves free leaves samples mostly noise. Says so on stderr.

    Args:
        args: the parsed command line.
        frozen: Bool[P, D] the prompts' frozen positions, or None.
    """
    if args.sampler != "ddpd":
        return
    policy = command_policy(args, "ddpd")
    free = args.length - (int(frozen.sum(1).min()) if frozen is not None else 0)
    needed = free
    if args.clock == "exact":
        reachable, how, advice = args.steps, "at most one per step", ""
    elif policy is not None:  # a step commits at most its max_k candidates
        per_step = 1 if policy.commits_one_a_step() else policy.max_k
        how = f"{'one' if per_step == 1 else f'at most {per_step}'} per step under --policy {args.policy}"
        reachable, needed = args.steps * per_step, -(-free // per_step)
        advice = "" if per_step == 1 else ", or a larger max_k"
    else:
        parallel = min(args.parallel_steps, args.steps)
        reachable = parallel * args.k + (args.steps - parallel)
        needed = max(parallel, free - parallel * (args.k - 1))  # the same parallel stage, then one a step
        how = "one per step after --parallel-steps" if parallel else "one per step"
        advice = ", or --k and --parallel-steps"
    if reachable < free:
        print(f"ddpd-sample: warning: --steps {args.steps} can denoise at most {reachable} of the {free} "
              f"positions to generate ({how}): the samples will be partly noise; give --steps >= {needed}{advice}",
              file=sys.stderr)


def run(args, stdout: Optional[Stdout] = None) -> int:
    """Sample as the command line says: load the models, draw every batch, write --out and
    stdout, print the summary.

    Args:
        args: the parsed command line, checked by check_command_line.
        stdout: where the samples are printed (a Stdout), or None for a new one.

    Returns:
        The exit status, 0.

    Raises:
        UsageError: a setting the models or the sampling layer refuse.
        Interrupted: a signal arrived (the finished samples are published first).
    """
    from ddpd.files import StreamedFile
    from ddpd.models import resolve_dtype
    from ddpd.training.distributed import Distributed

    stdout = stdout or Stdout()
    check_args(args)
    prompts = args.texts  # read by check_command_line
    threads = apply_threads(args.threads)
    group = Distributed(args.device, name="--device")  # one process, or the torchrun group
    args.device_obj = group.device
    dtype = resolve_dtype(args.dtype, args.device_obj)
    args.dtype_name = str(dtype).replace("torch.", "")
    # An unwritable --out, or one another ddpd-sample is writing, fails first.
    out = StreamedFile(args.out, one_writer=True) if args.out and group.is_main else None
    try:
        models = load_models(args, args.device_obj)
        models.prepare(dtype, args.device_obj, args.compile)
        if args.length is None:
            args.length = models.max_length
            if group.is_main:
                warn_if_lengths_differ("ddpd-sample", models.lengths, " (--length sets it)")
        if not 1 <= args.length <= models.max_length:
            raise UsageError(f"--length must be in [1, {models.max_length}] (the models' max_seq_len), "
                             f"got {args.length}")
        if args.steps is None:
            args.steps = default_steps(args.length, models.bundled)
        tokenizer = models.tokenizer()
        if tokenizer is not None and tokenizer.vocab_size != models.vocab_size:
            raise UsageError(f"the tokenizer has {tokenizer.vocab_size} symbols but the models {models.vocab_size}")
        sample, settings = make_sampler(args, models, tokenizer, prompts)
        if args.num_samples is None:
            args.num_samples = len(prompts[0]) if args.prompts or args.infills else \
                NUM_SAMPLES_BUNDLED if models.bundled else NUM_SAMPLES
        if group.is_main:
            warn_if_too_few_steps(args, settings.frozen)
        _warm_up(args)
        done, calls, elapsed = _sample_all(args, models, sample, Records(tokenizer, prompts, settings.labels), out,
                                     stdout, group)
    except BaseException:
        group.close(wait=False)
        raise
    finally:
        if out is not None and not out.published:
            out.discard()
    try:
        group.close()
        if group.is_main:
            _summary(args, done, calls, elapsed, threads, group.world_size, models.kind == "uniform")
            stdout.check(f"the {done} samples are in {args.out}" if args.out else "")
    except Interrupted as stop:  # every sample is out already
        stop.detail = _written(done, args.out) if out is not None else ""
        raise
    return 0


def _summary(args, done: int, calls: dict, elapsed: float, threads: int, processes: int,
             single: bool = False) -> None:
    """The summary line of `done` samples (fewer than --num-samples where stdout's reader
    went away without --out). single: one uniform model ran, whose passes the samplers count
    as denoiser passes, its planning calls included: the lines name the model, not the roles."""
    from ddpd.sampling.batch import nan_warning

    rate = done / elapsed if elapsed > 0 else math.inf
    roles = (("denoiser", "uniform model"),) if single else (("planner", "planner"), ("denoiser", "denoiser"))
    passes = ", ".join(f"{name} {calls[role + '_calls']} ({calls[role + '_rows']} row-evaluations, "
                       f"{calls[role + '_rows_saved']} saved by early stopping)" for role, name in roles)
    cpu = args.device_obj.type == "cpu"
    where = f"{threads} CPU thread{'s' if threads > 1 else ''}" if cpu else str(args.device_obj)
    if processes > 1:
        where = f"{processes} processes of {where}" if cpu else f"{processes} processes on {args.device_obj.type}"
    print(f"ddpd-sample: {done} samples of {args.length} tokens in {elapsed:.2f} s ({rate:.2f} samples/s, "
          f"{where}, {args.dtype_name}){', fused' if args.fused else ''}; forward passes: {passes}", file=sys.stderr)
    per_sample = {key: calls[key] / max(done, 1) for key in PER_ROW}
    total = per_sample["planner_passes"] + per_sample["denoiser_passes"]
    split = "one uniform model" if single else \
        f"planner {per_sample['planner_passes']:.1f}, denoiser {per_sample['denoiser_passes']:.1f}"
    per_pass = calls["commits"] / max(1, total * done)
    print(f"ddpd-sample: network passes per sample {total:.1f} ({split}), {per_pass:.2f} tokens committed per pass",
          file=sys.stderr)
    nan = nan_warning(calls["planner_nan_passes"], calls["planner_calls"], calls["denoiser_nan_passes"],
                      calls["denoiser_calls"], "uniform model" if single else "denoiser")
    if nan:
        print(f"ddpd-sample: warning: {nan}", file=sys.stderr)


def _warm_up(args) -> None:
    """Load what the first sampling call would otherwise load on the clock: the C++
    extension (compiled on first use where the install did not build it) and
    torch._dynamo (imported by the first call of any torch.library custom op)."""
    if args.fused:
        from ddpd.ops import load_extension

        load_extension()
        importlib.import_module("torch._dynamo")


class Records:
    """Sample i as printed (decoded text, or token ids without a tokenizer) and as a JSON line,
    with the prompt text and the label it was drawn with."""

    def __init__(self, tokenizer, prompts, labels: Optional[torch.Tensor]):
        self.tokenizer = tokenizer
        self.prompts = prompts[0] if prompts is not None else None
        self.labels = labels.tolist() if labels is not None else None

    def text(self, tokens: list[int]) -> Optional[str]:
        """A sample's decoded text.

        Args:
            tokens: its token ids.

        Returns:
            The text, or None without a tokenizer.
        """
        return self.tokenizer.decode(tokens) if self.tokenizer else None

    def line(self, i: int, text: Optional[str], tokens: list[int], steps: int, stop_step: int) -> str:
        """A sample's JSON line for --out.

        Args:
            i: the sample's index.
            text: its decoded text, or None.
            tokens: its token ids.
            steps: the step budget it was drawn with.
            stop_step: the step it stopped at.

        Returns:
            The line, with its newline.
        """
        record = {"index": i, "text": text, "tokens": tokens, "steps": steps, "stop_step": stop_step}
        if self.prompts is not None:
            record["prompt"] = self.prompts[i % len(self.prompts)]
        if self.labels is not None:
            record["label"] = self.labels[i % len(self.labels)]
        return json.dumps(record) + "\n"


def _batch(args, sample, records: Records, first: int, n: int) -> dict:
    """Sample one batch; returns its JSON lines (with --out), printed lines and counts."""
    from ddpd.sampling import NaNOutputWarning

    with warnings.catch_warnings():  # its NaN counts are summed over every batch and process by _summary
        warnings.simplefilter("ignore", NaNOutputWarning)
        result = sample(n, first)
    tokens = result.tokens.tolist()
    texts = [records.text(row) for row in tokens]
    # "steps": the budget the sample was drawn with (not the batch's last stop step, which would
    # depend on the other rows of its batch, so on --batch-size)
    lines = "".join(records.line(first + row, texts[row], tokens[row], args.steps, int(result.stop_step[row]))
                    for row in range(n)) if args.out else ""
    printed = [] if args.quiet else [texts[row].translate(ONE_LINE) if texts[row] is not None
                                     else " ".join(map(str, tokens[row])) for row in range(n)]
    counts = {key: getattr(result, key) for key in COUNTS}
    counts.update({key: int(getattr(result, key).sum()) for key in PER_ROW})
    return {"n": n, "lines": lines, "printed": printed, "counts": counts}


def _sample_all(args, models: Models, sample, records: Records, out, stdout: Stdout, group):
    """Sample every batch: in rounds of one batch per process (batch b on process
    b mod N), process 0 writing each round's batches to `out` (flushed) and their texts to
    stdout in order as soon as the round is done, keeping none. Returns (samples finished,
    call counts, seconds), `out` published (a signal meanwhile waits for it). Interrupted, or
    another process lost, the finished samples are published beside `out` as a partial result
    (ddpd.files.partial_path) and the message says so."""
    import torch

    from ddpd._interrupts import signals_held
    from ddpd.cli.common import ignore_further_signals, raise_swallowed_signal
    from ddpd.training.distributed import PeerLost

    calls = dict.fromkeys(COUNTS + PER_ROW, 0)
    batches = -(-args.num_samples // args.batch_size)  # batch b: rows [b * batch_size, ...), not listed
    done = 0
    start = time.perf_counter()
    try:
        with torch.inference_mode(), _progress(args, models, group.is_main) as advance:
            for first_batch in range(0, batches, group.world_size):
                raise_swallowed_signal()  # one lost in a batch (--compile's guards) stops the run here
                if group.all_gather(stdout.closed and out is None)[0]:
                    break  # nobody reads the samples any more
                mine = first_batch + group.rank
                first = mine * args.batch_size
                own = (_batch(args, sample, records, first, min(args.batch_size, args.num_samples - first))
                       if mine < batches else None)
                for part in group.all_gather(own):
                    if part is None or not group.is_main:
                        continue
                    with signals_held():  # a batch is both in `out` and counted, or neither
                        if out is not None:
                            out.write(part["lines"])
                        done += part["n"]
                    for key in calls:
                        calls[key] += part["counts"][key]
                    for line in part["printed"]:
                        stdout.print(line)
                # a batch that stopped early ends its share of the bar
                advance(min(first_batch + group.world_size, batches) * args.steps)
        raise_swallowed_signal()
        if out is not None:
            with signals_held():  # every sample is finished: a signal waits until they are published
                out.publish(drop_partial=True)  # an earlier run's partial result is stale now
    except (Interrupted, PeerLost) as stop:  # a signal, or another process stopped
        ignore_further_signals()
        if out is not None and done:
            # beside --out, never over it: a partial file must not replace a complete one, or pass for one
            stop.detail = _written(done, args.out if out.published else out.publish_partial())
        elif out is not None:
            stop.detail = f"; no sample was finished, {args.out} not written"
        raise
    return done, calls, time.perf_counter() - start


def _written(done: int, out: str) -> str:
    """The detail of a stopped run's line: the finished samples published to `out` (--out, or
    its partial result)."""
    return f"; wrote the {done} finished sample(s) to {out}"


@contextlib.contextmanager
def _progress(args, models: Models, shown: bool = True):
    """A progress bar over the step budget of every batch, ticked by each forward pass
    of the denoiser (one per step in every sampler but one); yields advance(to) for the end of a
    batch. tqdm shows it on a terminal only, or never with --no-progress (or `shown`
    False: a process other than the first of several)."""
    import torch
    from tqdm.auto import tqdm

    batches = -(-args.num_samples // args.batch_size)
    # one uniform model on the planner clock is called twice a step (to plan, then to denoise), but
    # once with --one-pass
    passes = 2 if (args.sampler, models.kind, args.clock, args.one_pass) == ("ddpd", "uniform", "planner", False) \
        else 1
    bar = tqdm(total=args.steps * batches * passes, desc="ddpd-sample", unit="pass", leave=False,
               disable=None if args.progress and shown else True)
    network = models.denoiser if models.denoiser is not None else models.planner
    embed = getattr(getattr(network, "backbone", None), "embed", None)

    def tick(*_) -> None:  # a forward hook must return None, or it replaces the output
        bar.update(1)

    # Every forward pass of a ddpd network (forward or hidden) embeds its tokens once. Not
    # with --compile: the hook would split the compiled trunk in two (a graph break); the
    # bar then moves at the end of each batch, as it does where CUDA graphs replay the steps.
    ticks = isinstance(embed, torch.nn.Module) and args.compile is None
    hook = embed.register_forward_hook(tick) if ticks else None

    def advance(to: int) -> None:
        bar.update(max(to * passes - bar.n, 0))

    try:
        yield advance
    finally:
        if hook is not None:
            hook.remove()
        bar.close()


def main(argv: Optional[list[str]] = None) -> int:
    """The ddpd-sample entry point.

    Args:
        argv: the arguments, or None for sys.argv[1:].

    Returns:
        The exit status.
    """
    standard_streams()
    args = build_parser().parse_args(argv)
    status = check_first("ddpd-sample", lambda: check_command_line(args))
    if status is not None:
        return status
    stdout = Stdout()
    return run_tool("ddpd-sample", lambda: run(args, stdout), value_error_status=2)


if __name__ == "__main__":
    sys.exit(main())
