"""Triton kernel of ddpd.ops.planner_mask, and the planner helpers the planner
kernels share.

The mask of prop:draw_with_maskD: z^d ~ Bernoulli(p^d), p^d = sigmoid(l^d), drawn
as z^d = u^d < p^d (uniform d at column d), forced to 1 at the positions being
denoised; the masked sequence holds mask_id where z = 1 and x elsewhere.
One program per row; the row is held in one block. float32 arithmetic only.
"""
import triton
import triton.language as tl

from ddpd.kernels.philox import load_counters, row_uniform


@triton.jit
def planner_row(logits_ptr, row, offs, D):
    """Planner logits of a row as float32; NaN reads as -inf (probability 0) and
    lanes beyond D are -inf."""
    l = tl.load(logits_ptr + row * D + offs, mask=offs < D, other=float("-inf")).to(tl.float32)
    return tl.where(l != l, float("-inf"), l)


@triton.jit
def planner_sigmoid(l):
    return 1.0 / (1.0 + tl.exp(-l))


@triton.jit
def write_mask(u, p, forced, x_ptr, masked_ptr, z_ptr, count_ptr, row, offs, D, mask_id):
    """z = (u < p) | forced on the row; store the masked row, z and the count."""
    in_row = offs < D
    z = ((u < p) | forced) & in_row
    x = tl.load(x_ptr + row * D + offs, mask=in_row, other=0)
    tl.store(masked_ptr + row * D + offs, tl.where(z, mask_id, x), mask=in_row)
    tl.store(z_ptr + row * D + offs, z, mask=in_row)
    tl.store(count_ptr + row, tl.sum(z.to(tl.int64), axis=0))


@triton.jit
def planner_mask_kernel(
    logits_ptr, x_ptr, positions_ptr, D, k, mask_id,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
    masked_ptr, z_ptr, count_ptr,
    BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    if row_ids_ptr is not None:
        row_id = tl.load(row_ids_ptr + row)
    else:
        row_id = row
    offs = tl.arange(0, BLOCK_D)
    p = planner_sigmoid(planner_row(logits_ptr, row, offs, D))
    u = row_uniform(noise_ptr, D, row, tl.where(offs < D, offs, 0), row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                    noise_ptr is not None)
    i = tl.arange(0, BLOCK_K)
    chosen = tl.load(positions_ptr + row * k + i, mask=i < k, other=-1)
    # Positions outside [0, D) match no lane and so force nothing.
    forced = tl.max((offs[:, None] == chosen[None, :]).to(tl.int32), axis=1) > 0
    write_mask(u, p, forced, x_ptr, masked_ptr, z_ptr, count_ptr, row, offs, D, mask_id)
