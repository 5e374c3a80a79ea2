"""The training loop for every ddpd network (thm:training_objective).

One step draws clean chunks x_1, t ~ U(0, 1) per sequence and (x_t, z_t) from the
forward process, then minimises the network's objective (ddpd.training.losses): the
planner's BCE, a denoiser's CE at z_t = N, the single uniform model's or the AR judge's
CE. AdamW with warmup and cosine decay, accumulation, clipping, optional EMA, bf16
autocast on CUDA, data parallel over torchrun processes.

A Trainer holds an exclusive lock on its output directory; `request_stop` ends the loop
with a checkpoint; a resumed run computes bit for bit the updates of one that never
stopped. docs/training.md ("The loop") has the details."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import os
import signal
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import InitVar, dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ddpd._interrupts import signals_held
from ddpd.checkpoint import (
    KINDS,
    CheckpointError,
    ensure_replaceable,
    has_train_state,
    load_checkpoint,
    resume_settings,
    save_checkpoint,
    training_settings,
)
from ddpd.files import OutputLock, refuse_working_directory, remove_stale_temps
from ddpd.models import build_model, config_for
from ddpd.process import SCHEDULES, corrupt, get_schedule
from ddpd.training.data import (
    LABELLED_SUFFIX,
    GPT2Tokenizer,
    RandomCrops,
    Records,
    Text8Tokenizer,
    encode_corpus,
    evaluation_batches,
    fingerprint,
    is_labelled,
    load_labelled,
    load_text,
    read_gpt2_ranks,
    resolve_source,
    split_tokens,
)
from ddpd.training.distributed import Distributed, GradientMean, PeerLost, data_parallel
from ddpd.training.losses import ar_loss, denoiser_loss, planner_loss, uniform_model_loss
from ddpd.validation import caller_level, check_choice, check_device, check_float, check_int

TOKENIZERS = ("text8", "gpt2")
BETAS = (0.9, 0.95)  # AdamW's
# AdamW settings a resume must keep: an edited state must not make a run ascend (maximize) or change
# its kernels. Groups saved by an earlier torch lack the later keys; AdamW's load gives them its defaults.
SETTLED_BY_THE_RUN = ("betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
                      "differentiable", "fused")
# AdamW's float32 step is lr / (1 - beta1) at the first step: a larger lr overflows it
MAX_LR = float(torch.finfo(torch.float32).max) * (1.0 - BETAS[0])
# the stop check's code for a stop that names no signal: above "no stop" (0), below every signal's number
UNNAMED_STOP = 0.5
# Settings a resumed run must keep (it is the same run). The corpus is compared by its
# content (`corpus` fingerprint) where the checkpoint records one, by its path where not; a
# --tiktoken file may move, since every one accepted is the same ranks (its sha256 is checked).
RESUME_FIXED = ("kind", "data", "batch_size", "seq_len", "d_model", "n_layers", "n_heads", "dropout", "lr",
                "min_lr", "warmup", "weight_decay", "grad_accum", "grad_clip", "ema", "seed", "tokenizer",
                "schedule", "steps", "max_time", "num_classes", "label_dropout", "eval_batches")


class ResumeConflict(ValueError):
    """A resumed run given settings other than its own: `changed` holds (setting, the
    run's value, the value given)."""

    def __init__(self, out: str, changed: list[tuple[str, object, object]]):
        self.out, self.changed = out, changed
        super().__init__(f"cannot resume {out} with changed settings: "
                         + ", ".join(f"{name} ({old!r} -> {new!r})" for name, old, new in changed))


class OtherCorpus(ResumeConflict, CheckpointError):
    """A resumed run given (`data`) another corpus than the one it started on: a changed
    setting, as ResumeConflict, whose message says which corpus each is."""

    def __init__(self, out: str, started_on: str, given: str, message: str):
        super().__init__(out, [("data", started_on, given)])
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]


class OccupiedOutput(ValueError):
    """A fresh run's out directory already holds a checkpoint: `out` is that directory."""

    def __init__(self, out: str):
        self.out = out
        super().__init__(f"out directory {out} already holds a checkpoint; pass resume (--resume) to continue it "
                         "or choose another out directory")


