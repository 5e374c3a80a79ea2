"""Triton kernel of ddpd.ops.bernoulli: z = min(u, BELOW_ONE) < p per element, u the
counter-based uniform of (seed, offset, row id, column) (ddpd.kernels.rng), or of
explicit noise. One grid axis over (row, column block) pairs, column blocks fastest: a
second axis would be capped at 65535 blocks (D of 67M); the comparison runs in float64 for float64
p, in float32 otherwise (16-bit p is exact in float32), so every path compares the same
numbers.
"""
import triton
import triton.language as tl

from ddpd.kernels.rng import COUNTER_WORDS, below_one, load_counters, load_row_id, row_uniform


@triton.jit(do_not_specialize=COUNTER_WORDS)
def bernoulli_kernel(p_ptr, D, noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
                     z_ptr, BLOCK: tl.constexpr, FLOAT64: tl.constexpr):
    blocks = tl.cdiv(D, BLOCK)
    row = tl.program_id(0).to(tl.int64) // blocks
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    row_id = load_row_id(row_ids_ptr, row)
    cols = (tl.program_id(0).to(tl.int64) % blocks) * BLOCK + tl.arange(0, BLOCK)
    live = cols < D
    u = row_uniform(noise_ptr, D, row, tl.where(live, cols, 0), row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                    noise_ptr is not None)
    u = below_one(u)
    p = tl.load(p_ptr + row * D + cols, mask=live, other=0.0)
    if FLOAT64:
        z = u.to(tl.float64) < p
    else:
        z = u < p.to(tl.float32)
    tl.store(z_ptr + row * D + cols, z, mask=live)
