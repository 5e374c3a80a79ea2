"""LayerNorm or RMSNorm of the last dimension with the optional adaLN modulation of a
conditioned trunk, in one pass (the norms of ddpd.models.backbone), for networks sampling on
a GPU: the float32 norm, the affine and n * (1 + scale) + shift, rounded once to x's dtype.
CUDA tensors run ddpd.kernels.norm (H up to MAX_KERNEL_WIDTH); everything else, and calls that
need a gradient, the reference.
The law and the kernel's precision: docs/ops/norm.md.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ddpd.ops import _dispatch
from ddpd.validation import (
    check_bool,
    check_float,
    check_same_device,
    check_tensor,
    readable,
    transformed,
    values_checkable,
)

MAX_KERNEL_WIDTH = 16384  # channels a program holds in registers; wider rows run the reference
BLOCK_ELEMENTS = 4096  # values a program normalises: BLOCK_ROWS rows of BLOCK_W channels


def norm_reference(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                   eps: float = 1e-5, *, rms: bool = False, shift: Optional[torch.Tensor] = None,
                   scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Plain torch version of norm (the law of docs/ops/norm.md).

    For float32 x it is the arithmetic of nn.LayerNorm (or the usual RMSNorm) followed by
    x * (1 + scale) + shift, but for a row whose variance overflows float32: NaN rather than
    the bias (except on CUDA outside a trace: docs/ops/norm.md).

    Args:
        The arguments of ddpd.ops.norm (not checked here).

    Returns:
        The normalised tensor, of x's dtype; differentiable.
    """
    x32 = x.float()
    if rms:
        mean_square = x32.pow(2).mean(-1, keepdim=True)
        # squares past float32's range: NaN, as the kernel gives, not x * 0 (the bias, silently)
        normed = x32 * torch.rsqrt(mean_square + eps).masked_fill(mean_square == math.inf, math.nan)
        if weight is not None:
            normed = normed * weight.float()
        if bias is not None:
            normed = normed + bias.float()
    else:  # F.layer_norm's arithmetic, with its inverse deviations
        normed, _, inverse = torch.native_layer_norm(x32, (x.shape[-1],), None if weight is None else weight.float(),
                                                     None if bias is None else bias.float(), eps)
        normed = _nan_where_overflowed(normed, inverse)
    if scale is not None:
        per_sequence = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        normed = normed * (1 + scale.float().reshape(per_sequence)) + shift.float().reshape(per_sequence)
    return normed.to(x.dtype)