@dataclass
class TrainConfig:
    """Settings of one training run. batch_size is per process and per micro-batch:
    an optimizer step sees batch_size * grad_accum * world_size sequences."""

    kind: str
    data: str
    out: str
    steps: int = 1000
    batch_size: int = 64
    seq_len: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    dropout: float = 0.0
    lr: float = 3e-4
    min_lr: Optional[float] = None  # end of the cosine decay; None: lr / 10
    warmup: int = 100
    weight_decay: float = 0.1
    grad_accum: int = 1
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    ema: float = 0.0  # EMA decay of the exported weights; 0 disables EMA
    eval_every: int = 100
    eval_batches: int = 16
    save_every: int = 1000
    seed: int = 0
    tokenizer: str = "text8"
    tiktoken: Optional[str] = None
    schedule: str = "linear"
    device: str = "auto"  # auto, cpu, cuda, cuda:N or a torch.device (recorded by its name)
    # training seconds (evaluation and checkpoints excluded); None: no limit. The cosine
    # decay follows whichever of steps and max_time runs out first, so a run cut by the
    # clock still ends at final_lr (its step count then depends on the machine), unless
    # the clock runs out within the warmup, which goes by steps.
    max_time: Optional[float] = None
    # class-conditional training on a labelled corpus (.jsonl): labels in [0, num_classes),
    # each replaced by the null label num_classes with probability label_dropout
    # (classifier-free guidance needs the unconditional model too)
    num_classes: int = 0
    label_dropout: float = 0.0
    # data is a checkpoint's record (resolve_source's canonical form, as a resume takes it),
    # not a user's: a corpus name stays that corpus, not a file of that name in the cwd
    data_recorded: InitVar[bool] = False

    def __post_init__(self, data_recorded: bool) -> None:
        check_choice("kind", self.kind, KINDS)
        for name in ("data", "out", "tiktoken"):  # config.json records a path as a str
            if isinstance(getattr(self, name), os.PathLike):
                setattr(self, name, os.fspath(getattr(self, name)))
        for name in ("data", "out"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise TypeError(f"{name} must be a non-empty path, got {getattr(self, name)!r}")
        check_choice("tokenizer", self.tokenizer, TOKENIZERS)
        if self.tiktoken and self.tokenizer != "gpt2":
            raise ValueError(f"tiktoken (a GPT-2 ranks file) needs tokenizer='gpt2', got tokenizer={self.tokenizer!r}")
        for name in ("steps", "batch_size", "seq_len", "d_model", "n_layers", "n_heads", "grad_accum",
                     "eval_every", "eval_batches", "save_every"):
            setattr(self, name, check_int(name, getattr(self, name), 1))
        self.warmup = check_int("warmup", self.warmup, 0)
        self.seed = check_int("seed", self.seed, 0, 2**63 - 1)
        self.num_classes = check_int("num_classes", self.num_classes, 0)
        self._check_numbers()
        if not 0 < self.lr <= MAX_LR:
            raise ValueError(f"lr must be in (0, {MAX_LR:.6g}], got {self.lr}")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        for name, value, low, high in (("dropout", self.dropout, 0.0, 1.0), ("ema", self.ema, 0.0, 1.0),
                                       ("label_dropout", self.label_dropout, 0.0, 1.0)):
            if not low <= value < high:
                raise ValueError(f"{name} must be in [{low}, {high}), got {value}")
        if self.max_time is not None and not 0 < self.max_time < math.inf:  # inf: not JSON in config.json
            raise ValueError(f"max_time must be a finite number of seconds > 0, got {self.max_time}")
        for name in ("weight_decay", "grad_clip"):  # NaN passes a "< 0" test: it would switch clipping off
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be finite and >= 0, got {getattr(self, name)}")
        if not isinstance(self.schedule, str):  # config.json records it: a Schedule failed at the first save
            raise TypeError(f"schedule must be a schedule's name {SCHEDULES}, got {type(self.schedule).__name__}")
        check_choice("schedule", self.schedule, SCHEDULES)
        if isinstance(self.device, torch.device):  # config.json records it: a torch.device failed at the first save
            self.device = str(self.device)
        # the network's shape (d_model a multiple of n_heads, ...), refused now rather than after
        # the corpus is read; the vocabulary is not known yet and does not constrain it
        network = config_for(self.kind, 1, self.seq_len, d_model=self.d_model, n_layers=self.n_layers,
                             n_heads=self.n_heads, dropout=self.dropout, num_classes=self.num_classes)
        self._check_model_fits(network.mlp_ratio)
        self._check_batch_fits()
        if self.label_dropout and not self.num_classes:
            raise ValueError(f"label_dropout needs num_classes > 0 (class labels to drop), got {self.label_dropout}")
        # absolute paths, so a resumed run recognises its settings from any directory
        given, self.data = self.data, resolve_source(self.data, recorded=data_recorded)
        if self.num_classes and not is_labelled(self.data):  # as given and name=value: ddpd-train's --data as typed
            raise ValueError(f"num_classes needs a labelled corpus (a {LABELLED_SUFFIX} file of "
                             f"{{\"text\": str, \"label\": int}} lines), got data={given!r}")
        if self.tiktoken:
            given, self.tiktoken = self.tiktoken, os.path.abspath(self.tiktoken)
            if os.path.isfile(self.tiktoken):  # other ranks refused now, not after the lock and the corpus
                read_gpt2_ranks("tiktoken", given)  # as given, as data is (a missing file stays the tokenizer's error)
        self.out = os.path.abspath(self.out)

    def _check_numbers(self) -> None:
        """TypeError naming a real-valued setting that is not a number; the others become
        Python floats. A str (YAML reads 3e-4 as one) met the range checks as a bare TypeError,
        a bool passed as 0 or 1, and a numpy number failed the first save (no JSON)."""
        for name in ("lr", "min_lr", "dropout", "weight_decay", "grad_clip", "ema", "max_time", "label_dropout"):
            value = getattr(self, name)
            if value is None and name in ("min_lr", "max_time"):  # lr / 10, no limit
                continue
            if type(value) is not float:  # a float's range (NaN included) is checked by the caller
                setattr(self, name, check_float(name, value, -math.inf))

    def _check_model_fits(self, mlp_ratio: int) -> None:
        """ValueError naming d_model and n_layers when the training state of the network cannot
        fit the device's memory: counted from the settings, refused before any allocation."""
        memory = _device_memory(self.device)
        # a lower bound: each block's attention (4 d^2) and MLP (2 ratio d^2) weights
        parameters = self.n_layers * (4 + 2 * mlp_ratio) * self.d_model ** 2
        copies = {"weights": 1, "gradients": 1, "AdamW's two moments": 2}  # float32 tensors of the parameters' size
        if self.ema > 0:
            copies["EMA weights"] = 1
        needed = parameters * 4 * sum(copies.values())
        if memory is not None and needed > memory:
            raise ValueError(f"d_model {self.d_model} and n_layers {self.n_layers}: the model's {parameters:,} "
                             f"parameters or more need at least {needed / 2**30:,.0f} GiB to train (float32 "
                             f"{', '.join(copies)}), more than the {memory / 2**30:,.1f} GiB of the device; use a "
                             "smaller d_model or n_layers")

    def _check_batch_fits(self) -> None:
        """ValueError naming batch_size when one micro-batch cannot fit the device's memory:
        refused at once (a batch size of 10^7 reached the allocator after a minute)."""
        memory = _device_memory(self.device)
        tokens = self.batch_size * self.seq_len
        # a lower bound: the tokens, and the residual stream each block keeps for backward (at least bf16)
        needed = tokens * (8 + 2 * self.d_model * (self.n_layers + 1))
        if memory is not None and needed > memory:
            raise ValueError(f"batch_size {self.batch_size}: a micro-batch of {self.batch_size} x {self.seq_len} "
                             f"tokens needs at least {needed / 2**30:,.0f} GiB (d_model {self.d_model}, "
                             f"{self.n_layers} layers), more than the {memory / 2**30:,.1f} GiB of the device; use "
                             "a smaller batch_size (grad_accum keeps the step's size)")

    @property
    def final_lr(self) -> float:
        return self.lr / 10 if self.min_lr is None else self.min_lr

    def to_dict(self) -> dict:
        """The settings as a plain dict (what a checkpoint records).

        Returns:
            setting name -> value.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, data_recorded: bool = False) -> TrainConfig:
        """The TrainConfig of a dict written by to_dict.

        Args:
            values: setting name -> value.
            data_recorded: values["data"] is a checkpoint's record of its corpus (a resume's):
                a corpus name there is that corpus, even beside a file of that name.

        Returns:
            The validated TrainConfig.

        Raises:
            ValueError: unknown settings, or a setting out of range.
            TypeError: a setting of the wrong type.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}")
        return cls(**values, data_recorded=data_recorded)


