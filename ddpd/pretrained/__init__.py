"""The default sampling bundle shipped with ddpd: a text8 planner + mask denoiser, and a
single uniform model beside them.

`ddpd-sample` with no model argument samples from this bundle's pair, `ddpd-sample --model
uniform` from its uniform model; it is stored in the package as
ddpd/pretrained/text8/{planner,denoiser,uniform}/ (float16 weights + config.json):

    from ddpd.pretrained import load_default, load_default_uniform
    planner, denoiser, tokenizer = load_default()      # for sampling: no gradients
    uniform, tokenizer = load_default_uniform()

DDPD_PRETRAINED_DIR names another bundle directory as the default. `default_bundle()`
raises BundleNotFoundError when the files are missing. `python -m ddpd.pretrained
PLANNER DENOISER [--uniform DIR] --dest DIR` writes a bundle from training checkpoints.
docs/pretrained.md has how it was trained, how it scores and what a bundle must hold."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import torch

ENV_VAR = "DDPD_PRETRAINED_DIR"
BUNDLE_DIR = Path(__file__).resolve().parent / "text8"
ROLES = ("planner", "denoiser")
UNIFORM = "uniform"  # the role, and the kind, of the single uniform model
MODELS = {"pair": ROLES, "uniform": (UNIFORM,)}  # what --model names: the roles it loads
FILES = ("model.safetensors", "config.json")
# The bundle ships inside every wheel: with ddpd.assets (1 MB) the package's data stays under 50 MB.
MAX_BUNDLE_BYTES = 45 * 10**6
KINDS = {"planner": "planner", "denoiser": "mask-denoiser", UNIFORM: UNIFORM}
TOKENIZER = {"name": "text8"}
# Storage types of the bundled weights: load_model casts them to the float32 parameters.
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
TEXT8_SYMBOLS = 27  # ' ' and a-z: what the planner reads and the denoiser predicts


class BundleNotFoundError(FileNotFoundError):
    """No default bundle: neither DDPD_PRETRAINED_DIR nor the packaged one holds both checkpoints."""


def default_bundle(own: str = "--checkpoint BUNDLE (or --planner DIR --denoiser DIR)", model: str = "pair") -> str:
    """Path of the default sampling bundle: $DDPD_PRETRAINED_DIR if set, else the
    packaged ddpd/pretrained/text8. Raises BundleNotFoundError (one line, naming the
    missing files and how to pass your own checkpoints) when the files of `model` are
    not all there.

    Args:
        own: how the calling tool takes a bundle of one's own, for the error.
        model: the networks needed, a key of MODELS: "pair" (planner + denoiser) or "uniform".

    Returns:
        The bundle directory.

    Raises:
        ValueError: an unknown `model`.
        BundleNotFoundError: a file of `model` is missing from the bundle.
    """
    override = os.environ.get(ENV_VAR)
    path = Path(override) if override else BUNDLE_DIR
    missing = missing_files(path, model)
    if missing:
        where = f"{ENV_VAR}={override}" if override else "the ddpd package"
        what = "default model" if model == "pair" else f"default {model} model"
        raise BundleNotFoundError(
            f"no {what} in {where}: {path} lacks {', '.join(missing)}; pass your own checkpoints with "
            f"{own}, or set {ENV_VAR} to a bundle directory")
    return str(path)


def load_default(device: Union[str, torch.device] = "cpu"):
    """(planner, denoiser, tokenizer) of the default bundle, ready to sample: eval mode,
    no gradients. Sample with denoiser_type="mask": the bundle, packaged or named by
    DDPD_PRETRAINED_DIR, must pass check_bundle_configs (a mask denoiser among them).

    Args:
        device: where to put the networks: "auto", "cpu", "cuda", "cuda:N" or a torch.device.

    Returns:
        (planner, denoiser, tokenizer).

    Raises:
        TypeError: `device` is neither a str nor a torch.device.
        ValueError: an unknown `device`, CUDA where there is none (before the bundle is
            read), or a bundle that is not what the default must be (check_bundle_configs).
        BundleNotFoundError: a file of the bundle is missing.
        CheckpointError: a checkpoint of the bundle is damaged.

    Example:
        >>> planner, denoiser, tokenizer = load_default()
    """
    from ddpd.checkpoint import load_bundle
    from ddpd.training.data import tokenizer_from_config
    from ddpd.validation import check_device

    device = check_device("device", device)
    path = default_bundle(own="ddpd.checkpoint.load_bundle(DIR)")  # a Python caller has no CLI flags
    planner, denoiser, configs = load_bundle(path, device=str(device))
    try:
        check_bundle_configs(configs)
    except ValueError as err:
        raise ValueError(f"load_default: {path}: {err}") from None
    return (planner.requires_grad_(False), denoiser.requires_grad_(False),
            tokenizer_from_config(configs["denoiser"]["tokenizer"]))


def load_default_uniform(device: Union[str, torch.device] = "cpu"):
    """(uniform model, tokenizer) of the default bundle's single uniform model, ready to
    sample (eval mode, no gradients) with ddpd.sampling.ddpd_sample_uniform: one network
    that is both planner and denoiser (the paper's DDPD-DFM-Uni).

    Args:
        device: where to put the network: "auto", "cpu", "cuda", "cuda:N" or a torch.device.

    Returns:
        (uniform model, tokenizer).

    Raises:
        TypeError: `device` is neither a str nor a torch.device.
        ValueError: an unknown `device`, CUDA where there is none (before the bundle is
            read), or a uniform model that is not what the default must be (check_uniform_config).
        BundleNotFoundError: the bundle holds no uniform model.
        CheckpointError: its checkpoint is damaged.

    Example:
        >>> uniform, tokenizer = load_default_uniform()
    """
    from ddpd.checkpoint import load_model
    from ddpd.training.data import tokenizer_from_config
    from ddpd.validation import check_device

    device = check_device("device", device)
    path = default_bundle(own="ddpd.checkpoint.load_model(DIR)", model=UNIFORM)
    model, config = load_model(os.path.join(path, UNIFORM), device=str(device))
    try:
        check_uniform_config(config)
    except ValueError as err:
        raise ValueError(f"load_default_uniform: {path}: {err}") from None
    return model.eval().requires_grad_(False), tokenizer_from_config(config["tokenizer"])


def missing_files(path: os.PathLike, model: str = "pair") -> list[str]:
    """The files of a bundle's `model` (role/file) absent under `path`.

    Args:
        path: a bundle directory.
        model: a key of MODELS: "pair" (planner/ and denoiser/) or "uniform" (uniform/).

    Returns:
        "role/file" names, empty when the bundle holds `model` whole.

    Raises:
        ValueError: an unknown `model`.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {tuple(MODELS)}, got {model!r}")
    return [f"{role}/{name}" for role in MODELS[model] for name in FILES if not (Path(path) / role / name).is_file()]


def bundle_bytes(path: os.PathLike) -> int:
    """Total size in bytes of every file under `path`.

    Args:
        path: a directory.

    Returns:
        The total size in bytes.

    Raises:
        ValueError: `path` is "" (Path("") is the working directory).
        NotADirectoryError: `path` is no directory (a missing one would count 0 bytes).
    """
    if os.fspath(path) == "":
        raise ValueError("bundle_bytes: path must name a directory, got ''")
    if not Path(path).is_dir():
        raise NotADirectoryError(f"bundle_bytes: {os.fspath(path)} is not a directory")
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def check_bundle_configs(configs: dict) -> None:
    """ValueError unless {"planner": config, "denoiser": config[, "uniform": config]}
    describe what the default must be: a planner and a mask denoiser (and a single uniform
    model, if given) over the text8 alphabet, the same tokenizer, schedule and sequence length.

    Args:
        configs: {"planner": config, "denoiser": config}, with "uniform": config optionally.

    Raises:
        TypeError: configs, or a role's config, is not a dict.
        ValueError: a role is missing, or the configs are not those of a default bundle.
    """
    _check_roles(configs)
    roles = [role for role in KINDS if role in configs]
    for role in roles:
        _check_role(role, configs[role])
    symbols = {"planner reads": configs["planner"]["model"]["vocab_size"],
               **{f"{role} predicts": configs[role]["model"]["out_dim"] for role in roles[1:]}}
    if set(symbols.values()) != {TEXT8_SYMBOLS}:
        raise ValueError(f"default bundle: expected {TEXT8_SYMBOLS} text8 symbols, got {symbols}")
    lengths = {role: configs[role]["model"]["max_seq_len"] for role in roles}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"default bundle: its networks must share max_seq_len, got {lengths}")
    schedules = {role: configs[role].get("schedule", "linear") for role in roles}
    if len(set(schedules.values())) != 1:
        raise ValueError(f"default bundle: its networks must share the schedule, got {schedules}")


