"""Checkpoints: safetensors weights + a JSON config, written atomically.

A checkpoint is a directory holding
- `model.safetensors`: the network's weights (never a pickle; loading cannot run code),
- `config.json`: {"kind": one of KINDS, "model": TransformerConfig fields,
  "tokenizer": {...}, "schedule": "linear", ..., "sha256": {file: digest}},
- optionally `train_state.safetensors` + `train_state.json`: what a training run
  needs to resume exactly (optimizer moments, EMA weights, RNG and data-sampler
  states as tensors; step counters and settings as JSON).

Every save builds the directory under a temporary name next to the destination and
then swaps it in with a rename, so a crash mid-write leaves the previous checkpoint
untouched. The sha256 digests in config.json catch files damaged after writing.

A sampling bundle is a directory with `planner/` and `denoiser/` checkpoints.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from typing import Dict, Iterator, Optional, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model as _load_weights, save_file, save_model as _save_weights

KINDS = ("planner", "mask-denoiser", "uniform-denoiser", "uniform", "ar")
PLANNER_KINDS = ("planner", "uniform")
DENOISER_KINDS = ("mask-denoiser", "uniform-denoiser", "uniform")
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
STATE_TENSORS = "train_state.safetensors"
STATE_META = "train_state.json"

TrainState = Tuple[Dict[str, torch.Tensor], dict]


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete, corrupt or inconsistent."""


def save_checkpoint(path: str, model: torch.nn.Module, config: dict,
                    train_state: Optional[TrainState] = None) -> None:
    """Write `model` and `config` (and a resumable `train_state` = (tensors, meta))
    as the checkpoint directory `path`, replacing any checkpoint already there."""
    _check_config(config, "save_checkpoint: config")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"save_checkpoint: model must be a torch.nn.Module, got {type(model).__name__}")
    model_config = getattr(model, "config", None)
    if hasattr(model_config, "to_dict") and model_config.to_dict() != config["model"]:
        raise ValueError(f"save_checkpoint: config['model'] must describe the model, got {config['model']} "
                         f"for a model with {model_config.to_dict()}")
    meta = _check_train_state(train_state)
    with _atomic_directory(path) as tmp:
        _write_checkpoint(tmp, model, config, train_state, meta)


def _write_checkpoint(directory: str, model: torch.nn.Module, config: dict,
                      train_state: Optional[TrainState], meta: Optional[str]) -> None:
    _save_weights(model, os.path.join(directory, WEIGHTS))
    digests = {WEIGHTS: _sha256(os.path.join(directory, WEIGHTS))}
    if train_state is not None:
        tensors = {name: t.detach().cpu().contiguous() for name, t in train_state[0].items()}
        save_file(tensors, os.path.join(directory, STATE_TENSORS))
        _write_text(os.path.join(directory, STATE_META), meta)
        digests[STATE_TENSORS] = _sha256(os.path.join(directory, STATE_TENSORS))
        digests[STATE_META] = _sha256(os.path.join(directory, STATE_META))
    _write_text(os.path.join(directory, CONFIG), json.dumps({**config, "sha256": digests}, indent=2))


def load_model(path: str, device: str = "cpu") -> Tuple[torch.nn.Module, dict]:
    """(model in eval mode on `device`, config dict) from a checkpoint directory."""
    from ddpd.models import build_model
    from ddpd.models.config import TransformerConfig

    config = read_config(path)
    try:
        model = build_model(config["kind"], TransformerConfig.from_dict(config["model"]))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path}: config.json does not describe a valid model: {err}") from None
    weights = os.path.join(path, WEIGHTS)
    _verify(path, WEIGHTS, config)
    try:
        _load_weights(model, weights, strict=True)
    except (SafetensorError, RuntimeError, OSError) as err:
        raise CheckpointError(f"checkpoint {path}: {WEIGHTS} does not match config.json: {err}") from None
    return model.to(device).eval(), config