def _device_memory(device: str) -> Optional[int]:
    """Bytes of memory of the device a run names (the machine's for the CPU); None when it
    is unknown or the name is refused (by the run, later)."""
    try:
        resolved = check_device("device", device)
    except (TypeError, ValueError):
        return None
    if resolved.type == "cuda":
        return torch.cuda.get_device_properties(resolved if resolved.index is not None else 0).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return None


def _pooled(losses: list[float], terms: list[Optional[float]]) -> Optional[float]:
    """The loss over every term of the steps (`losses`, each over `terms[i]` terms): the
    ratio of their sums to their counts, as evaluate() pools its batches. A plain mean of
    the steps where a count is None (restored from a checkpoint that kept no counts)."""
    if not losses:
        return None
    if None in terms:
        return sum(losses) / len(losses)
    return sum(loss * count for loss, count in zip(losses, terms)) / sum(terms)


def _names_the_default_min_lr(changed: list[tuple[str, object, object]], lr: float) -> bool:
    """Whether a resume's min_lr, given for a run that recorded None (lr / 10), is that value: the
    same learning rate, not a change (3e-5 for lr 3e-4 too, where lr / 10 is one ulp below it)."""
    given = [new for name, old, new in changed if name == "min_lr" and old is None and new is not None]
    return bool(given) and math.isclose(given[0], lr / 10, rel_tol=1e-12)


def learning_rate(step: int, config: TrainConfig, seconds: float = 0.0) -> float:
    """The learning rate of optimizer step `step` (0 to steps - 1): linear warmup over the
    first `warmup` steps up to lr, then cosine decay down to final_lr at the last step,
    or at config.max_time training seconds (`seconds` so far) if that comes first. With
    warmup >= steps the run is all warmup (the Trainer warns).

    Args:
        step: the optimizer step, from 0.
        config: the run's settings (lr, final_lr, warmup, steps, max_time).
        seconds: training seconds so far (with config.max_time).

    Returns:
        The learning rate.
    """
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    peak = max(config.warmup - 1, 0)  # the step at lr: the last of the warmup, or the first
    progress = min((step - peak) / max(config.steps - 1 - peak, 1), 1.0)
    if config.max_time is not None:
        progress = max(progress, min(seconds / config.max_time, 1.0))
    return config.final_lr + 0.5 * (config.lr - config.final_lr) * (1.0 + math.cos(math.pi * progress))


def make_tokenizer(config: TrainConfig):
    """The tokenizer a run's settings name (text8, or GPT-2 from config.tiktoken).

    Args:
        config: the run's settings.

    Returns:
        A Text8Tokenizer or GPT2Tokenizer.
    """
    return GPT2Tokenizer(config.tiktoken) if config.tokenizer == "gpt2" else Text8Tokenizer()


def check_train_record(path: str, meta: dict, steps: Optional[int] = None) -> None:
    """CheckpointError (one line) unless a training state's meta records a run as
    ddpd-train writes it: the step (at most `steps`, when given), the history of
    {step, train_loss, val_loss} records, the clock, the token count and the pending
    losses with their term counts (ddpd-eval training reads the same record).

    Args:
        path: the checkpoint (for messages).
        meta: the training state's meta.
        steps: the most steps the record may hold, or None.

    Raises:
        CheckpointError: the record is malformed.
    """
    def fail(what: str):
        raise CheckpointError(f"checkpoint {path}: train_state.json: {what}")

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or (steps is not None and step > steps):
        fail(f"'step' must be an int in [0, {steps if steps is not None else 'steps'}], got {step!r:.40}")
    history = meta.get("history")
    if not isinstance(history, list) or not all(
            isinstance(h, dict) and isinstance(h.get("step"), int)
            and all(h.get(key) is None or number(h[key]) for key in ("train_loss", "val_loss")) for h in history):
        fail(f"'history' must be a list of records with a 'step' and numeric losses, got {str(history)[:60]}")
    seconds, tokens = meta.get("train_seconds", 0.0), meta.get("train_tokens", 0)
    if not number(seconds) or not 0 <= seconds < math.inf:
        fail(f"'train_seconds' must be a finite number >= 0, got {seconds!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        fail(f"'train_tokens' must be an int >= 0, got {tokens!r}")
    pending = meta.get("pending_losses", [])
    if not isinstance(pending, list) or not all(number(x) for x in pending):
        fail(f"'pending_losses' must be a list of numbers, got {str(pending)[:60]}")
    terms = meta.get("pending_terms", [None] * len(pending))  # None: a count an earlier release did not keep
    if not isinstance(terms, list) or len(terms) != len(pending) or not all(
            n is None or (number(n) and 0 < n < math.inf) for n in terms):
        fail(f"'pending_terms' must be a list of {len(pending)} counts > 0 (one per pending loss), "
             f"got {str(terms)[:60]}")


def check_train_state(path: str, tensors: dict[str, Tensor], meta: dict, steps: int, world_size: int) -> None:
    """CheckpointError (one line) unless a training state is one this run can resume, as far
    as the network does not decide (check_state_tensors does the rest): its record
    (check_train_record), written by as many processes, and optimizer moments AdamW can
    step from (check_moments). Checked before the corpus is read and the network built.

    Args:
        path: the checkpoint (for messages).
        tensors: the training state's tensors.
        meta: the training state's meta.
        steps: the run's step count.
        world_size: the number of processes of this run.

    Raises:
        CheckpointError: the state cannot be resumed.
        ValueError: the state was written by another number of processes than this run's.
    """
    check_train_record(path, meta, steps)
    if meta.get("world_size") != world_size:
        raise ValueError(f"cannot resume {path} exactly: it was written by {meta.get('world_size')!r} "
                         f"process(es), this run has {world_size}")
    if not isinstance(meta.get("optimizer_param_groups"), list):
        raise CheckpointError(f"checkpoint {path}: train_state.json: 'optimizer_param_groups' must be a list, got "
                              f"{meta.get('optimizer_param_groups')!r}")
    check_moments(path, tensors)


def check_moments(path: str, tensors: dict[str, Tensor]) -> None:
    """CheckpointError unless every optimizer tensor is finite, the second moments (exp_avg_sq)
    and step counts >= 0: a NaN moment, or the square root of a negative one, makes NaN
    weights within two steps (a crafted state was accepted and the loss turned NaN).

    Args:
        path: the checkpoint (for messages).
        tensors: the training state's tensors.

    Raises:
        CheckpointError: a moment or step count is not finite or negative.
    """
    for name, value in tensors.items():
        if not (name.startswith("optim.") and value.is_floating_point()):
            continue
        where = f"checkpoint {path}: train_state.safetensors holds"
        if not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{where} NaN or infinite values in {name}")
        if name.endswith(("exp_avg_sq", ".step")) and bool((value < 0).any()):
            raise CheckpointError(f"{where} negative values in {name} (at least {value.min().item():.3g}), which "
                                  f"{'a second moment' if name.endswith('exp_avg_sq') else 'a step count'} "
                                  "cannot hold")


def check_state_tensors(path: str, tensors: dict[str, Tensor], expected: dict[str, Optional[tuple]]) -> None:
    """CheckpointError unless every tensor in `expected` (name -> shape, or None for any
    shape) is in the training state.

    Args:
        path: the checkpoint (for messages).
        tensors: the training state's tensors.
        expected: name -> shape (None: any shape).

    Raises:
        CheckpointError: a tensor is missing or of another shape.
    """
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"checkpoint {path}: train_state.safetensors lacks {name}")
        if shape is not None and tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"checkpoint {path}: train_state.safetensors holds {name} of shape "
                                  f"{tuple(tensors[name].shape)}, expected {shape}")


