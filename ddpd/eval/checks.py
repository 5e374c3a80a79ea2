"""Validation of the public inputs of ddpd.eval, and checked model calls.

Errors name the argument, what was expected and what was given. Model outputs are
checked for shape and returned as float32, so every metric is computed in float32
whatever precision the network runs in.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ddpd.validation import check_callable, check_choice, check_float, check_int, check_tensor  # noqa: F401


def check_tokens(name: str, x, vocab_size: Optional[int]) -> Tensor:
    """x: Long[B, D] with ids in [0, vocab_size) (the range is checked on CPU only).

    Args:
        name: the argument's name, for the message.
        x: the tokens given.
        vocab_size: V, or None to leave the range to the caller.

    Returns:
        `x`.

    Raises:
        TypeError, ValueError: not such a tensor.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(x).__name__}")
    if x.dtype != torch.long:
        raise TypeError(f"{name} must have dtype torch.int64, got {x.dtype}")
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must have shape [B, D] with B, D >= 1, got {tuple(x.shape)}")
    if x.device.type == "cpu" and vocab_size is not None:
        low, high = int(x.min()), int(x.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} must hold ids in [0, {vocab_size}), got range [{low}, {high}]")
    return x


def check_row_ids(row_ids: Optional[Tensor], batch: int, device: torch.device) -> Tensor:
    """Sequence ids Long[B] (default 0..B-1): each sequence's random stream is keyed by its id.

    Args:
        row_ids: Long[B] ids, or None.
        batch: B.
        device: where the ids are used.

    Returns:
        Long[B] ids on `device`.

    Raises:
        TypeError: not a dense Long tensor.
        ValueError: not of shape [B], or ids < 0.
    """
    if row_ids is None:
        return torch.arange(batch, device=device)
    check_tensor("row_ids", row_ids, (torch.long,))
    if tuple(row_ids.shape) != (batch,):
        raise ValueError(f"row_ids must be a Long tensor of shape ({batch},), got {tuple(row_ids.shape)}")
    if row_ids.device.type == "cpu" and int(row_ids.min()) < 0:
        raise ValueError(f"row_ids must be >= 0, got minimum {int(row_ids.min())}")
    return row_ids.to(device)


def _check_output(name: str, out, shape: tuple) -> Tensor:
    if not isinstance(out, Tensor):
        raise TypeError(f"{name} must return a tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape or not out.is_floating_point():
        raise ValueError(f"{name} must return floating logits of shape {list(shape)}, "
                         f"got {out.dtype} of shape {list(out.shape)}")
    return out.float()


def log_probs(model: Callable, x: Tensor, t: Optional[Tensor], vocab_size: int, name: str) -> Tensor:
    """log softmax of model(x, t) (or model(x) when t is None): Float[B, D, vocab_size].

    Args:
        model: the network.
        x: Long[B, D] tokens.
        t: Float[B] times, or None.
        vocab_size: V, the logits' last dimension.
        name: the model's name, for the message.

    Returns:
        Float[B, D, V] float32 log-probabilities.

    Raises:
        TypeError: the model returned no tensor.
        ValueError: logits of another shape or dtype.
    """
    out = model(x) if t is None else model(x, t)
    return F.log_softmax(_check_output(name, out, (*x.shape, vocab_size)), dim=-1)


def planner_logits(planner: Callable, x: Tensor, t: Optional[Tensor]) -> Tensor:
    """planner(x) (or planner(x, t) for a time-conditioned planner): Float[B, D].

    Args:
        planner: the planner.
        x: Long[B, D] tokens.
        t: Float[B] times, or None for a time-free planner.

    Returns:
        Float[B, D] float32 logits.
    """
    out = planner(x) if t is None else planner(x, t)
    return _check_output("planner", out, tuple(x.shape))


def at(values: Tensor, index: Tensor) -> Tensor:
    """values[b, d, index[b, d]]: Float[B, D, V], Long[B, D] -> Float[B, D].

    Args:
        values: Float[B, D, V].
        index: Long[B, D].

    Returns:
        Float[B, D].
    """
    return values.gather(-1, index[..., None]).squeeze(-1)
