"""Triton kernel of ddpd.ops.planner_select and ddpd.ops.planner_select_mask.

One program per row of planner logits [B, D], the row held in one block:
p^d = sigmoid(l^d), sum_d p^d, stop = all p^d < eps, and k positions without
replacement by Gumbel-top-k on the log-weights (log sigmoid(l) for option A, l / tau
for option C's softmax over positions, relative to the row's largest, or to the largest
still free where that lies far below it; uniform d at column d). With
WITH_MASK the mask of prop:draw_with_maskD follows from the same probabilities
(uniform d at column d of the mask's offset). float32 arithmetic, sum_p accumulated in
float64. The row helpers here are also those of ddpd.kernels.planner_mask.
"""
import triton
import triton.language as tl

from ddpd.kernels.rng import COUNTER_WORDS, below_one, gumbel, load_counters, load_row_id, row_uniform
from ddpd.kernels.sample_categorical import shift

REBASE_GAP = tl.constexpr(64.0)  # ddpd.ops.planner_select.REBASE_GAP


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
    """z = (min(u, BELOW_ONE) < p) | forced on the row; store the masked row, z and the count."""
    in_row = offs < D
    z = ((below_one(u) < p) | forced) & in_row
    x = tl.load(x_ptr + row * D + offs, mask=in_row, other=0)
    tl.store(masked_ptr + row * D + offs, tl.where(z, mask_id, x), mask=in_row)
    tl.store(z_ptr + row * D + offs, z, mask=in_row)
    tl.store(count_ptr + row, tl.sum(z.to(tl.int64), axis=0))


@triton.jit
def log_sigmoid(l):
    """min(l, 0) - log(1 + exp(-|l|)): finite where sigmoid(l) underflows."""
    return tl.minimum(l, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(l)))


@triton.jit(do_not_specialize=COUNTER_WORDS)
def planner_select_kernel(
    logits_ptr, D, k, tau, eps,
    noise_ptr, mask_noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, mask_offset_lo, mask_offset_hi,
    seed_ptr, offset_ptr, mask_offset_ptr, x_ptr, mask_id, positions_ptr, sum_p_ptr, stop_ptr, masked_ptr, z_ptr,
    count_ptr,
    SOFTMAX: tl.constexpr, WITH_MASK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    row_id = load_row_id(row_ids_ptr, row)
    offs = tl.arange(0, BLOCK_D)
    in_row = offs < D
    column = tl.where(in_row, offs, 0)
    l = planner_row(logits_ptr, row, offs, D)
    p = planner_sigmoid(l)  # 0 beyond D
    tl.store(sum_p_ptr + row, tl.sum(p.to(tl.float64), axis=0).to(tl.float32))
    tl.store(stop_ptr + row, tl.max(p, axis=0) < eps)

    # Relative to the row's largest: huge logits keep their noise, +inf logits tie at 0.
    if SOFTMAX:
        base = l
        scale = tl.cast(tau, tl.float32)  # the interpreter types a Python float below 2**-126 as fp64
    else:
        base = log_sigmoid(l)
        scale = 1.0
    u = row_uniform(noise_ptr, D, row, column, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                    noise_ptr is not None)
    g = gumbel(u)
    top = tl.max(base, axis=0)
    # Gumbel-top-k by k rounds of argmax; the lowest free position wins ties, so
    # positions of weight 0 come last, in order, as in a stable descending sort. A round
    # whose largest free base lies more than REBASE_GAP below `top` (and is not -inf) takes
    # the keys relative to it instead: the same order in exact arithmetic, but keys far
    # below the top would round to one value (ddpd.ops.planner_select.gumbel_rounds).
    taken = offs < 0
    for i in range(k):
        free = in_row & ~taken
        free_top = tl.max(tl.where(free, base, float("-inf")), axis=0)
        rebase = (tl.max(tl.where(free, shift(base, top, scale), float("-inf")), axis=0) < -REBASE_GAP) \
            & (free_top > float("-inf"))
        top = tl.where(rebase, free_top, top)
        key = shift(base, top, scale) + g
        best = tl.max(tl.where(free, key, float("-inf")), axis=0)
        pick = tl.min(tl.where(free & (key == best), offs, BLOCK_D), axis=0)
        tl.store(positions_ptr + row * k + i, pick.to(tl.int64))
        taken = taken | (offs == pick)

    if WITH_MASK:
        _, _, mask_offset_lo, mask_offset_hi = load_counters(seed_lo, seed_hi, mask_offset_lo, mask_offset_hi, None,
                                                             mask_offset_ptr)
        mask_u = row_uniform(mask_noise_ptr, D, row, column, row_id, seed_lo, seed_hi, mask_offset_lo,
                             mask_offset_hi, mask_noise_ptr is not None)
        # a pick of weight 0 (logit -inf or NaN) is not denoised: not forced into the mask
        write_mask(mask_u, p, taken & (base > float("-inf")), x_ptr, masked_ptr, z_ptr, count_ptr, row, offs, D,
                   mask_id)