def _signal_number(reason: str) -> Optional[int]:
    """The number of the signal a stop reason names ("SIGTERM"), or None."""
    member = signal.Signals.__members__.get(reason) if isinstance(reason, str) else None
    return None if member is None else int(member)


def _settled(group: dict) -> dict:
    """The settings of an optimizer parameter group a resumed run must share (JSON made the
    betas a list)."""
    return {key: tuple(group[key]) if isinstance(group.get(key), list) else group.get(key)
            for key in SETTLED_BY_THE_RUN}


def stream_seed(seed: int, rank: int, stream: str) -> int:
    """An independent 63-bit seed for one random stream of one process.

    Args:
        seed: the run's seed.
        rank: the process's rank.
        stream: the stream's name.

    Returns:
        A seed in [0, 2**63).
    """
    digest = hashlib.sha256(f"ddpd/{seed}/{rank}/{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class Trainer:
    """Train one network as configured; `train()` runs to `config.steps` (or `stop_at`),
    evaluating every `eval_every` and checkpointing to `config.out` every `save_every`
    steps and at the end. `resume=True` continues the checkpoint in `config.out`.
    The output stays locked until `close()` (or the end of a `with` block).

    Args:
        config: the run's settings.
        resume: continue the checkpoint in config.out (exactly, when the hardware, threads
            and processes match).
        progress: draw a progress bar on a terminal.
        log: a callback for log lines; None shows them above the progress bar, or
            nowhere without one (warnings then come as Python UserWarnings).
        allow_data_change: resume even though the corpus's text changed.

    Raises:
        ddpd.files.OutputLockedError: another process writes config.out.
        ddpd.files.OutputError: config.out is the working directory or holds it.
        CheckpointError: config.out holds something that may not be replaced, or a
            checkpoint that cannot be resumed.
        ValueError: settings that do not fit the corpus or the device.

    Example:
        >>> with Trainer(TrainConfig(kind="planner", data="books", out="runs/planner", steps=100)) as trainer:
        ...     history = trainer.train()
    """

    def __init__(self, config: TrainConfig, resume: bool = False, progress: bool = False,
                 log: Optional[Callable[[str], None]] = None, allow_data_change: bool = False):
        self.config = config
        self.progress = progress
        self._log = log
        self.allow_data_change = allow_data_change
        self.stop_reason: Optional[str] = None
        self.stop_signal: Optional[int] = None  # the number of the signal that stopped the run, agreed by every process
        self._lock: Optional[OutputLock] = None
        self._saved_step: Optional[int] = None  # the step of the checkpoint in config.out, if any
        self.dist = Distributed(config.device)
        self.device = self.dist.device
        try:
            if self.dist.is_main:  # one writer per output, for the whole run
                self._lock = OutputLock(config.out).acquire()
            self._setup(resume)
        except BaseException:
            # no final barrier: a refusal on process 0 (a locked or occupied output) leaves the
            # others inside a collective of _setup, which they would never leave
            self.close(wait=False)
            raise

    # ---- setup -------------------------------------------------------------------

    def _setup(self, resume: bool) -> None:
        config = self.config
        if self.dist.is_main:  # of saves killed before they finished; first, as it may restore the checkpoint
            refuse_working_directory(config.out)  # every save replaces it by a rename: refused before any step
            remove_stale_temps(config.out)
        stored = self._load_resumable() if resume else None
        if not resume and self.dist.is_main:
            self._check_fresh_destination()
        self.tokenizer = make_tokenizer(config)
        self.vocab_size = self.tokenizer.vocab_size
        self.schedule = get_schedule(config.schedule)
        text = load_text(config.data, recorded=True)  # resolved by the config: a corpus name is that corpus
        self.corpus = fingerprint(text)
        if stored is not None:
            self._check_corpus(stored.config)
        splits = self._splits(text)
        del text
        self._check_splits(splits)
        self.train_batches = RandomCrops(splits["train"], config.seq_len, config.batch_size,
                                         stream_seed(config.seed, self.dist.rank, "data"))
        self.eval_set = evaluation_batches(splits["validation"], config.seq_len, config.batch_size,
                                           config.eval_batches)
        with signals_held():  # AdamW's constructor imports torch._dynamo and triton: C++ a signal must not cut
            self._build_model()
        self.noise = torch.Generator(self.device).manual_seed(stream_seed(config.seed, self.dist.rank, "noise"))
        torch.manual_seed(stream_seed(config.seed, self.dist.rank, "dropout"))
        self.step = 0
        self.history: list[dict] = []
        self.train_seconds, self.train_tokens = 0.0, 0
        self._losses: list[float] = []  # the step losses since the last history record
        self._terms: list[Optional[float]] = []  # and their term counts, to pool them
        if stored is not None:
            self._restore(stored)

    def _build_model(self) -> None:
        config = self.config
        self.model_config = config_for(config.kind, self.vocab_size, config.seq_len, d_model=config.d_model,
                                       n_layers=config.n_layers, n_heads=config.n_heads, dropout=config.dropout,
                                       num_classes=config.num_classes)
        torch.manual_seed(config.seed)  # the same initial weights on every process
        self.model = build_model(config.kind, self.model_config).to(self.device)
        self.ema = copy.deepcopy(self.model).requires_grad_(False) if config.ema > 0 else None
        self.network = self.model
        self.reduction = None
        if self.dist.world_size > 1:
            self.network = data_parallel(self.model)
            self.reduction = GradientMean(self.dist.world_size)
            self.reduction.attach(self.network)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.lr, betas=BETAS, eps=1e-8)

    def _check_fresh_destination(self) -> None:
        ensure_replaceable(self.config.out)
        if os.path.isdir(self.config.out) and os.listdir(self.config.out):
            raise OccupiedOutput(self.config.out)

    def _load_resumable(self):
        """The checkpoint in config.out with its training state, verified and read from
        one save, and checked to be this run."""
        out = self.config.out
        if not has_train_state(out):
            raise CheckpointError(f"cannot resume: {out} holds no training checkpoint")
        stored = load_checkpoint(out, train_state=True)
        settings = resume_settings(out, stored.config)  # the run's own, as digested when it was saved
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # of settings added later
        fixed = [name for name in RESUME_FIXED if name != "data" or "corpus" not in stored.config]
        changed = [(name, settings.get(name, defaults[name]), getattr(self.config, name))
                   for name in fixed if settings.get(name, defaults[name]) != getattr(self.config, name)]
        if changed and _names_the_default_min_lr(changed, settings.get("lr", defaults["lr"])):
            self.config.min_lr = None  # the run's own record, so its schedule is the same to the bit
            changed = [change for change in changed if change[0] != "min_lr"]
        if changed:
            raise ResumeConflict(out, changed)
        check_train_state(out, *stored.train_state, self.config.steps, self.dist.world_size)
        return stored

    def _check_corpus(self, stored_config: dict) -> None:
        """A resumed run must read the corpus it started on: a corpus appended to or
        edited moves text between the training, validation and test ranges."""
        recorded = stored_config.get("corpus")
        if recorded is None or recorded == self.corpus or self.allow_data_change:
            return
        then = (f"{recorded.get('chars')} characters, sha256 {str(recorded.get('sha256'))[:12]}"
                if isinstance(recorded, dict) else repr(recorded))
        now = f"{self.corpus['chars']} characters, sha256 {self.corpus['sha256'][:12]}"
        started_on = training_settings(self.config.out, stored_config).get("data")
        if started_on is not None and started_on != self.config.data:  # given another, not the same one moved
            raise OtherCorpus(
                self.config.out, started_on, self.config.data,
                f"cannot resume {self.config.out}: the corpus {self.config.data} is not the one the run started "
                f"on, {started_on} ({then}; {self.config.data}: {now}); pass allow_data_change "
                "(--allow-data-change) to resume on it anyway")
        raise CheckpointError(
            f"cannot resume {self.config.out}: the corpus {self.config.data} changed since the run started "
            f"({then}; now {now}), which moves validation and test text into training; pass allow_data_change "
            "(--allow-data-change) to resume anyway")

    def _splits(self, text: str) -> dict[str, Records]:
        """The train, validation and test Records of the corpus: a plain one split by position,
        a labelled one by records within each class (their labels kept when the model is
        class-conditional)."""
        config = self.config
        if not is_labelled(config.data):
            return {name: Records.stream(tokens) for name, tokens in
                    split_tokens(encode_corpus(text, self.tokenizer, f"data {config.data}")).items()}
        records = load_labelled(config.data, self.tokenizer, text)
        if config.num_classes and int(records.labels.max()) >= config.num_classes:
            raise ValueError(f"data {config.data} has label {int(records.labels.max())}, but num_classes="
                             f"{config.num_classes} (labels must be in [0, {config.num_classes}))")
        splits = records.split()  # by class either way: a conditional and an unconditional network hold out alike
        if not config.num_classes:
            for part in splits.values():
                part.labels = None  # an unconditional model trained on the records' texts
        return splits

    def _check_splits(self, splits: dict[str, Records]) -> None:
        seq_len = self.config.seq_len
        for name in ("train", "validation"):
            if not int(splits[name].windows(seq_len).sum()):
                held = splits[name].lengths
                total = int(held.sum())
                what = f"{total} token{'' if total == 1 else 's'}" if held.numel() <= 1 else \
                    f"{held.numel()} records of at most {int(held.max())} tokens"
                raise ValueError(f"data {self.config.data}: its {name} split holds {what}, "
                                 f"fewer than seq_len={seq_len}; use a longer corpus or a shorter seq_len")
        self._warn_of_untrained_classes(splits)
        self._warn_of_short_records(splits["train"])
        if self.config.warmup >= self.config.steps:
            # name=value: ddpd-train's log names them by their flags
            self._warn(f"warmup={self.config.warmup} >= steps={self.config.steps}: the learning rate rises through "
                       f"the whole run and never decays to min_lr (give warmup=N below steps={self.config.steps})")

    def _warn_of_untrained_classes(self, splits: dict[str, Records]) -> None:
        """A class whose records all went to validation and test (a class of a few records:
        the split is 90/5/5 by position within each class), or whose training records are
        all shorter than seq_len, is never trained on: say so."""
        train = splits["train"]
        if train.labels is None:
            return
        trained = set(train.labels[train.windows(self.config.seq_len) > 0].tolist())
        every = set(torch.cat([part.labels for part in splits.values()]).tolist())
        for label in sorted(every - trained):
            self._warn(f"class {label} of data {self.config.data} has no training record of seq_len="
                       f"{self.config.seq_len} tokens or more (a class's records are split 90/5/5 in order): "
                       "the network will not learn it")

    def _warn_of_short_records(self, train: Records) -> None:
        """Training records shorter than seq_len hold no training window, so they are never
        trained on: say how many (those of a class named by _warn_of_untrained_classes aside)."""
        seq_len = self.config.seq_len
        short = train.windows(seq_len) == 0
        if train.labels is not None:
            short &= torch.isin(train.labels, train.labels[~short])
        if train.lengths.numel() <= 1 or not bool(short.any()):
            return
        self._warn(f"{int(short.sum())} of {train.lengths.numel()} training records of data {self.config.data} are "
                   f"shorter than seq_len={seq_len} tokens ({int(train.lengths[short].sum())} of "
                   f"{int(train.lengths.sum())} training tokens): a training window lies within one record, so the "
                   "network never trains on them (give a shorter seq_len to use them)")

    # ---- the loop ----------------------------------------------------------------

    def train(self, stop_at: Optional[int] = None) -> list[dict]:
        """Run optimizer steps until `stop_at` (default config.steps); returns the
        history of {step, train_loss, val_loss} records.

        Args:
            stop_at: the step to stop at; None: config.steps.

        Returns:
            The history, a list of {step, train_loss, val_loss} dicts.
        """
        config = self.config
        if stop_at is not None:
            stop_at = check_int("stop_at", stop_at, 0)
        stop_at = config.steps if stop_at is None else min(stop_at, config.steps)
        tokens_per_step = config.batch_size * config.grad_accum * config.seq_len * self.dist.world_size
        if self.step == 0 and not self.history:
            self._record(None)  # the untrained baseline
        bar = self._progress_bar(stop_at)
        # saved with the checkpoint: a resumed run pools what the whole run would
        losses, terms = self._losses, self._terms
        # _stopping first: every process calls its collective the same number of times; what they
        # agreed decides the final save too (a signal after the last check reaches one process only)
        while not (stopped := self._stopping()) and self.step < stop_at:
            started = time.perf_counter()
            result = self._optimizer_step()
            if result is not None:  # a step without a term (nothing corrupted) has no loss, not 0
                losses.append(result[0])
                terms.append(result[1])
            self.step += 1
            self.train_seconds += time.perf_counter() - started
            self.train_tokens += tokens_per_step
            if bar is not None:
                bar.set_postfix(loss=f"{losses[-1]:.4f}" if losses else "-", tok_s=f"{self.tokens_per_second:,.0f}")
                bar.update(1)
            if self.step % config.eval_every == 0 or self.step == config.steps:
                self._record(_pooled(losses, terms))
                losses.clear()
                terms.clear()
            if self.step % config.save_every == 0 or self.step == stop_at:
                self.save()
        if bar is not None:
            bar.close()
        unsaved = self._saved_step != self.step
        if self.out_of_time and self.history[-1]["step"] != self.step:
            self._record(_pooled(losses, terms))  # the last steps of a run cut by the clock
            losses.clear()
            terms.clear()
            unsaved = True  # a checkpoint of this step saved before the record lacks it
        if stopped and unsaved:
            self.save()  # a stopped run continues from where it stopped
        if self.out_of_time and self.step < config.steps:
            self.log(f"stopped by max_time ({config.max_time:g} s of training) at step {self.step} of {config.steps}")
            if self.step < config.warmup:  # the warmup goes by steps: the clock's decay never began
                self._warn(f"max_time ran out at step {self.step}, within the warmup of {config.warmup} steps: the "
                           "learning rate rose through the whole run and never decayed to min_lr (give warmup=N "
                           "below the steps max_time allows)")
        if self.step == config.steps:
            # a stop asked for during the last step: the run is complete, not interrupted
            self.stop_reason, self.stop_signal = None, None
        return self.history

    def request_stop(self, reason: str) -> None:
        """Ask train() to return after the current step, with a checkpoint there (safe
        to call from a signal handler). A reason that names a signal sets stop_signal, in
        every process of a torchrun (their exit status).

        Args:
            reason: why, for the log line (e.g. "SIGTERM").
        """
        if self.stop_reason is None and self.step < self.config.steps:  # once complete, nothing to stop
            self.stop_signal = _signal_number(reason)
            self.stop_reason = reason

    def _stopping(self) -> bool:
        """Whether to stop before the next step: a stop was requested or the time is up,
        agreed by every process (they may see a signal at different steps). Their clocks
        become the slowest one's: the learning rate under max_time, the records and the
        saves follow one clock, or the processes' weights and collectives part ways."""
        if self.dist.world_size == 1:
            return self.stop_reason is not None or self.out_of_time
        stop, self.train_seconds = self.dist.max([self._stop_code(), self.train_seconds])
        self._agree_on_the_stop(stop)
        # the agreed flag, not stop_reason again: a signal handled after this process contributed 0
        # would stop it alone (it would save, in collectives the others never enter); it counts next step
        return bool(stop) or self.out_of_time

    def _stop_code(self) -> float:
        """This process's stop request in the one all-reduce of the stop check: 0 none, the
        signal's number for a signal, UNNAMED_STOP for another reason."""
        if self.stop_reason is None:
            return 0.0
        return float(self.stop_signal) if self.stop_signal is not None else UNNAMED_STOP

    def _agree_on_the_stop(self, stop: float) -> None:
        """Take the agreed stop (the largest code): a peer's signal names this process's
        stop_reason and sets its stop_signal, so every process exits with one status."""
        if stop >= 1 and int(stop) != self.stop_signal:
            self.stop_signal = int(stop)
            self.stop_reason = f"{signal.Signals(self.stop_signal).name} in another process"
        elif stop and self.stop_reason is None:
            self.stop_reason = "a stop requested in another process"

    @property
    def out_of_time(self) -> bool:
        """Whether config.max_time training seconds have passed.

        Returns:
            True once the run is out of time (never without max_time).
        """
        return self.config.max_time is not None and self.train_seconds >= self.config.max_time

    @property
    def tokens_per_second(self) -> float:
        """Training throughput of this run so far (all processes; evaluation and
        checkpointing excluded).

        Returns:
            Tokens a second.
        """
        return self.train_tokens / self.train_seconds if self.train_seconds > 0 else 0.0

    @contextmanager
    def _peer_failures(self):
        """A failed all-reduce of the gradients (another process stopped) as PeerLost."""
        try:
            yield
        except RuntimeError as err:
            if self.reduction is not None and self.reduction.failed:
                raise PeerLost(err) from err
            raise

    def _optimizer_step(self) -> Optional[tuple[float, float]]:
        """One optimizer step; (its loss over every micro-batch and process, the number of
        terms it pooled), or None when it had no term."""
        config = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, config, self.train_seconds)
        self.network.train()
        total, count = 0.0, 0.0
        for micro in range(config.grad_accum):
            x1, labels = self._to_device(next(self.train_batches))
            last = micro == config.grad_accum - 1
            sync = self.network.no_sync() if self.dist.world_size > 1 and not last else nullcontext()
            with sync, self._peer_failures():
                with self._autocast():
                    loss_sum, terms = self.objective(self.network, x1, self.noise, labels, config.label_dropout)
                loss_sum.backward()
            total, count = total + loss_sum.item(), count + float(terms)
        # The step's loss is the mean over all its terms (the denoiser's: its corrupted
        # positions), whichever micro-batch and process they fell in: the gradients hold
        # each process's sum, averaged over the processes.
        total, count = self.dist.sum([total, count])
        terms, count = count, max(count, 1.0)  # a step without a corrupted position: a zero gradient
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, self.dist.world_size / count)
        loss = total / count
        if not math.isfinite(loss):
            self._diverged(f"training loss is {loss} at step {self.step + 1}")
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(list(self.ema.parameters()), list(self.model.parameters()), 1.0 - config.ema)
        return (loss, terms) if terms > 0 else None

    def _to_device(self, batch) -> tuple[Tensor, Optional[Tensor]]:
        """(x1, labels or None) of a batch of RandomCrops / evaluation_batches, on the device."""
        x1, labels = batch if isinstance(batch, tuple) else (batch, None)
        return x1.to(self.device, non_blocking=True), None if labels is None else labels.to(self.device)

    def objective(self, network, x1: Tensor, generator: torch.Generator, labels: Optional[Tensor] = None,
                  label_dropout: float = 0.0) -> tuple[Tensor, Tensor]:
        """The training loss of config.kind on clean chunks x1: Long[B, L] of classes `labels`
        (Long[B], class-conditional models), each replaced by the null label with
        probability label_dropout (drawn from `generator` after the corruption), as (the
        sum of its terms, their count): the loss is their ratio, over a whole step or a
        whole evaluation, not a mean of per-batch means.

        Args:
            network: the network being trained (or its DDP wrapper).
            x1: Long[B, L] clean chunks.
            generator: the corruption's torch.Generator.
            labels: Long[B] class ids, or None.
            label_dropout: the probability of replacing a label by the null label.

        Returns:
            (loss sum, term count), two scalar tensors.
        """
        kind = self.config.kind
        if kind == "ar":
            x = self.model.with_bos(x1)
            return ar_loss(network(x, **self._labels(labels, label_dropout, generator)), x, reduction="sum"), \
                torch.tensor(x1.numel())  # one next-token term per clean token
        t = torch.rand(x1.shape[0], generator=generator, device=x1.device)
        noise = "mask" if kind == "mask-denoiser" else "uniform"
        x_t, z_t = corrupt(x1, t, self.schedule, noise, self.vocab_size, generator=generator)
        condition = self._labels(labels, label_dropout, generator)
        if kind == "planner":
            return planner_loss(network(x_t, **condition), z_t, reduction="sum"), torch.tensor(z_t.numel())
        if kind == "uniform":
            return uniform_model_loss(network(x_t, t, **condition), x1, reduction="sum"), torch.tensor(x1.numel())
        return denoiser_loss(network(x_t, t, **condition), x1, z_t, reduction="sum"), z_t.sum()

    def _labels(self, labels: Optional[Tensor], dropout: float, generator: torch.Generator) -> dict:
        """{"labels": ...} for a network call ({} without labels), dropped to the null label
        (num_classes) with probability `dropout`: the unconditional model of classifier-free
        guidance is the same network."""
        if labels is None:
            return {}
        if dropout > 0:
            drop = torch.rand(labels.shape[0], generator=generator, device=labels.device) < dropout
            labels = torch.where(drop, torch.full_like(labels, self.config.num_classes), labels)
        return {"labels": labels}

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    # ---- evaluation ----------------------------------------------------------------

    @property
    def exported(self) -> torch.nn.Module:
        """The weights a checkpoint exports for sampling: the EMA when enabled.

        Returns:
            The network (or its EMA copy).
        """
        return self.ema if self.ema is not None else self.model

    @torch.no_grad()
    def evaluate(self) -> Optional[float]:
        """Mean loss of the exported weights over the fixed validation batches, with
        fixed corruption noise, so successive values are comparable. Leaves every
        training random stream untouched.

        Returns:
            The validation loss, or None when the batches hold no term (a denoiser's
            validation noise corrupted no position): no loss, not 0.
        """
        model = self.exported
        was_training = model.training
        model.eval()
        loss_sum, count = 0.0, 0.0
        for index in range(self.dist.rank, len(self.eval_set), self.dist.world_size):
            # one noise stream per batch: the same value whatever the number of processes
            generator = torch.Generator(self.device).manual_seed(stream_seed(self.config.seed, index, "eval"))
            batch, labels = self._to_device(self.eval_set[index])
            with self._autocast():  # the conditional loss: no label dropout
                total, terms = self.objective(model, batch, generator, labels)
            loss_sum, count = loss_sum + total.item(), count + float(terms)
        model.train(was_training)
        loss_sum, count = self.dist.sum([loss_sum, count])
        return loss_sum / count if count > 0 else None

    def _diverged(self, what: str) -> None:
        """FloatingPointError: the run diverged; says what of it is kept."""
        kept = "no checkpoint was written" if self._saved_step is None else \
            f"the last checkpoint, of step {self._saved_step}, is intact"
        raise FloatingPointError(f"{what}; lower the learning rate ({kept})")

    def _record(self, train_loss: Optional[float]) -> None:
        val_loss = self.evaluate()
        if val_loss is not None and not math.isfinite(val_loss):  # finite weights, overflowing logits
            self._diverged(f"validation loss is {val_loss} at step {self.step}")
        entry = {"step": self.step, "train_loss": train_loss, "val_loss": val_loss,
                 "tokens_per_s": round(self.tokens_per_second)}
        self.history.append(entry)
        train, val = ("     -" if loss is None else f"{loss:.4f}" for loss in (train_loss, val_loss))
        self.log(f"step {entry['step']:>7d}  train loss {train}  {self.val_loss_label} {val}  "
                 f"{entry['tokens_per_s']:,} tok/s")

    @property
    def val_loss_label(self) -> str:
        """The validation loss's name in the log: the exported weights' (the EMA's under EMA,
        while the training loss is the raw weights').

        Returns:
            "val loss", or "val loss (EMA)".
        """
        return "val loss" if self.ema is None else "val loss (EMA)"

    def log(self, message: str) -> None:
        """`message` to the log callback given (which clears a progress bar it draws over:
        the tools' Stdout), else above the progress bar.

        Args:
            message: one line.
        """
        if not self.dist.is_main:
            return
        if self._log is not None:
            self._log(message)
        elif self.progress:
            from tqdm import tqdm

            tqdm.write(message)

    def _warn(self, message: str) -> None:
        """`message` as a "warning: " log line where log lines are shown, else as a Python
        warning: a run with neither callback nor progress bar is silent, not its warnings."""
        if self._log is not None or self.progress:
            self.log(f"warning: {message}")
        elif self.dist.is_main:
            warnings.warn(message, UserWarning, stacklevel=caller_level())

    def _progress_bar(self, stop_at: int):
        if not (self.progress and self.dist.is_main):
            return None
        from tqdm import tqdm

        # disable=None: shown on a terminal only, never written into a redirected log
        return tqdm(total=stop_at, initial=self.step, desc=f"train {self.config.kind}", unit="step",
                    dynamic_ncols=True, disable=None)

    # ---- checkpoints ---------------------------------------------------------------

    def checkpoint_config(self) -> dict:
        """The config.json of this run's checkpoints: model, tokenizer, schedule and settings.

        Returns:
            The config dict.
        """
        config = {"kind": self.config.kind, "model": self.model_config.to_dict(),
                  "tokenizer": self.tokenizer.to_config(), "schedule": self.config.schedule,
                  "vocab_size": self.vocab_size, "step": self.step, "ema": self.config.ema or None,
                  "training": self.config.to_dict(), "corpus": self.corpus}
        if self.config.kind == "mask-denoiser":
            config["mask_id"] = self.vocab_size
        return config

    def save(self) -> None:
        """Checkpoint to config.out (rank 0 writes; every rank contributes its RNG
        and data states). Weights that are no longer finite are never saved over the last
        good checkpoint: a step with a finite loss can still end in NaN weights (an update
        from a NaN moment of the optimizer)."""
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            self._diverged(f"the weights are not finite after step {self.step}")
        per_rank = self.dist.all_gather(self._rank_state())
        with signals_held():  # saved and known to be, or neither: the stop message names it
            if self.dist.is_main:
                save_checkpoint(self.config.out, self.exported, self.checkpoint_config(), self._train_state(per_rank))
            self._saved_step = self.step
        self.dist.barrier()

    def _train_state(self, per_rank: list[dict[str, Tensor]]) -> tuple[dict[str, Tensor], dict]:
        """(tensors, meta) of a checkpoint's training state: every rank's RNG and data states, the
        AdamW moments, the raw weights under EMA, and the loop's counters and history."""
        tensors: dict[str, Tensor] = {}
        for rank, state in enumerate(per_rank):
            tensors.update({f"rank{rank}.{name}": value for name, value in state.items()})
        optimizer = self.optimizer.state_dict()
        for index, state in optimizer["state"].items():
            tensors.update({f"optim.{index}.{key}": value for key, value in state.items()})
        if self.ema is not None:  # model.safetensors holds the EMA; the raw weights go here
            tensors.update({f"model.{name}": p.detach().clone() for name, p in self.model.state_dict().items()})
        meta = {"step": self.step, "world_size": self.dist.world_size, "history": self.history,
                "train_seconds": self.train_seconds, "train_tokens": self.train_tokens,
                "pending_losses": list(self._losses), "pending_terms": list(self._terms),
                "optimizer_param_groups": optimizer["param_groups"]}
        return tensors, meta

    def _rank_state(self) -> dict[str, Tensor]:
        state = {"rng.torch": torch.get_rng_state(), "rng.noise": self.noise.get_state(),
                 "data.generator": self.train_batches.generator.get_state(),
                 "data.batches": torch.tensor(self.train_batches.batches)}
        if self.device.type == "cuda":
            state["rng.cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def _expected_state(self, meta: dict) -> dict[str, Optional[tuple]]:
        """The tensors a training state of this run must hold (name -> shape or None)."""
        expected: dict[str, Optional[tuple]] = {}
        for rank in range(self.dist.world_size):
            names = ["rng.torch", "rng.noise", "data.generator", "data.batches"]
            names += ["rng.cuda"] if self.device.type == "cuda" else []
            expected.update({f"rank{rank}.{name}": None for name in names})
        if self.ema is not None:
            expected.update({f"model.{name}": tuple(t.shape) for name, t in self.model.state_dict().items()})
        if meta.get("step"):  # AdamW has moments once a step was taken
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            for index, p in enumerate(params):
                expected.update({f"optim.{index}.exp_avg": tuple(p.shape), f"optim.{index}.exp_avg_sq": tuple(p.shape),
                                 f"optim.{index}.step": None})
        return expected

    def _restore(self, stored) -> None:
        out = self.config.out
        tensors, meta = stored.train_state
        trained_on = "cuda" if any(name.endswith(".rng.cuda") for name in tensors) else "cpu"
        if trained_on != self.device.type:  # a CUDA generator's state does not load into a CPU one
            raise ValueError(f"cannot resume {out} on {self.device.type}: the run trained on {trained_on}, where "
                             f"its random generators' states resume (device={trained_on!r})")
        check_state_tensors(out, tensors, self._expected_state(meta))
        try:
            self.exported.load_state_dict(stored.model.state_dict())
            if self.ema is not None:
                prefix = "model."
                self.model.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
            optimizer_state: dict[int, dict[str, Tensor]] = {}
            for name, value in tensors.items():
                if name.startswith("optim."):
                    _, index, key = name.split(".", 2)
                    optimizer_state.setdefault(int(index), {})[key] = value
            fresh = [_settled(group) for group in self.optimizer.param_groups]
            self.optimizer.load_state_dict({"state": optimizer_state,
                                            "param_groups": meta["optimizer_param_groups"]})
            # whoever edits the state can recompute config.json's digests: settings this run fixes must be its own
            # (betas of "x" failed at the first step with "not enough values to unpack")
            for index, (group, own) in enumerate(zip(self.optimizer.param_groups, fresh)):
                if _settled(group) != own:
                    raise ValueError(f"train_state.json's optimizer group {index} has {_settled(group)}, "
                                     f"this run {own}")
            prefix = f"rank{self.dist.rank}."
            torch.set_rng_state(tensors[prefix + "rng.torch"])
            self.noise.set_state(tensors[prefix + "rng.noise"])
            if self.device.type == "cuda":
                torch.cuda.set_rng_state(tensors[prefix + "rng.cuda"], self.device)
            self.train_batches.load_state_dict({"generator": tensors[prefix + "data.generator"],
                                                "batches": int(tensors[prefix + "data.batches"])})
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CheckpointError(f"checkpoint {out}: the training state does not fit this run: {reason}") from None
        self.step = meta["step"]
        self._saved_step = self.step
        self.history = meta["history"]
        # the clock of max_time goes on where it stopped
        self.train_seconds, self.train_tokens = meta.get("train_seconds", 0.0), meta.get("train_tokens", 0)
        self._losses = list(meta.get("pending_losses", []))
        self._terms = list(meta.get("pending_terms", [None] * len(self._losses)))

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close(wait=exc[0] is None)

    def close(self, wait: bool = True) -> None:
        """Release the process group and the output lock. The DDP wrapper goes first: its
        reducer holds the process group, which must not outlive this call (destroyed at
        interpreter exit instead, gloo's threads abort the process). wait=False (after a
        failure) skips the final barrier the other processes may never reach.

        Args:
            wait: wait for the other processes at a final barrier.
        """
        if hasattr(self, "model"):
            self.network = self.model
        try:
            self.dist.close(wait)
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