def check_uniform_config(config: dict) -> None:
    """ValueError unless `config` is that of a default single uniform model: kind "uniform",
    the text8 tokenizer and alphabet.

    Args:
        config: the uniform model's checkpoint config.

    Raises:
        TypeError: `config` is not a dict.
        ValueError: it is not the config of a default uniform model.
    """
    if not isinstance(config, dict):
        raise TypeError(f"default bundle: the {UNIFORM}'s config must be a dict, got {type(config).__name__}")
    _check_role(UNIFORM, config)
    symbols = {"uniform reads": config["model"]["vocab_size"], "uniform predicts": config["model"]["out_dim"]}
    if set(symbols.values()) != {TEXT8_SYMBOLS}:
        raise ValueError(f"default bundle: expected {TEXT8_SYMBOLS} text8 symbols, got {symbols}")


def _check_role(role: str, config: dict) -> None:
    """The kind and tokenizer the default asks of the network of `role`."""
    kind = KINDS[role]
    if config.get("kind") != kind:
        raise ValueError(f"default bundle: the {role} must be a {kind!r} model, got {config.get('kind')!r}")
    if config.get("tokenizer") != TOKENIZER:
        raise ValueError(f"default bundle: the {role} must use the tokenizer {TOKENIZER}, "
                         f"got {config.get('tokenizer')}")


