"""Checkpoints: safetensors weights + a JSON config, written atomically, read verified.

A checkpoint is a directory holding `model.safetensors` (never a pickle), `config.json`
(kind, model config, tokenizer, schedule, the sha256 of every file) and optionally the
training state (`train_state.safetensors` + `train_state.json`). A sampling bundle is a
directory with `planner/` and `denoiser/` checkpoints.

Every save builds the directory under a temporary name and swaps it in with one rename
(ddpd.files.atomic_directory). Every load reads all files through one descriptor of the
directory, checks the safetensors header against config.json before hashing or
allocating, and loads the bytes it checked against their sha256: hostile or damaged
files are refused in one line. docs/reliability.md ("Checkpoints") has the details."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
from typing import NamedTuple, Optional, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors, save as save_safetensors

from ddpd._interrupts import signals_held
from ddpd.files import atomic_directory, refuse_working_directory
from ddpd.validation import check_device

KINDS = ("planner", "mask-denoiser", "uniform-denoiser", "uniform", "ar")
PLANNER_KINDS = ("planner", "uniform")
DENOISER_KINDS = ("mask-denoiser", "uniform-denoiser", "uniform")
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
SETTINGS_DIGEST = "settings_sha256"  # config.json's digest of its own settings (resume_settings)
STATE_TENSORS = "train_state.safetensors"
STATE_META = "train_state.json"
# Bounds on what a reader accepts before looking further (a config is a few KB, a
# header a few KB per layer).
MAX_CONFIG_BYTES = 1 << 20
MAX_STATE_META_BYTES = 64 << 20
MAX_HEADER_BYTES = 8 << 20
MAX_BUFFER_BYTES = 1 << 30  # non-persistent buffers (rotary tables) a config may ask for
WEIGHT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
STATE_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_ATTEMPTS = 20  # reads restarted because a writer replaced the directory while it was opened

TrainState = tuple[dict[str, torch.Tensor], dict]


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete, corrupt or inconsistent."""


class Checkpoint(NamedTuple):
    model: torch.nn.Module
    config: dict
    train_state: Optional[TrainState]


# ---------------------------------------------------------------- writing


def save_checkpoint(path: str, model: torch.nn.Module, config: dict,
                    train_state: Optional[TrainState] = None) -> None:
    """Write `model` and `config` (and a resumable `train_state` = (tensors, meta))
    as the checkpoint directory `path`, replacing any checkpoint already there (other
    files a user keeps in that directory stay).

    Args:
        path: the checkpoint directory.
        model: the network whose state_dict is saved.
        config: the JSON config ("kind", "model", "tokenizer", ...), checked against `model`.
        train_state: (tensors, meta) for an exact resume, or None.

    Raises:
        CheckpointError: `path` holds something a save must not replace, the config does not
            fit the model, or the weights are what a load refuses (not float32, float16 or
            bfloat16, NaN or infinite) or have no values (on the meta device).
        ValueError: the config is not JSON-serialisable.
        ddpd.files.OutputError: the directory cannot be written (a full disk, permissions).
    """
    _check_config(config, "save_checkpoint: config")
    _check_model(model, config, "save_checkpoint")
    files = _checkpoint_files(model, config, train_state, path, "save_checkpoint")
    ensure_replaceable(path, "checkpoint")
    with atomic_directory(path) as tmp:
        _write_files(tmp, files)
        _keep_other_entries(path, tmp, CHECKPOINT_ENTRIES)


def _checkpoint_files(model: torch.nn.Module, config: dict, train_state: Optional[TrainState],
                      path: str, what: str) -> dict[str, bytes]:
    """The bytes of every file of the checkpoint `path`, config.json (with the digests) last."""
    meta = _check_train_state(train_state)
    state = model.state_dict()
    empty = [key for key, t in state.items() if t.is_meta]
    if empty:  # a skeleton (ddpd.models.factory.build_skeleton): shapes without values
        raise CheckpointError(f"{what}: the model's {empty[0]} is on the meta device and holds no values; "
                              "load or initialise the weights before saving")
    files = {WEIGHTS: _serialize(state)}
    _check_saved_weights(path, what, config, state, files[WEIGHTS])
    if train_state is not None:
        files[STATE_TENSORS] = _serialize(train_state[0])
        files[STATE_META] = meta.encode("utf-8")
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    config = {**config, SETTINGS_DIGEST: settings_digest(config)}
    files[CONFIG] = json.dumps({**config, "sha256": digests}, indent=2).encode("utf-8")
    return files


