"""Triton kernel of ddpd.ops.planner_mask: the mask of prop:draw_with_maskD alone.

z^d ~ Bernoulli(p^d), p^d = sigmoid(l^d), drawn as z^d = min(u^d, BELOW_ONE) < p^d
(uniform d at column d), forced to 1 at the positions being denoised (read BLOCK_K at a
time); the masked sequence holds mask_id where z = 1 and x elsewhere. One program per
row; the row is held in one block. float32 arithmetic only. The row helpers are
ddpd.kernels.planner_select's (planner_select_mask draws the same mask in its own kernel).
"""
import triton
import triton.language as tl

from ddpd.kernels.planner_select import planner_row, planner_sigmoid, write_mask
from ddpd.kernels.rng import COUNTER_WORDS, load_counters, load_row_id, row_uniform


@triton.jit(do_not_specialize=COUNTER_WORDS)
def planner_mask_kernel(
    logits_ptr, x_ptr, positions_ptr, D, k, mask_id,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
    masked_ptr, z_ptr, count_ptr,
    BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    row_id = load_row_id(row_ids_ptr, row)
    offs = tl.arange(0, BLOCK_D)
    p = planner_sigmoid(planner_row(logits_ptr, row, offs, D))
    u = row_uniform(noise_ptr, D, row, tl.where(offs < D, offs, 0), row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                    noise_ptr is not None)
    # BLOCK_K positions at a time: one [BLOCK_D, k] comparison passes Triton's largest block
    # at D x k > 2**20. Positions outside [0, D) match no lane and so force nothing.
    forced = offs < 0
    for k0 in range(0, k, BLOCK_K):
        i = k0 + tl.arange(0, BLOCK_K)
        chosen = tl.load(positions_ptr + row * k + i, mask=i < k, other=-1)
        forced = forced | (tl.max((offs[:, None] == chosen[None, :]).to(tl.int32), axis=1) > 0)
    write_mask(u, p, forced, x_ptr, masked_ptr, z_ptr, count_ptr, row, offs, D, mask_id)
