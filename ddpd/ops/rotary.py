"""The rotary position embedding of q or k in one pass (the rotation of
ddpd.models.attention.RotaryEmbedding), for networks sampling on a GPU:
out = cat(x1 cos - x2 sin, x2 cos + x1 sin) in float32, rounded to x's dtype.
CUDA tensors run ddpd.kernels.rotary, bit for bit the reference; CPU tensors and calls that
need a gradient run the reference.
The law and the kernel: docs/ops/rotary.md.
"""
from __future__ import annotations

import torch

from ddpd.ops import _dispatch
from ddpd.validation import check_same_device, check_tensor, transformed

BLOCK_ELEMENTS = 4096  # channel pairs per program: BLOCK_L positions x BLOCK_HALF pairs


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Plain torch version of rotary (the law of docs/ops/rotary.md), the kernel's values bit for bit.

    Args:
        The arguments of ddpd.ops.rotary (not checked here).

    Returns:
        The rotated tensor, contiguous and of x's dtype; differentiable.
    """
    length = x.shape[-2]
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[:length], sin[:length]
    # halves of one channel (d = 2) from a qkv view come out of cat channels-last
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype).contiguous()


def check_rotary(x, cos, sin) -> None:
    """Validate the arguments of rotary.

    Args:
        x, cos, sin: the op's arguments of these names.

    Raises:
        TypeError: a tensor of the wrong dtype.
        ValueError: a shape or device mismatch, or an odd head dimension.
    """
    check_tensor("x", x, _dispatch.FLOAT_DTYPES, 4)
    head_dim, length = x.shape[-1], x.shape[-2]
    if head_dim % 2:
        raise ValueError(f"x's last dimension (the head dimension) must be even, got {head_dim}")
    for name, table in (("cos", cos), ("sin", sin)):
        check_tensor(name, table, (torch.float32,), 2)
        check_same_device(name, table, x, "x")
        if table.shape[1] != head_dim // 2 or table.shape[0] < length:
            raise ValueError(f"{name} must have shape [L' >= {length}, {head_dim // 2}] (positions x channel "
                             f"pairs), got {tuple(table.shape)}")


def rotary_launch(batch: int, heads: int, length: int, half: int) -> tuple[tuple, int, int]:
    """The launch of the rotary kernel: every channel pair of a position in one program, as
    many positions as make about BLOCK_ELEMENTS pairs, a program per (sequence, head) and
    block of positions, all on the first grid axis (up to 2**31 - 1 programs).

    Args:
        batch: B, sequences.
        heads: H, heads a sequence.
        length: L, positions a head.
        half: d/2, channel pairs a position.

    Returns:
        (grid, BLOCK_L, BLOCK_HALF).
    """
    block_half = 1 << max(half - 1, 0).bit_length()
    block_l = max(1, min(BLOCK_ELEMENTS // block_half, 1 << max(length - 1, 0).bit_length()))
    return (batch * heads * -(-length // block_l),), block_l, block_half


def rotary_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Launch the Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    Args:
        x: float [B, H, L, d], validated.
        cos: float32 [L' >= L, d/2].
        sin: float32 [L' >= L, d/2].

    Returns:
        A new contiguous tensor of x's shape and dtype.
    """
    rotary_kernel = _dispatch.kernels("rotary").rotary_kernel
    if x.stride(-1) != 1:
        x = x.contiguous()
    batch, heads, length, head_dim = x.shape
    half = head_dim // 2
    out = torch.empty(batch, heads, length, head_dim, dtype=x.dtype, device=x.device)
    if out.numel():
        grid, block_l, block_half = rotary_launch(batch, heads, length, half)
        _dispatch.launch(
            rotary_kernel, grid, x, cos[:length].contiguous(), sin[:length].contiguous(), out, heads, length, half,
            x.stride(0), x.stride(1), x.stride(2), BLOCK_L=block_l, BLOCK_HALF=block_half,
            BF16=x.dtype == torch.bfloat16, enable_fp_fusion=False)
    return out


def _rotary_impl(x, cos, sin):
    """The kernel on CUDA where Triton imports (it is no dependency of ddpd), else the reference
    (under vmap too)."""
    if x.is_cuda and _dispatch.triton_available() and not transformed(x, cos, sin):
        return rotary_triton(x, cos, sin)
    return rotary_reference(x, cos, sin)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rotary without its argument checks, for callers whose shapes are right by
    construction (the networks' RotaryEmbedding): the kernel where rotary would run it,
    the reference where a gradient is needed and inside torch.compile (which fuses the
    torch code itself, where the custom op would be opaque to it).

    Args:
        x: float [B, H, L, d].
        cos: float32 [L' >= L, d/2].
        sin: float32 [L' >= L, d/2].

    Returns:
        What rotary returns for the same arguments.
    """
    if torch.compiler.is_compiling() or _dispatch.needs_grad(x, cos, sin):
        return rotary_reference(x, cos, sin)
    return _rotary_impl(x, cos, sin)


@torch.library.custom_op("ddpd::rotary", mutates_args=())
def _rotary_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _rotary_impl(x, cos, sin)


@_rotary_op.register_fake
def _(x, cos, sin):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x by position: the rotary position embedding (docs/ops/rotary.md).

    Args:
        x: float32/bfloat16/float16 [B, H, L, d], d even, last dimension contiguous.
        cos: float32 [L' >= L, d/2].
        sin: float32 [L' >= L, d/2].

    Returns:
        A new contiguous tensor of x's shape and dtype; differentiable (through the
        reference) when a gradient is needed.

    Raises:
        TypeError: a tensor of the wrong dtype.
        ValueError: a shape or device mismatch.
    """
    check_rotary(x, cos, sin)
    if _dispatch.needs_grad(x, cos, sin):
        return rotary_reference(x, cos, sin)
    run = _rotary_impl if _dispatch.eager(x, cos, sin) else _rotary_op
    return run(x, cos, sin)