def _check_roles(configs) -> None:
    """check_bundle_configs' argument a dict with a config dict per role: a missing one raised a
    bare KeyError: 'planner'."""
    if not isinstance(configs, dict):
        raise TypeError(f"default bundle: configs must be a dict {{role: config}}, got {type(configs).__name__}")
    missing = [role for role in ROLES if role not in configs]
    if missing:
        raise ValueError(f"default bundle: configs must hold a config for each of {', '.join(ROLES)}; "
                         f"{', '.join(missing)} missing")
    for role in ROLES:
        if not isinstance(configs[role], dict):
            raise TypeError(f"default bundle: the {role}'s config must be a dict, got {type(configs[role]).__name__}")


def _portable(config: dict, path: str) -> dict:
    """The config without the paths of the machine that trained it: the corpus by file
    name (a shipped bundle names its training data, not a directory), no output path."""
    from ddpd.checkpoint import CheckpointError

    if not isinstance(config.get("training") or {}, dict):  # an older config.json has no digest: it may be edited
        raise CheckpointError(f"install_bundle: {path}: config.json 'training' must be an object of ddpd-train "
                         f"settings, got {config['training']!r:.40}")
    training = dict(config.get("training") or {})
    if not training:
        return config
    data = training.get("data")
    if isinstance(data, str) and not data.startswith("hf:"):
        training["data"] = os.path.basename(os.path.normpath(data))  # corpora/text8/ is text8
    training.pop("out", None)
    return {**config, "training": training}


