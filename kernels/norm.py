"""Triton kernel of ddpd.ops.norm: each program normalises BLOCK_ROWS rows of x whole
(every channel of a row in registers, so x is read once and the output written once),
with the statistics, the affine and the adaLN modulation in float32 and one rounding
to the output's dtype at the end. Row r belongs to sequence r // length, whose shift
and scale rows it reads. bfloat16 goes in and out through the rotary kernel's
conversions (widened from its bits, rounded to nearest even as torch rounds), which the
Triton interpreter would otherwise truncate.
"""
import triton
import triton.language as tl

from ddpd.kernels.rotary import from_input, to_output


@triton.jit
def inverse_deviation(variance, eps):
    """1 / sqrt(variance + eps); NaN where the squares overflowed float32 (values spread beyond
    about 1e19), as the reference gives, not the 0 that would return the bias silently (the
    exceptions: docs/ops/norm.md)."""
    return tl.where(variance == float("inf"), float("nan"), tl.rsqrt(variance + eps))


@triton.jit
def norm_kernel(x_ptr, weight_ptr, bias_ptr, shift_ptr, scale_ptr, out_ptr, rows, length, width, eps,
                stride_x, stride_shift, stride_scale, BLOCK_ROWS: tl.constexpr, BLOCK_W: tl.constexpr,
                RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, MODULATED: tl.constexpr,
                BF16: tl.constexpr, BF16_MODULATION: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_W)
    live_cols = cols < width
    live = (row < rows)[:, None] & live_cols[None, :]
    x = from_input(tl.load(x_ptr + row[:, None] * stride_x + cols[None, :], mask=live, other=0.0), BF16)
    if RMS:
        normed = x * inverse_deviation(tl.sum(x * x, axis=1) / width, eps)[:, None]
    else:  # two passes over the registers: the variance of the centred row, no cancellation
        # centred on the row's first value first: a constant row is then exactly 0 whatever its
        # float32 sum rounds to (else every value would keep the mean's rounding error, the
        # variance its square, and the output +-weight + bias instead of bias)
        pivot = from_input(tl.load(x_ptr + row * stride_x, mask=row < rows, other=0.0), BF16)
        pivoted = tl.where(live, x - pivot[:, None], 0.0)
        centred = tl.where(live, pivoted - (tl.sum(pivoted, axis=1) / width)[:, None], 0.0)
        normed = centred * inverse_deviation(tl.sum(centred * centred, axis=1) / width, eps)[:, None]
    if HAS_WEIGHT:
        normed = normed * tl.load(weight_ptr + cols, mask=live_cols, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        normed = normed + tl.load(bias_ptr + cols, mask=live_cols, other=0.0).to(tl.float32)[None, :]
    if MODULATED:
        sequence = row // length
        scale = tl.load(scale_ptr + sequence[:, None] * stride_scale + cols[None, :], mask=live, other=0.0)
        shift = tl.load(shift_ptr + sequence[:, None] * stride_shift + cols[None, :], mask=live, other=0.0)
        normed = normed * (1.0 + from_input(scale, BF16_MODULATION)) + from_input(shift, BF16_MODULATION)
    tl.store(out_ptr + row[:, None] * width + cols[None, :], to_output(normed, out_ptr, BF16), mask=live)
