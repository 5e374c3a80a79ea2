"""categorical_from_weights: one index per row, drawn by inverse CDF from non-negative weights.

This is the categorical draw under every `torch.multinomial(p, 1)` of the sampling
listings of the paper (appendix 'Implementation details'): the position d to denoise,
d ~ p(z^d = N | x_t) normalised over d (Gillespie option B), and the new token
x_1^d ~ p(x_1^d | x_t, z^d = N). The weights need not sum to one.

The law, defined exactly so that the C++/CUDA kernels (csrc/chunked_cdf.h) and
the torch reference below return the same index for the same uniform:

- weights are taken in float64 and cut into chunks of CHUNK = 64 consecutive
  entries; the running sum inside a chunk adds one weight at a time;
- P_j = P_{j-1} + (sum of chunk j), in chunk order; the cumulative weight of entry
  i of chunk j is c_i = P_{j-1} + (running sum of chunk j up to i); total = P_last;
- index = the smallest i with c_i > u * total, for the row's uniform u in [0, 1).

Entries of zero weight are never drawn, and P(index = i) = w_i / total up to the
resolution of u. The chunking lets the kernel run one addition chain per chunk in
parallel instead of one chain per row.

A row is valid when its weights are finite, non-negative and not all zero. An
invalid row returns index 0; `return_valid=True` returns the flags, otherwise any
invalid row raises ValueError (on CUDA that check waits for the device).
"""
from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F

from ddpd.ops import _ext

CHUNK = 64  # equals kChunk in csrc/chunked_cdf.h
WEIGHT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

Result = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


def check_weights(weights) -> torch.Tensor:
    """Validate Float[B, N] weights; half precision is widened to float32 (exactly)."""
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"weights must be a torch.Tensor, got {type(weights).__name__}")
    if weights.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"weights must be a float32/float64/float16/bfloat16 tensor, got {weights.dtype}")
    if weights.dim() != 2 or weights.shape[1] == 0:
        raise ValueError(f"weights must have shape [B, N] with N >= 1, got {tuple(weights.shape)}")
    if weights.device.type not in ("cpu", "cuda"):
        raise ValueError(f"weights must be on a cpu or cuda device, got {weights.device}")
    return weights.float() if weights.dtype in (torch.float16, torch.bfloat16) else weights


def check_uniforms(name: str, uniforms, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """Validate uniforms in [0, 1) of the given shape on like's device; returns them as float64.

    The range is checked on CPU only, where it costs no device synchronisation; on
    CUDA a uniform outside [0, 1) still gives an index in range.
    """
    if not isinstance(uniforms, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(uniforms).__name__}")
    if uniforms.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64, got {uniforms.dtype}")
    if tuple(uniforms.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(uniforms.shape)}")
    if uniforms.device != like.device:
        raise ValueError(f"{name} must be on {like.device} like the weights, got {uniforms.device}")
    if uniforms.device.type == "cpu" and uniforms.numel() > 0:
        low, high = float(uniforms.min()), float(uniforms.max())
        if not (0.0 <= low and high < 1.0):
            raise ValueError(f"{name} must lie in [0, 1), got values in [{low}, {high}]")
    return uniforms.double()


def finish(index: torch.Tensor, valid: torch.Tensor, return_valid: bool, need: str) -> Result:
    """(index, valid) when asked for, else index after raising on invalid rows."""
    if return_valid:
        return index, valid
    if not bool(valid.all()):
        bad = (~valid).nonzero().flatten()[:8].tolist()
        raise ValueError(
            f"weights: rows {bad} (first 8 shown) are not valid distributions; each row needs finite, "
            f"non-negative weights with {need}. Pass return_valid=True to get the flags instead."
        )
    return index


def cumulative_weights(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c Float64[B, N], total Float64[B]): the two-level cumulative sums of the law above."""
    rows, n = weights.shape
    chunks = -(-n // CHUNK)
    padded = F.pad(weights.double(), (0, chunks * CHUNK - n))  # zeros add nothing
    running = padded.view(rows, chunks, CHUNK).cumsum(-1)  # torch.cumsum adds in order
    prefix = running[..., -1].cumsum(-1)
    before = F.pad(prefix[:, :-1], (1, 0))  # P_{j-1}, zero before the first chunk
    c = (before[..., None] + running).view(rows, -1)[:, :n]
    return c, prefix[:, -1]


def row_validity(weights: torch.Tensor, min_positive: int) -> torch.Tensor:
    """Bool[B]: finite non-negative weights, finite total, at least min_positive positive."""
    _, total = cumulative_weights(weights)
    return (
        (weights >= 0).all(-1)
        & torch.isfinite(total)
        & (total > 0)
        & ((weights > 0).sum(-1) >= min_positive)
    )


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Long[B]: smallest i with c_i > u * total, for rows with positive finite total."""
    c, total = cumulative_weights(weights)
    return (c <= (u.double() * total)[:, None]).sum(-1)


def categorical_from_weights_reference(weights, uniforms, *, return_valid: bool = False) -> Result:
    """Plain torch version of categorical_from_weights (same arguments, same results)."""
    weights = check_weights(weights)
    uniforms = check_uniforms("uniforms", uniforms, (weights.shape[0],), weights)
    valid = row_validity(weights, 1)
    safe = torch.where(valid[:, None], weights.double(), 1.0)
    index = torch.where(valid, inverse_cdf(safe, uniforms), 0)
    return finish(index, valid, return_valid, "a positive total")


def categorical_from_weights(weights, uniforms, *, return_valid: bool = False) -> Result:
    """Long[B] index per row of weights Float[B, N], drawn with the row's uniform in [0, 1).

    index[b] is the smallest i whose two-level cumulative weight exceeds
    uniforms[b] * total[b] (module docstring). With return_valid=True returns
    (index, valid Bool[B]); otherwise an invalid row raises ValueError.
    """
    weights = check_weights(weights)
    uniforms = check_uniforms("uniforms", uniforms, (weights.shape[0],), weights)
    ops = _ext.ops_for(weights.device)
    if ops is None:
        return categorical_from_weights_reference(weights, uniforms, return_valid=return_valid)
    index, valid = ops.categorical_from_weights(weights, uniforms)
    return finish(index, valid, return_valid, "a positive total")