def install_bundle(planner: str, denoiser: str, dest: str, dtype: str = "float32",
                   uniform: Optional[str] = None) -> str:
    """Write a default bundle at `dest` from a planner and a mask-denoiser checkpoint (and
    a single uniform model's, stored beside them as uniform/), weights (stored as `dtype`,
    one of WEIGHT_DTYPES) and configs only, and return `dest`. Raises ValueError, leaving
    `dest` untouched, if the checkpoints are not what the default must be, a weight
    overflows `dtype` or the bundle would take over MAX_BUNDLE_BYTES. When `dest` is the
    bundle shipped in the package, its previous version is kept beside it (text8.previous,
    replacing an older one).

    Args:
        planner: the planner's checkpoint directory.
        denoiser: the mask denoiser's checkpoint directory.
        dest: the bundle directory to write.
        dtype: how to store the weights, one of WEIGHT_DTYPES.
        uniform: the single uniform model's checkpoint directory, or None for a bundle
            without one.

    Returns:
        `dest`.

    Raises:
        ValueError: an unknown dtype, checkpoints that do not make a default bundle, weights
            beyond the range of `dtype`, or a bundle over MAX_BUNDLE_BYTES.
        TypeError: `dest` is not a path.
        CheckpointError: a checkpoint is missing or damaged, or `dest` holds something
            other than a bundle (training checkpoints in its planner/ and denoiser/ included).
        ddpd.files.OutputError: `dest` is the working directory or holds it.
    """
    import shutil
    import tempfile

    from ddpd.checkpoint import ensure_replaceable, load_model, save_bundle

    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"install_bundle: dtype must be one of {WEIGHT_DTYPES}, got {dtype!r}")
    if not isinstance(dest, (str, os.PathLike)):
        raise TypeError(f"install_bundle: dest must be a directory path, got {type(dest).__name__}")
    dest = str(dest)
    ensure_replaceable(dest, "bundle")
    models = {}
    for role, path in (("planner", planner), ("denoiser", denoiser), (UNIFORM, uniform)):
        if path is None:
            continue
        model, config = load_model(path)
        model.to(getattr(torch, dtype))
        _check_finite(model, path, dtype)
        # The digests are recomputed on save; the training checkpoint's also name its optimizer state.
        models[role] = (model, _portable({k: v for k, v in config.items() if k != "sha256"}, path))
    check_bundle_configs({role: config for role, (_, config) in models.items()})

    def save(path: str) -> None:
        save_bundle(path, *models["planner"], *models["denoiser"], uniform=models.get(UNIFORM))

    with tempfile.TemporaryDirectory() as scratch:
        save(os.path.join(scratch, "bundle"))
        size = bundle_bytes(os.path.join(scratch, "bundle"))
    if size > MAX_BUNDLE_BYTES:
        raise ValueError(f"install_bundle: the bundle would take {size} bytes, over the {MAX_BUNDLE_BYTES} "
                         f"a package may ship; store the weights as float16 or train smaller models")
    if is_packaged(dest) and not missing_files(dest):
        backup = BUNDLE_DIR.parent / f"{BUNDLE_DIR.name}.previous"
        shutil.rmtree(backup, ignore_errors=True)
        shutil.copytree(dest, backup)
    save(dest)
    return dest


def _check_finite(model: torch.nn.Module, path: str, dtype: str) -> None:
    """ValueError naming the first tensor the cast to `dtype` overflowed (the checkpoint's own
    weights are finite: load_model refuses others), before anything is written."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"install_bundle: {path}: {name} has weights beyond the range of {dtype}; "
                             f"store the weights as float32 or bfloat16")


def is_packaged(path: os.PathLike) -> bool:
    """Whether `path` is the bundle directory shipped in the package.

    Args:
        path: a directory.

    Returns:
        True for the package's ddpd/pretrained/text8.
    """
    return Path(path).resolve() == BUNDLE_DIR
