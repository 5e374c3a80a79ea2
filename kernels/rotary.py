"""Triton kernel of ddpd.ops.rotary: one program per (sequence, head, block of
positions), on one grid axis (a second axis is capped at 65535 programs), reads both
halves of each position's channels once, rotates them in float32 and writes them in the
output's dtype. The launcher compiles it without fused multiply-adds, so each product
and sum is rounded as torch's separate elementwise kernels round it; bfloat16 is widened
from its bits and rounded as torch rounds it (to nearest even, NaN to a NaN), both
written out because the Triton interpreter converts bfloat16 subnormals and ties
differently: the output equals the reference bit for bit (up to NaN payloads).
"""
import triton
import triton.language as tl


@triton.jit
def from_input(value, BF16: tl.constexpr):
    """x's values in float32 (bfloat16: its 16 bits are the top half of the float32's)."""
    if BF16:
        return (value.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return value.to(tl.float32)


@triton.jit
def to_output(value, out_ptr, BF16: tl.constexpr):
    """float32 value in the output's dtype, bfloat16 rounded as torch rounds it (the
    carry of the nearest-even rounding would turn a NaN into inf: NaN is written apart)."""
    if BF16:
        bits = value.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(value != value, 0x7FC0, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return value.to(out_ptr.dtype.element_ty)


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, heads, length, half, stride_b, stride_h, stride_l,
                  BLOCK_L: tl.constexpr, BLOCK_HALF: tl.constexpr, BF16: tl.constexpr):
    blocks = tl.cdiv(length, BLOCK_L)
    program = tl.program_id(0).to(tl.int64)
    sequence_head = program // blocks
    b, h = sequence_head // heads, sequence_head % heads
    rows = (program % blocks) * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = tl.arange(0, BLOCK_HALF)
    live = (rows[:, None] < length) & (cols[None, :] < half)
    src = x_ptr + b * stride_b + h * stride_h + rows[:, None] * stride_l + cols[None, :]
    x1 = from_input(tl.load(src, mask=live, other=0.0), BF16)
    x2 = from_input(tl.load(src + half, mask=live, other=0.0), BF16)
    table = rows[:, None] * half + cols[None, :]
    cos = tl.load(cos_ptr + table, mask=live, other=0.0)
    sin = tl.load(sin_ptr + table, mask=live, other=0.0)
    dst = out_ptr + (sequence_head * length + rows[:, None]) * (2 * half) + cols[None, :]
    tl.store(dst, to_output(x1 * cos - x2 * sin, out_ptr, BF16), mask=live)
    tl.store(dst + half, to_output(x2 * cos + x1 * sin, out_ptr, BF16), mask=live)