def settings_digest(config: dict) -> str:
    """The sha256 of a config's settings: every field but the files' digests and this one,
    as JSON reads them back (tuples as lists), with sorted keys and no spaces.

    Args:
        config: a checkpoint config.

    Returns:
        The hex sha256.

    Raises:
        ValueError: the config is not JSON-serialisable.
    """
    fields = {key: value for key, value in config.items() if key not in ("sha256", SETTINGS_DIGEST)}
    try:
        canonical = json.dumps(json.loads(json.dumps(fields)), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint config must be JSON-serialisable: {err}") from None
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _serialize(tensors: dict[str, torch.Tensor]) -> bytes:
    # clone: safetensors refuses tensors that share memory (tied or sliced weights)
    return save_safetensors({name: t.detach().cpu().clone().contiguous() for name, t in tensors.items()})


def _write_files(directory: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        _write_file(os.path.join(directory, name), data)


def _write_file(file: str, data: bytes) -> None:
    with open(file, "wb") as f:
        f.write(data)


def save_bundle(path: str, planner: torch.nn.Module, planner_config: dict,
                denoiser: torch.nn.Module, denoiser_config: dict,
                uniform: Optional[tuple[torch.nn.Module, dict]] = None) -> None:
    """Write a sampling bundle: `path/planner` and `path/denoiser` checkpoints, and
    `path/uniform` when a single uniform model is given, swapped in together (other
    entries a user keeps in `path` stay; a uniform/ of the bundle replaced goes).

    Args:
        path: the bundle directory.
        planner: the planner network.
        planner_config: its checkpoint config.
        denoiser: the denoiser network.
        denoiser_config: its checkpoint config.
        uniform: (model, config) of a single uniform model (kind "uniform") to ship beside
            the pair, or None.

    Raises:
        CheckpointError: `path` holds something a save must not replace, a config does not
            fit its model, or weights are what a load refuses (as in save_checkpoint).
        ValueError: the networks differ in vocabulary or tokenizer, or `uniform` is no
            uniform model.
        TypeError: `uniform` is not a (model, config) pair.
        ddpd.files.OutputError: the directory cannot be written.
    """
    _check_path(path)
    networks = {"planner": (planner, planner_config, PLANNER_KINDS),
                "denoiser": (denoiser, denoiser_config, DENOISER_KINDS)}
    if uniform is not None:
        if not isinstance(uniform, tuple) or len(uniform) != 2:
            raise TypeError(f"save_bundle: uniform must be a (model, config) pair, got {type(uniform).__name__}")
        networks[UNIFORM_ROLE] = (*uniform, ("uniform",))
    for role, (model, config, kinds) in networks.items():
        _check_bundle_kind(role, config, kinds)
        _check_model(model, config, f"save_bundle: {role}")
    for role in list(networks)[1:]:
        _check_bundle_agrees(planner_config, networks[role][1], role)
    files = {role: _checkpoint_files(model, config, None, os.path.join(path, role), f"save_bundle: {role}")
             for role, (model, config, _) in networks.items()}
    ensure_replaceable(path, "bundle")
    with atomic_directory(path) as tmp:
        for role, role_files in files.items():
            os.mkdir(os.path.join(tmp, role))
            _write_files(os.path.join(tmp, role), role_files)
        _keep_other_entries(path, tmp, BUNDLE_ENTRIES)


def ensure_replaceable(path: str, kind: str = "checkpoint") -> None:
    """Raise CheckpointError unless `path` is absent, an empty directory or a ddpd `kind`
    ("checkpoint" or "bundle") that a save may replace: a mistyped destination must never
    delete unrelated files, nor a bundle a training checkpoint (or the other way round),
    nor a bundle the training checkpoints in its planner/ and denoiser/ (ddpd-train's
    --out R/planner and --out R/denoiser), whose training state a bundle does not keep.
    A checkpoint is a directory whose config.json parses as one a ddpd save wrote (a ddpd
    kind and the sha256 of the files), not any directory holding a config.json.
    The path is checked as the save will write it (relative to the working directory; an
    empty path is refused, not read as the working directory).

    Args:
        path: the destination of a save.
        kind: "checkpoint" or "bundle".

    Raises:
        TypeError: `path` is not a str or os.PathLike.
        CheckpointError: `path` may not be replaced.
        ddpd.files.OutputError: `path` is the working directory or holds it.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.fspath(path):
        raise CheckpointError("checkpoint path is empty")
    refuse_working_directory(path)
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint path exists and is not a directory: {path}")
    if not os.listdir(path):
        return
    found = "checkpoint" if _is_checkpoint(path) else "bundle" if _is_bundle(path) else None
    if found is None:
        reason = (f"not a ddpd checkpoint (its {CONFIG} records no ddpd kind and sha256)"
                  if os.path.lexists(os.path.join(path, CONFIG)) else "it is neither empty nor a ddpd checkpoint")
        raise CheckpointError(f"refusing to replace {path}: {reason}")
    if found != kind:
        raise CheckpointError(f"refusing to replace {path}: it holds a ddpd {found}, not a {kind}")
    training = [role for role in (*_ROLES, UNIFORM_ROLE)
                if found == "bundle" and has_train_state(os.path.join(path, role))]
    if training:
        raise CheckpointError(f"refusing to replace {path}: {os.path.join(path, training[0])} holds a training "
                              "checkpoint, not a bundle's weights-only copy")


def _is_checkpoint(path: str) -> bool:
    """Whether `path`'s config.json is one a ddpd save wrote (a kind of KINDS, the files'
    sha256): other models' directories (a Hugging Face model's) hold a config.json too."""
    file = os.path.join(path, CONFIG)
    try:
        if not os.path.isfile(file) or os.path.getsize(file) > MAX_CONFIG_BYTES:  # isfile: never open a FIFO
            return False
        with open(file, "rb") as f:
            config = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and config.get("kind") in KINDS and isinstance(config.get("sha256"), dict)


_ROLES = ("planner", "denoiser")  # a bundle's checkpoints, in the order errors name them
UNIFORM_ROLE = "uniform"  # a bundle's optional single uniform model


def _is_bundle(path: str) -> bool:
    return all(_is_checkpoint(os.path.join(path, role)) for role in _ROLES)


# What a save writes into a checkpoint or bundle directory; anything else there is a user's.
CHECKPOINT_ENTRIES = frozenset({CONFIG, WEIGHTS, STATE_TENSORS, STATE_META})
BUNDLE_ENTRIES = frozenset({*_ROLES, UNIFORM_ROLE})


def _keep_other_entries(old: str, new: str, ours: frozenset) -> None:
    """Entries of the directory being replaced that a save does not write (a user's notes,
    logs, samples) into its new version, as hard links (copies where the file system refuses
    one): a save replaces the checkpoint, not what is kept beside it."""
    if not os.path.isdir(old):
        return
    for name in os.listdir(old):
        if name in ours:
            continue
        src, dst = os.path.join(old, name), os.path.join(new, name)
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)


def _link_or_copy(src: str, dst: str) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# ---------------------------------------------------------------- reading


def load_model(path: str, device: Union[str, torch.device] = "cpu") -> tuple[torch.nn.Module, dict]:
    """(model in eval mode on `device`, config dict) from a checkpoint directory.

    Args:
        path: the checkpoint directory.
        device: where to put the model: "auto", "cpu", "cuda", "cuda:N" or a torch.device.

    Returns:
        (model, config).

    Raises:
        TypeError: `path` is not a str or os.PathLike, or `device` not a str or torch.device.
        ValueError: an unknown `device`, or CUDA where there is none (before anything is read).
        CheckpointError: the checkpoint is missing, damaged or does not verify.

    Example:
        >>> denoiser, config = load_model("runs/mask-denoiser")
    """
    checkpoint = load_checkpoint(path, device)
    return checkpoint.model, checkpoint.config


def load_checkpoint(path: str, device: Union[str, torch.device] = "cpu", train_state: bool = False) -> Checkpoint:
    """The model (eval mode, on `device`), config and, with train_state=True, the
    training state (tensors, meta), all from the same save, each file verified.

    Args:
        path: the checkpoint directory.
        device: where to put the model: "auto", "cpu", "cuda", "cuda:N" or a torch.device.
        train_state: also load the training state.

    Returns:
        A Checkpoint (model, config, train_state or None).

    Raises:
        TypeError: `path` is not a str or os.PathLike, or `device` not a str or torch.device.
        ValueError: an unknown `device`, or CUDA where there is none (before anything is read).
        CheckpointError: the checkpoint is missing, damaged or does not verify.
    """
    _check_path(path)
    device = check_device("device", device)
    return _consistent(path, lambda reader: _load_from(reader, device, train_state))


def read_config(path: str) -> dict:
    """The config.json of a checkpoint directory, validated.

    Args:
        path: the checkpoint directory.

    Returns:
        The config dict.

    Raises:
        CheckpointError: config.json is missing, damaged or invalid.
    """
    _check_path(path)
    return _consistent(path, _config_from)


def resume_settings(path, config: dict) -> dict:
    """training_settings of a checkpoint a run resumes from, which takes its settings from
    them: CheckpointError unless config.json's settings match the digest recorded with them
    (a one-bit change of seq_len or lr, or a corpus fingerprint set to null, was resumed).

    Args:
        path: the checkpoint directory (for messages).
        config: its config dict.

    Returns:
        The training settings.

    Raises:
        TypeError: config is not a dict (read_config's).
        CheckpointError: no settings digest, or settings that differ from it.
    """
    if not isinstance(config, dict):  # None raised AttributeError: 'NoneType' object has no attribute 'get'
        raise TypeError(f"resume_settings: config must be the checkpoint's config dict (read_config), "
                        f"got {type(config).__name__}")
    if config.get(SETTINGS_DIGEST) is None:
        raise CheckpointError(f"checkpoint {path}: config.json records no {SETTINGS_DIGEST}, so the settings a "
                              "resume takes from it cannot be verified (written by an older ddpd?)")
    _check_settings_digest(path, config, "; a resume would not continue the same run")
    return training_settings(path, config)


def _check_settings_digest(path, config: dict, consequence: str = "") -> None:
    if config[SETTINGS_DIGEST] != settings_digest(config):
        raise CheckpointError(f"checkpoint {path}: config.json's settings differ from their {SETTINGS_DIGEST} "
                              f"(edited or corrupt){consequence}")


def _check_settings(path, config: dict, model_config) -> None:
    """CheckpointError unless config.json's settings are those saved: an edited n_heads fits
    the same weights and computes another attention. A config without a digest (older
    saves, the shipped bundle) must still have the shape its training section records."""
    if config.get(SETTINGS_DIGEST) is not None:
        _check_settings_digest(path, config)
        return
    trained = training_settings(path, config)
    for name in ("d_model", "n_layers", "n_heads"):
        if name in trained and trained[name] != getattr(model_config, name):
            raise CheckpointError(f"checkpoint {path}: config.json's model has {name} {getattr(model_config, name)}, "
                                  f"its training section {trained[name]} (edited or corrupt)")


def training_settings(path, config: dict) -> dict:
    """config.json's "training" section, ddpd-train's settings ({} where it is absent or null).
    config.json carries no digest: a section that is not an object is a CheckpointError.

    Args:
        path: the checkpoint directory (for messages).
        config: its config dict.

    Returns:
        The training settings, {} where absent.

    Raises:
        CheckpointError: the section is not a JSON object.
    """
    training = config.get("training")
    if training is None:
        return {}
    if not isinstance(training, dict):
        raise CheckpointError(f"checkpoint {path}: config.json's training is {training!r:.40}, not an object")
    return training


def has_train_state(path: str) -> bool:
    """Whether the checkpoint directory was saved with a training state to resume from.

    Args:
        path: the checkpoint directory.

    Returns:
        True when its train_state.json is there; whether the state is whole (its tensors
        file included) is load_train_state's check, which names what is missing.
    """
    return os.path.isfile(os.path.join(path, STATE_META))


def load_train_state(path: str) -> TrainState:
    """(tensors, meta) saved with `save_checkpoint(..., train_state=...)`.

    Args:
        path: the checkpoint directory.

    Returns:
        (tensors, meta).

    Raises:
        CheckpointError: the state is missing, damaged or does not verify.
    """
    _check_path(path)
    return _consistent(path, lambda reader: _state_from(reader, _config_from(reader)))


def load_bundle(path: str, device: Union[str, torch.device] = "cpu"
                ) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, dict]]:
    """(planner, denoiser, {"planner": config, "denoiser": config}) from a bundle,
    both from the same version of the bundle.

    Args:
        path: the bundle directory.
        device: where to put the models: "auto", "cpu", "cuda", "cuda:N" or a torch.device.

    Returns:
        (planner, denoiser, configs).

    Raises:
        TypeError: `path` is not a str or os.PathLike, or `device` not a str or torch.device.
        ValueError: an unknown `device`, or CUDA where there is none (before anything is read).
        CheckpointError: the bundle or one of its checkpoints is missing, damaged or does
            not verify.
    """
    _check_path(path)
    device = check_device("device", device)
    if not os.path.isdir(path):
        raise CheckpointError(f"bundle directory not found: {path}")

    def load(reader: _Reader):
        readers = {role: reader.sub(role) for role in ("planner", "denoiser")}  # both opened at once
        loaded = {role: _load_from(readers[role], device, False) for role in readers}
        try:
            _check_bundle_kind("planner", loaded["planner"].config, PLANNER_KINDS)
            _check_bundle_kind("denoiser", loaded["denoiser"].config, DENOISER_KINDS)
        except ValueError as err:
            raise CheckpointError(f"bundle {path}: {err}") from None
        return loaded

    loaded = _consistent(path, load)
    return (loaded["planner"].model, loaded["denoiser"].model,
            {role: checkpoint.config for role, checkpoint in loaded.items()})


def _check_path(path) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint path must be a str or os.PathLike, got {type(path).__name__}")


class _Replaced(Exception):
    """A file vanished because a writer replaced the directory being read."""


class _Reader:
    """The files of one directory read through one descriptor of it: they all belong
    to the version of the directory that was at `path` when it was opened. Every file
    of a checkpoint is opened at once (a writer deletes a replaced directory soon
    after; an open file stays readable), so verifying and parsing may take their time."""

    def __init__(self, path: str, fd: int, root: Optional[_Reader] = None):
        self.path, self.fd, self.root = os.fspath(path), fd, root or self
        self.owned = [fd]  # descriptors to close with the root
        self.files: dict[str, int] = {}
        try:
            self._open_files()
        except BaseException:  # a root that is never made closes only `fd`: close what was opened here
            for file in self.files.values():
                os.close(file)
                self.root.owned.remove(file)
            raise

    def _open_files(self) -> None:
        for name in (CONFIG, WEIGHTS, STATE_META, STATE_TENSORS):
            try:  # non-blocking: opening a FIFO put in a file's place would wait for a writer
                file = os.open(name, os.O_RDONLY | os.O_NONBLOCK, dir_fd=self.fd)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise CheckpointError(f"checkpoint {self.path}: cannot read {name}: {err.strerror}") from None
            mode = os.fstat(file).st_mode
            if not stat.S_ISREG(mode):
                os.close(file)
                what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
                raise CheckpointError(f"checkpoint {self.path}: {name} is {what}")
            self.files[name] = file
            self.root.owned.append(file)
        if len(self.files) < 4 and self.replaced():
            raise _Replaced()  # the files of a directory being deleted

    def replaced(self) -> bool:
        try:
            return os.stat(self.root.path).st_ino != os.fstat(self.root.fd).st_ino
        except FileNotFoundError:
            return True

    def open(self, name: str) -> int:
        if name not in self.files:
            raise CheckpointError(f"checkpoint {self.path}: missing {name}"
                                  + (" (not a ddpd checkpoint, or never completed)" if name == CONFIG else ""))
        return os.dup(self.files[name])

    def read(self, name: str, limit: int) -> bytes:
        fd = self.open(name)
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                raise CheckpointError(f"checkpoint {self.path}: {name} takes {size} bytes, more than the "
                                      f"{limit} such a file may")
            return _read_exactly(self.path, name, fd, 0, size)
        finally:
            os.close(fd)

    def sub(self, name: str) -> _Reader:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.fd)
        except (FileNotFoundError, NotADirectoryError):
            if self.replaced():
                raise _Replaced() from None
            raise CheckpointError(f"bundle {self.path}: missing the {name}/ checkpoint") from None
        self.root.owned.append(fd)
        return _Reader(os.path.join(self.path, name), fd, self.root)


def _consistent(path, read):
    """read(reader) on one descriptor of the directory `path`, restarted when a writer
    replaced the directory while its files were being opened. A signal meanwhile is raised
    when it is done (a handler's exception raised inside the C++ of an import aborted the
    process)."""
    with signals_held():
        return _read_consistently(os.fspath(path), read)


def _read_consistently(path: str, read):
    for _ in range(_ATTEMPTS):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint directory not found: {path}") from None
        except NotADirectoryError:
            raise CheckpointError(f"checkpoint path is not a directory: {path}") from None
        except OSError as err:
            raise CheckpointError(f"checkpoint {path}: cannot open it: {err.strerror}") from None
        root = None
        try:
            root = _Reader(path, fd)
            return read(root)
        except _Replaced:
            continue
        finally:
            for owned in (root.owned if root is not None else [fd]):
                os.close(owned)
    raise CheckpointError(f"checkpoint {path}: it was replaced {_ATTEMPTS} times while being opened; "
                          "is a writer saving it in a tight loop?")


def _read_exactly(path: str, name: str, fd: int, offset: int, size: int) -> bytes:
    data = bytearray(size)
    view, done = memoryview(data), 0
    try:
        while done < size:
            n = _pread_into(fd, view[done:], offset + done)
            if n == 0:
                raise CheckpointError(f"checkpoint {path}: {name} ended after {done} of {size} bytes "
                                      "(truncated while being read?)")
            done += n
    except OSError as err:
        raise CheckpointError(f"checkpoint {path}: cannot read {name}: {err.strerror}") from None
    return bytes(data)


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    if hasattr(os, "preadv"):
        return os.preadv(fd, [view], offset)
    chunk = os.pread(fd, min(len(view), 1 << 24), offset)
    view[:len(chunk)] = chunk
    return len(chunk)


def _parse_json(path: str, name: str, data: bytes):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"checkpoint {path}: {name} is not valid JSON: {reason}") from None


def _config_from(reader: _Reader) -> dict:
    config = _parse_json(reader.path, CONFIG, reader.read(CONFIG, MAX_CONFIG_BYTES))
    try:
        _check_config(config, f"checkpoint {reader.path}: {CONFIG}")
    except (TypeError, ValueError) as err:
        raise CheckpointError(str(err)) from None
    return config


def _digest(config: dict, name: str) -> Optional[str]:
    return config.get("sha256", {}).get(name)


def _verified(reader: _Reader, name: str, data: bytes, config: dict) -> bytes:
    expected = _digest(config, name)
    if expected is None:  # every save records one: without it a flipped bit would load silently
        raise CheckpointError(f"checkpoint {reader.path}: config.json records no sha256 for {name}, so it cannot "
                              "be verified (save_checkpoint records one; re-save the model with it)")
    if hashlib.sha256(data).hexdigest() != expected:
        raise CheckpointError(f"checkpoint {reader.path}: {name} is corrupt (sha256 differs from config.json)")
    return data


def _load_from(reader: _Reader, device, want_state: bool) -> Checkpoint:
    from ddpd.models import build_model

    config = _config_from(reader)
    model_config = _model_config(reader.path, config)
    tensors = _read_weights(reader, config, model_config)
    _check_settings(reader.path, config, model_config)  # after the weights, whose checks name what differs
    model = build_model(config["kind"], model_config)
    model.load_state_dict(tensors, strict=True)  # names and shapes were checked against the header
    state = _state_from(reader, config) if want_state else None
    return Checkpoint(model.to(device).eval(), config, state)


def _model_config(path: str, config: dict):
    from ddpd.models.config import TransformerConfig

    try:
        return TransformerConfig.from_dict(config["model"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path}: config.json does not describe a valid model: {err}") from None


def _counts(value) -> bool:
    """Whether a header field is a list of non-negative integers (JSON true is no count)."""
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def _read_header(reader: _Reader, name: str, fd: int) -> tuple[dict, int, int]:
    """(header, bytes before the data, file size) of a safetensors file, checked for
    form: a bounded length, JSON, and offsets that tile the data exactly."""
    size = os.fstat(fd).st_size
    where = f"checkpoint {reader.path}: {name}"
    if size < 8:
        raise CheckpointError(f"{where} is corrupt (only {size} bytes)")
    (length,) = struct.unpack("<Q", _read_exactly(reader.path, name, fd, 0, 8))
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise CheckpointError(f"{where} is corrupt (its header claims {length} bytes; the file has {size})")
    header = _parse_json(reader.path, f"the header of {name}", _read_exactly(reader.path, name, fd, 8, length))
    if not isinstance(header, dict):
        raise CheckpointError(f"{where} is corrupt (its header is not a JSON object)")
    header.pop("__metadata__", None)
    spans = []
    for key, entry in header.items():
        if (not isinstance(entry, dict) or not _counts(entry.get("shape")) or entry.get("dtype") not in STATE_DTYPES
                or not _counts(entry.get("data_offsets")) or len(entry["data_offsets"]) != 2):
            raise CheckpointError(f"{where} is corrupt (header entry {key!r} is malformed)")
        begin, end = entry["data_offsets"]
        numel = 1
        for d in entry["shape"]:
            numel *= d
        if end - begin != numel * STATE_DTYPES[entry["dtype"]]:
            raise CheckpointError(f"{where} is corrupt (tensor {key!r} has {end - begin} bytes for its shape "
                                  f"{entry['shape']})")
        spans.append((begin, end))
    spans.sort()
    position = 0
    for begin, end in spans:
        if begin != position:
            raise CheckpointError(f"{where} is corrupt (its tensors overlap or leave gaps)")
        position = end
    if 8 + length + position != size:
        raise CheckpointError(f"{where} is corrupt: its header describes {8 + length + position} bytes, "
                              f"the file has {size}")
    return header, 8 + length, size


def _read_weights(reader: _Reader, config: dict, model_config) -> dict[str, torch.Tensor]:
    fd = reader.open(WEIGHTS)
    try:
        header, _, size = _read_header(reader, WEIGHTS, fd)
        _check_against_config(reader.path, config, model_config, header)
        data = _verified(reader, WEIGHTS, _read_exactly(reader.path, WEIGHTS, fd, 0, size), config)
    finally:
        os.close(fd)
    try:
        tensors = load_safetensors(data)
    except SafetensorError as err:
        raise CheckpointError(f"checkpoint {reader.path}: {WEIGHTS} is corrupt: {err}") from None
    _check_finite(f"checkpoint {reader.path}: {WEIGHTS}", tensors)
    return tensors


def _check_saved_weights(path, what: str, config: dict, tensors: dict[str, torch.Tensor], data: bytes) -> None:
    """CheckpointError unless a load would accept the weights (their serialized `data`):
    a save must not replace the last good checkpoint with one that cannot be loaded."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    model_config = _model_config(path, config)
    _check_against_config(path, config, model_config, header, f"{what}: the model's weights do not match config")
    _check_finite(f"{what}: the model", tensors)


def _check_finite(where: str, tensors: dict[str, torch.Tensor]) -> None:
    bad = [key for key, t in tensors.items() if not bool(torch.isfinite(t).all())]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CheckpointError(f"{where} holds NaN or infinite weights in {bad[0]}{more}; the model cannot be used")


def _check_against_config(path: str, config: dict, model_config, header: dict, where: str = "") -> None:
    """The header must hold exactly the tensors of the network config.json describes,
    in floating types; checked on a network built on the meta device (no memory).
    `where` begins the messages of a mismatch."""
    from ddpd.models.factory import build_skeleton

    where = where or f"checkpoint {path}: {WEIGHTS} does not match config.json"
    if model_config.n_layers > len(header):  # every layer holds at least one tensor: no need to build
        raise CheckpointError(f"{where}: config.json has {model_config.n_layers} layers, the file "
                              f"{len(header)} tensors")
    try:
        network = build_skeleton(config["kind"], model_config)
    except (TypeError, ValueError, RuntimeError) as err:  # a config that does not fit its kind (a planner with
        # out_dim 5), or sizes whose tensors cannot exist even on the meta device (d_model 1e12)
        raise CheckpointError(f"checkpoint {path}: config.json does not describe a valid {config['kind']} model: "
                              f"{err}") from None
    expected = network.state_dict()
    buffers = sum(b.numel() * b.element_size() for b in network.buffers())
    if buffers > MAX_BUFFER_BYTES:
        raise CheckpointError(f"checkpoint {path}: config.json describes a network with {buffers} bytes of "
                              f"buffers (max_seq_len {model_config.max_seq_len}); refusing to build it")
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(set(header) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{where}: missing tensors {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                              f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
    for key, tensor in expected.items():
        entry = header[key]
        if list(tensor.shape) != entry["shape"]:
            raise CheckpointError(f"{where}: {key} has shape {entry['shape']} in the file, "
                                  f"{list(tensor.shape)} by config.json")
        if entry["dtype"] not in WEIGHT_DTYPES:
            raise CheckpointError(f"{where}: {key} is stored as {entry['dtype']}; weights are stored as "
                                  f"{', '.join(WEIGHT_DTYPES)}")


def _state_from(reader: _Reader, config: dict) -> TrainState:
    if STATE_META not in reader.files:
        raise CheckpointError(f"checkpoint {reader.path}: no training state to resume from ({STATE_META} missing)")
    meta = _parse_json(reader.path, STATE_META,
                       _verified(reader, STATE_META, reader.read(STATE_META, MAX_STATE_META_BYTES), config))
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {reader.path}: {STATE_META} must hold a JSON object, "
                              f"got {type(meta).__name__}")
    fd = reader.open(STATE_TENSORS)
    try:
        _, _, size = _read_header(reader, STATE_TENSORS, fd)
        data = _verified(reader, STATE_TENSORS, _read_exactly(reader.path, STATE_TENSORS, fd, 0, size), config)
    finally:
        os.close(fd)
    try:
        return load_safetensors(data), meta
    except SafetensorError as err:
        raise CheckpointError(f"checkpoint {reader.path}: {STATE_TENSORS} is corrupt: {err}") from None


# ---------------------------------------------------------------- checks


def _check_bundle_kind(role: str, config: dict, allowed: tuple[str, ...]) -> None:
    _check_config(config, f"{role} config")
    if config["kind"] not in allowed:
        raise ValueError(f"{role} config: kind must be one of {allowed}, got {config['kind']!r}")


def _check_bundle_agrees(planner_config: dict, config: dict, role: str = "denoiser") -> None:
    """A bundle's networks sample together: the symbols the planner reads must be those the
    network of `role` predicts (as ddpd.cli.common.vocabulary counts them), in one tokenizer."""
    def symbols(config: dict):
        return config["model"].get("vocab_size" if config["kind"] == "planner" else "out_dim")

    facts = {"vocabulary": (symbols(planner_config), symbols(config)),
             "tokenizer": (planner_config.get("tokenizer"), config.get("tokenizer"))}
    for name, (planner, other) in facts.items():
        if planner != other:
            raise ValueError(f"save_bundle: the planner's {name} is {planner!r}, the {role}'s {other!r}: "
                             "a bundle's networks must share it")


def _check_model(model, config: dict, what: str) -> None:
    """A ddpd.models network must be what its config says, kind and fields: a checkpoint that
    would load as another network (or not at all) is refused before it replaces anything."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{what}: model must be a torch.nn.Module, got {type(model).__name__}")
    kind = getattr(model, "kind", None)
    if kind in KINDS and kind != config["kind"]:
        raise ValueError(f"{what}: config['kind'] must be the model's kind {kind!r}, got {config['kind']!r}")
    model_config = getattr(model, "config", None)
    if hasattr(model_config, "to_dict") and model_config.to_dict() != _described(model_config, config["model"]):
        raise ValueError(f"{what}: config['model'] must describe the model, got {config['model']} "
                         f"for a model with {model_config.to_dict()}")


def _described(model_config, fields: dict) -> dict:
    """`fields` as the model's config class reads them: an older config.json lacks the
    fields added since, which load as their defaults (the shipped bundle's has no
    num_classes), and still describes the same model."""
    try:
        return type(model_config).from_dict(fields).to_dict()
    except (AttributeError, TypeError, ValueError):  # not a TransformerConfig, or not a valid one
        return fields


def _check_config(config, what: str) -> None:
    if not isinstance(config, dict):
        raise TypeError(f"{what} must be a dict, got {type(config).__name__}")
    if config.get("kind") not in KINDS:
        raise ValueError(f"{what}: 'kind' must be one of {KINDS}, got {config.get('kind')!r}")
    if not isinstance(config.get("model"), dict):
        raise ValueError(f"{what}: 'model' must be a dict of TransformerConfig fields, got {config.get('model')!r}")
    digests = config.get("sha256", {})
    if not isinstance(digests, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in digests.items()):
        raise ValueError(f"{what}: 'sha256' must map file names to hex digests, got {str(digests)[:80]}")


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


__all__ = ["CONFIG", "Checkpoint", "CheckpointError", "KINDS", "STATE_META", "STATE_TENSORS", "WEIGHTS",
           "ensure_replaceable", "has_train_state", "load_bundle", "load_checkpoint", "load_model",
           "load_train_state", "read_config", "resume_settings", "save_bundle", "save_checkpoint"]