def read_config(path: str) -> dict:
    """The config.json of a checkpoint directory, validated."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint directory not found: {path}")
    config_path = os.path.join(path, CONFIG)
    if not os.path.isfile(config_path):
        raise CheckpointError(f"checkpoint {path}: missing {CONFIG} (not a ddpd checkpoint, or never completed)")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint {path}: {CONFIG} is not valid JSON: {err}") from None
    try:
        _check_config(config, f"checkpoint {path}: {CONFIG}")
    except (TypeError, ValueError) as err:
        raise CheckpointError(str(err)) from None
    return config


def has_train_state(path: str) -> bool:
    return os.path.isfile(os.path.join(path, STATE_META))


def load_train_state(path: str) -> TrainState:
    """(tensors, meta) saved with `save_checkpoint(..., train_state=...)`."""
    config = read_config(path)
    if not has_train_state(path):
        raise CheckpointError(f"checkpoint {path}: no training state to resume from ({STATE_META} missing)")
    for name in (STATE_TENSORS, STATE_META):
        _verify(path, name, config)
    try:
        tensors = load_file(os.path.join(path, STATE_TENSORS))
        with open(os.path.join(path, STATE_META), encoding="utf-8") as f:
            meta = json.load(f)
    except (SafetensorError, OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {path}: training state is unreadable: {err}") from None
    return tensors, meta


def save_bundle(path: str, planner: torch.nn.Module, planner_config: dict,
                denoiser: torch.nn.Module, denoiser_config: dict) -> None:
    """Write a sampling bundle: `path/planner` and `path/denoiser` checkpoints,
    swapped in together."""
    _check_bundle_kind("planner", planner_config, PLANNER_KINDS)
    _check_bundle_kind("denoiser", denoiser_config, DENOISER_KINDS)
    with _atomic_directory(path) as tmp:
        for name, model, config in (("planner", planner, planner_config), ("denoiser", denoiser, denoiser_config)):
            os.mkdir(os.path.join(tmp, name))
            _write_checkpoint(os.path.join(tmp, name), model, config, None, None)


def load_bundle(path: str, device: str = "cpu") -> Tuple[torch.nn.Module, torch.nn.Module, Dict[str, dict]]:
    """(planner, denoiser, {"planner": config, "denoiser": config}) from a bundle."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        raise CheckpointError(f"bundle directory not found: {path}")
    planner, planner_config = load_model(os.path.join(path, "planner"), device)
    denoiser, denoiser_config = load_model(os.path.join(path, "denoiser"), device)
    try:
        _check_bundle_kind("planner", planner_config, PLANNER_KINDS)
        _check_bundle_kind("denoiser", denoiser_config, DENOISER_KINDS)
    except ValueError as err:
        raise CheckpointError(f"bundle {path}: {err}") from None
    return planner, denoiser, {"planner": planner_config, "denoiser": denoiser_config}


def ensure_replaceable(path: str) -> None:
    """Raise CheckpointError unless `path` is absent, an empty directory or a ddpd
    checkpoint/bundle: a mistyped destination must never delete unrelated files."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint path exists and is not a directory: {path}")
    entries = os.listdir(path)
    is_checkpoint = CONFIG in entries
    is_bundle = all(os.path.isfile(os.path.join(path, role, CONFIG)) for role in ("planner", "denoiser"))
    if entries and not (is_checkpoint or is_bundle):
        raise CheckpointError(f"refusing to replace {path}: it is neither empty nor a ddpd checkpoint")


def _check_bundle_kind(role: str, config: dict, allowed: Tuple[str, ...]) -> None:
    _check_config(config, f"{role} config")
    if config["kind"] not in allowed:
        raise ValueError(f"{role} config: kind must be one of {allowed}, got {config['kind']!r}")


def _check_config(config, what: str) -> None:
    if not isinstance(config, dict):
        raise TypeError(f"{what} must be a dict, got {type(config).__name__}")
    if config.get("kind") not in KINDS:
        raise ValueError(f"{what}: 'kind' must be one of {KINDS}, got {config.get('kind')!r}")
    if not isinstance(config.get("model"), dict):
        raise ValueError(f"{what}: 'model' must be a dict of TransformerConfig fields, got {config.get('model')!r}")


def _check_train_state(train_state: Optional[TrainState]) -> Optional[str]:
    """The JSON text of the train-state meta, checked before anything is written."""
    if train_state is None:
        return None
    if (not isinstance(train_state, tuple) or len(train_state) != 2 or not isinstance(train_state[0], dict)
            or not isinstance(train_state[1], dict)):
        raise TypeError("save_checkpoint: train_state must be a (dict of tensors, dict) pair, "
                        f"got {type(train_state).__name__}")
    for name, tensor in train_state[0].items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"save_checkpoint: train_state tensor {name!r} must be a torch.Tensor, "
                            f"got {type(tensor).__name__}")
    try:
        return json.dumps(train_state[1], indent=1, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"save_checkpoint: train_state meta must be JSON-serialisable: {err}") from None


def _verify(path: str, name: str, config: dict) -> None:
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint {path}: missing {name}")
    expected = config.get("sha256", {}).get(name)
    if expected is not None and _sha256(file) != expected:
        raise CheckpointError(f"checkpoint {path}: {name} is corrupt (sha256 differs from config.json)")


def _sha256(file: str) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_text(file: str, text: str) -> None:
    with open(file, "w", encoding="utf-8") as f:
        f.write(text)


@contextmanager
def _atomic_directory(path: str) -> Iterator[str]:
    """Yield a fresh temporary directory beside `path`; on success make it `path`
    (replacing an existing checkpoint), on any failure delete it."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.path.abspath(os.fspath(path))
    ensure_replaceable(path)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        yield tmp
        _publish_permissions(tmp)
        _sync_tree(tmp)
        _replace_directory(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_directory(parent)


def _replace_directory(new: str, path: str) -> None:
    if not os.path.exists(path):
        os.rename(new, path)
        return
    if _exchange(new, path):  # one atomic step: `path` is never absent
        shutil.rmtree(new)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=os.path.dirname(path))
    os.rmdir(old)
    os.rename(path, old)
    os.rename(new, path)
    shutil.rmtree(old)


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths with Linux renameat2(RENAME_EXCHANGE); False where
    the platform or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _publish_permissions(directory: str) -> None:
    """Ordinary permissions (subject to the umask) instead of the private ones that
    temporary directories and files are created with."""
    umask = os.umask(0)
    os.umask(umask)
    for root, dirs, files in os.walk(directory):
        os.chmod(root, 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~umask)


def _sync_tree(directory: str) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_directory(root)


def _fsync_directory(directory: str) -> None:
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
