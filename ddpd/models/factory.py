"""Build any ddpd network by kind name; derive a consistent config; count parameters.

Kinds (the "kind" field of a checkpoint's config.json): planner, mask-denoiser,
uniform-denoiser, uniform, ar.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from ddpd.models.ar import ARModel
from ddpd.models.config import TransformerConfig
from ddpd.models.mask_denoiser import MaskDenoiser
from ddpd.models.planner import Planner
from ddpd.models.uniform_denoiser import UniformDenoiser
from ddpd.models.uniform_model import UniformModel
from ddpd.validation import check_bool, check_int

MODEL_CLASSES = {cls.kind: cls for cls in (Planner, MaskDenoiser, UniformDenoiser, UniformModel, ARModel)}
MODEL_KINDS = tuple(MODEL_CLASSES)

# kind -> (extra input symbols (mask / BOS), output head width or None for V, causal, time-conditioned by default)
_LAYOUT = {
    "planner": (0, 1, False, False),
    "mask-denoiser": (1, None, False, True),
    "uniform-denoiser": (0, None, False, True),
    "uniform": (0, None, False, True),
    "ar": (1, None, True, False),
}


def _check_kind(kind: Any) -> None:
    if not isinstance(kind, str) or kind not in MODEL_CLASSES:  # a list is unhashable: no dict lookup
        raise ValueError(f"kind: expected one of {MODEL_KINDS}, got {kind!r}")


def build_model(kind: str, config: TransformerConfig) -> nn.Module:
    """A freshly initialised network of the given kind; config must fit the kind.

    Args:
        kind: one of MODEL_KINDS ("planner", "mask-denoiser", "uniform-denoiser",
            "uniform", "ar").
        config: the network's TransformerConfig (config_for builds one that fits the kind).

    Returns:
        The network, an nn.Module with freshly initialised float32 weights.

    Raises:
        ValueError: `kind` is unknown, or `config` does not fit it.
        TypeError: `config` is not a TransformerConfig.

    Example:
        >>> planner = build_model("planner", config_for("planner", vocab_size=27, seq_len=256))
    """
    _check_kind(kind)
    return MODEL_CLASSES[kind](config)


# in-place random fills of a tensor, which torch.nn.init's functions end in
_RANDOM_FILLS = frozenset({"normal_", "uniform_", "random_", "bernoulli_", "exponential_", "geometric_",
                           "log_normal_", "cauchy_"})


class _NoInitialisers(TorchFunctionMode):
    """Skips torch.nn.init's functions and the random fills of tensors (values of a network
    no one reads): on the meta device a random fill imports torch._dynamo and triton."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" or getattr(func, "__name__", None) in _RANDOM_FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def build_skeleton(kind: str, config: TransformerConfig) -> nn.Module:
    """The network of `kind` on the meta device: the names, shapes and dtypes of its
    parameters and buffers, without memory and without running an initialiser (the meta
    device's random fills imported torch._dynamo and triton: seconds of every checkpoint
    load, and C++ a signal must not interrupt). `to_empty(device=...)` makes it a network
    there to fill with load_state_dict: its rotary tables are computed, the rest is empty.
    `load_state_dict(state, assign=True)` fills it in place: the rotary tables are computed
    on the device of the weights assigned.

    Args:
        kind: one of MODEL_KINDS.
        config: the network's TransformerConfig.

    Returns:
        The network on the meta device.

    Raises:
        ValueError: `kind` is unknown, or `config` does not fit it.
    """
    _check_kind(kind)
    with torch.device("meta"), _NoInitialisers():
        return MODEL_CLASSES[kind](config)


def config_for(kind: str, vocab_size: int, seq_len: int, time_conditioned: Optional[bool] = None,
               **fields: Any) -> TransformerConfig:
    """The TransformerConfig a `kind` network needs for V = vocab_size clean symbols and
    sequences of seq_len tokens; other TransformerConfig fields (d_model, n_layers, ...)
    pass through. The AR model gets max_seq_len = seq_len + 1 to fit its BOS token.

    Args:
        kind: one of MODEL_KINDS.
        vocab_size: V, the number of clean symbols (a mask or BOS id is added where the
            kind needs one).
        seq_len: D, the sequence length.
        time_conditioned: whether the trunk takes the time t; None for the kind's default
            (False for "planner" and "ar", which cannot take it).
        **fields: other TransformerConfig fields (d_model, n_layers, n_heads, ...).

    Returns:
        The TransformerConfig.

    Raises:
        ValueError: an unknown kind, a non-positive size, time_conditioned=True for a
            planner or AR model, or a field derived from the others (out_dim, causal,
            max_seq_len) given in `fields`.
        TypeError: a size that is not an int.
    """
    _check_kind(kind)
    extra, out_dim, causal, timed = _LAYOUT[kind]
    if time_conditioned is None:
        time_conditioned = timed
    elif check_bool("time_conditioned", time_conditioned) and kind in ("planner", "ar"):
        raise ValueError(f"time_conditioned: a {kind} model has no time input, got True")
    vocab_size = check_int("vocab_size", vocab_size, 1)
    seq_len = check_int("seq_len", seq_len, 1)
    fixed = {"out_dim", "causal", "max_seq_len"} & set(fields)  # vocab_size is an argument of its own
    if fixed:
        raise ValueError(f"config_for: fields {sorted(fixed)} are derived from kind, vocab_size and seq_len")
    return TransformerConfig(vocab_size=vocab_size + extra, out_dim=out_dim or vocab_size, causal=causal,
                             max_seq_len=seq_len + (kind == "ar"), time_conditioned=time_conditioned, **fields)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (each shared tensor counted once).

    Args:
        model: the network.
        trainable_only: count only parameters with requires_grad.

    Returns:
        The number of parameters.

    Raises:
        TypeError: `model` is not an nn.Module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected torch.nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