def _nan_where_overflowed(normed: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """NaN rows where the variance overflowed float32 (inverse deviation 0), as the kernel
    gives, not the bias that layer_norm gives silently. The CPU fills only when a row needs
    it; CUDA outside a trace keeps layer_norm's rows, as a fill there costs a pass a call."""
    if values_checkable(inverse) and bool(inverse.all()):
        return normed
    if inverse.is_cuda and readable(inverse):
        return normed
    return normed.masked_fill(inverse == 0, math.nan)  # traced, fused into the norm; or a CPU row to fill


def check_norm(x, weight, bias, eps, rms, shift, scale) -> None:
    """Validate the arguments of norm.

    Args:
        x, weight, bias, eps, rms, shift, scale: the op's arguments of these names.

    Raises:
        TypeError: a tensor of the wrong dtype, or shift and scale of different dtypes.
        ValueError: a shape, device or eps out of range, or shift without scale.
    """
    check_tensor("x", x, _dispatch.FLOAT_DTYPES)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (the channels normalised)")
    width = x.shape[-1]
    _dispatch.check_width("x's last dimension", width)
    check_float("eps", eps, 0.0, open_min=True, open_max=True)
    check_bool("rms", rms)
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None:
            check_tensor(name, param, _dispatch.FLOAT_DTYPES, 1)
            check_same_device(name, param, x, "x")
            if param.shape[0] != width:
                raise ValueError(f"{name} must have shape [{width}] (x's last dimension), got {tuple(param.shape)}")
    if (shift is None) != (scale is None):
        raise ValueError("shift and scale come together (adaLN): give both or neither")
    if shift is None:
        return
    if x.dim() < 2:
        raise ValueError(f"x must be [B, ..., H] to take a per-sequence shift and scale, got shape {tuple(x.shape)}")
    for name, param in (("shift", shift), ("scale", scale)):
        check_tensor(name, param, _dispatch.FLOAT_DTYPES)
        check_same_device(name, param, x, "x")
        if tuple(param.shape) not in ((x.shape[0], width), (x.shape[0], 1, width)):
            raise ValueError(f"{name} must have shape [{x.shape[0]}, {width}] or [{x.shape[0]}, 1, {width}] "
                             f"(one row per sequence of x), got {tuple(param.shape)}")
    if shift.dtype != scale.dtype:
        raise TypeError(f"shift and scale must share a dtype (chunks of one projection), got {shift.dtype} "
                        f"and {scale.dtype}")


def norm_launch(rows: int, width: int) -> tuple[tuple, int, int, int]:
    """The launch of the norm kernel: a whole row in each program, as many rows as make about
    BLOCK_ELEMENTS values, on one grid axis; more warps for wider blocks, so a thread holds
    at most 16 (BLOCK_ELEMENTS' worth) to 32 values.

    Args:
        rows: rows of x flattened to [rows, H].
        width: H, the channels a row.

    Returns:
        (grid, BLOCK_ROWS, BLOCK_W, num_warps).
    """
    block_w = 1 << (width - 1).bit_length()
    block_rows = max(1, min(BLOCK_ELEMENTS // block_w, 1 << max(rows - 1, 0).bit_length()))
    num_warps = max(4, min(16, block_rows * block_w // 512))
    return (-(-rows // block_rows),), block_rows, block_w, num_warps


def _rows(param: torch.Tensor) -> torch.Tensor:
    """A per-sequence [B, H] or [B, 1, H] parameter as [B, H] rows with contiguous channels."""
    param = param.reshape(param.shape[0], param.shape[-1])
    return param if param.stride(-1) == 1 else param.contiguous()


def norm_triton(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                eps: float = 1e-5, *, rms: bool = False, shift: Optional[torch.Tensor] = None,
                scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Launch the Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    Args:
        x: float [B, ..., H], validated.
        weight: [H] or None.
        bias: [H] or None.
        eps: added to the variance (mean square).
        rms: RMS norm instead of layer norm.
        shift: [B, H] or [B, 1, H], with scale, or None.
        scale: like shift.

    Returns:
        A new contiguous tensor of x's shape and dtype.
    """
    width = x.shape[-1]
    x2d = x.reshape(-1, width)
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    rows = x2d.shape[0]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    grid, block_rows, block_w, num_warps = norm_launch(rows, width)
    modulated = scale is not None
    shift_rows, scale_rows = (_rows(shift), _rows(scale)) if modulated else (x2d, x2d)
    _dispatch.launch(
        _dispatch.kernels("norm").norm_kernel, grid,
        x2d, x2d if weight is None else weight.contiguous(), x2d if bias is None else bias.contiguous(),
        shift_rows, scale_rows, out, rows, rows // x.shape[0] if modulated else rows, width, eps, x2d.stride(0),
        shift_rows.stride(0), scale_rows.stride(0), BLOCK_ROWS=block_rows, BLOCK_W=block_w, RMS=rms,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, MODULATED=modulated, BF16=x.dtype == torch.bfloat16,
        BF16_MODULATION=modulated and scale.dtype == torch.bfloat16, num_warps=num_warps)
    return out


def _norm_impl(x, weight, bias, shift, scale, eps, rms):
    """The kernel on CUDA where Triton imports (it is no dependency of ddpd), else the reference
    (under vmap too); a contiguous tensor either way, as the fake kernel says."""
    if (x.is_cuda and x.shape[-1] <= MAX_KERNEL_WIDTH and _dispatch.triton_available()
            and not transformed(x, weight, bias, shift, scale)):
        return norm_triton(x, weight, bias, eps, rms=rms, shift=shift, scale=scale)
    return norm_reference(x, weight, bias, eps, rms=rms, shift=shift, scale=scale).contiguous()


def normalize(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
              rms: bool = False, shift: Optional[torch.Tensor] = None,
              scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """norm without its argument checks, for callers whose shapes are right by construction
    (the networks' LayerNorm and RMSNorm): the kernel where norm would run it, the reference
    where a gradient is needed and inside torch.compile (which fuses the torch code itself,
    where the custom op would be opaque to it).

    Args:
        x: float [B, ..., H].
        weight: [H] or None.
        bias: [H] or None.
        eps: added to the variance (mean square).
        rms: RMS norm instead of layer norm.
        shift: [B, H] or [B, 1, H], with scale, or None.
        scale: like shift.

    Returns:
        What norm returns for the same arguments.
    """
    if torch.compiler.is_compiling() or _dispatch.needs_grad(x, weight, bias, shift, scale):
        return norm_reference(x, weight, bias, eps, rms=rms, shift=shift, scale=scale)
    return _norm_impl(x, weight, bias, shift, scale, eps, rms)


@torch.library.custom_op("ddpd::norm", mutates_args=())
def _norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
             shift: Optional[torch.Tensor], scale: Optional[torch.Tensor], eps: float, rms: bool) -> torch.Tensor:
    return _norm_impl(x, weight, bias, shift, scale, eps, rms)


@_norm_op.register_fake
def _(x, weight, bias, shift, scale, eps, rms):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
         eps: float = 1e-5, *, rms: bool = False, shift: Optional[torch.Tensor] = None,
         scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Normalise x over its last dimension, with the optional affine and adaLN modulation.

    Layer norm (or RMS norm), then weight and bias, then n * (1 + scale) + shift; statistics
    and arithmetic in float32, one rounding to x's dtype (docs/ops/norm.md).

    Args:
        x: float32/bfloat16/float16 [B, ..., H].
        weight: [H] or None.
        bias: [H] or None.
        eps: added to the variance (mean square), > 0.
        rms: RMS norm instead of layer norm.
        shift: [B, H] or [B, 1, H] (one row per sequence), with scale, or None.
        scale: like shift.

    Returns:
        A new tensor of x's shape and dtype; differentiable (through the reference) when a
        gradient is needed.

    Raises:
        TypeError: a tensor of the wrong dtype.
        ValueError: a shape, device or eps out of range, or shift without scale.
    """
    check_norm(x, weight, bias, eps, rms, shift, scale)
    if _dispatch.needs_grad(x, weight, bias, shift, scale):
        return norm_reference(x, weight, bias, eps, rms=rms, shift=shift, scale=scale)
    run = _norm_impl if _dispatch.eager(x, weight, bias, shift, scale) else _norm_op
    return run(x, weight, bias, shift, scale, float(eps), rms)
