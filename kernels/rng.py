"""Counter-based uniforms inside Triton kernels, bit-identical to ddpd.ops.rng (and to
csrc/rng.h).

Philox4x32-10 with key (seed_lo, seed_hi) and counter (column, row_lo, offset_lo,
offset_hi); the first output word w becomes u = ((w >> 8) + 0.5) * 2**-24, a float32
in (0, 1] (float32 rounds the top value to 1.0; `gumbel` clamps it). Row ids are
64-bit: a row at or above 2**32 draws under a key derived from (seed, row >> 32),
as ddpd.ops.rng documents. The seed and the offset come as 32-bit words, or from
int64 tensors (load_counters). Written out with tl.umulhi rather than tl.philox so the
constants and the counter layout are those of the shared contract, whatever the
installed Triton does.
"""
import triton
import triton.language as tl

# The words of the seeds and offsets, whatever their values, reach a kernel as int32
# arguments (ddpd.ops.rng.split32) that Triton must not specialise on (a value of 1 or a
# multiple of 16 would otherwise compile a variant of the kernel on first sight: a fresh
# compile in the middle of a sampling run, where the offsets change every step).
COUNTER_WORDS = ["seed_lo", "seed_hi", "offset_lo", "offset_hi", "mask_offset_lo", "mask_offset_hi"]


@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 words of a common shape (keys may be scalars)."""
    for _ in tl.static_range(10):
        a0 = c0
        a2 = c2
        c0 = tl.umulhi(a2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = tl.umulhi(a0, 0xD2511F53) ^ c3 ^ k1
        c1 = a2 * 0xCD9E8D57
        c3 = a0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def row_key(seed_lo, seed_hi, row):
    """Key words of 64-bit row ids `row` (int64, scalar or tensor): the seed below
    2**32, else the first two words of Philox(counter (row_hi, ~0, ~0, ~0), key seed)."""
    row_hi = tl.cast(row >> 32, tl.uint32)
    ones = row_hi * 0 + 0xFFFFFFFF
    k0 = row_hi * 0 + tl.cast(seed_lo, tl.uint32)
    k1 = row_hi * 0 + tl.cast(seed_hi, tl.uint32)
    d0, d1, _, _ = philox4x32(row_hi, ones, ones, ones, k0, k1)
    return tl.where(row_hi != 0, d0, k0), tl.where(row_hi != 0, d1, k1)


@triton.jit
def philox_uniform(seed_lo, seed_hi, offset_lo, offset_hi, row, col):
    """Uniforms for the broadcast of `row` (int64 row ids) and `col` (integer tensors
    or scalars). The row key is derived on row's own shape: one extra Philox per row,
    not per column."""
    k0, k1 = row_key(seed_lo, seed_hi, row)
    # tl.cast also accepts scalars that Triton specialised to constants.
    c0 = tl.cast(col, tl.uint32)
    c1 = tl.cast(row, tl.uint32) + c0 * 0  # broadcast every word to the common shape
    c0 = c0 + c1 * 0
    c2 = c0 * 0 + tl.cast(offset_lo, tl.uint32)
    c3 = c0 * 0 + tl.cast(offset_hi, tl.uint32)
    w, _, _, _ = philox4x32(c0, c1, c2, c3, k0, k1)
    return ((w >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08


@triton.jit
def load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr):
    """The 32-bit words of the seed and the offset: the values passed, or, where a
    pointer is given, the int64 read from it (a tensor seed or offset: a CUDA graph
    replays with whatever value the tensor holds then)."""
    if seed_ptr is not None:
        seed = tl.load(seed_ptr)
        seed_lo = seed & 0xFFFFFFFF
        seed_hi = (seed >> 32) & 0xFFFFFFFF
    if offset_ptr is not None:
        offset = tl.load(offset_ptr)
        offset_lo = offset & 0xFFFFFFFF
        offset_hi = (offset >> 32) & 0xFFFFFFFF
    return seed_lo, seed_hi, offset_lo, offset_hi


@triton.jit
def load_row_id(row_ids_ptr, row):
    """The Philox row of `row` (a program's row or a block of rows): row_ids[row] where
    the caller gave row ids, else the row itself."""
    row_id = row
    if row_ids_ptr is not None:
        row_id = tl.load(row_ids_ptr + row)
    return row_id


@triton.jit
def row_uniform(noise_ptr, noise_width, row, column, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                HAS_NOISE: tl.constexpr):
    """Uniform at `column` of a row: explicit noise [rows, noise_width], or Philox."""
    if HAS_NOISE:
        u = tl.load(noise_ptr + row * noise_width + column)
    else:
        u = philox_uniform(seed_lo, seed_hi, offset_lo, offset_hi, row_id, column)
    return u


@triton.jit
def below_one(u):
    """min(u, BELOW_ONE): float32 rounds the top uniform to 1.0, where u < p would miss p = 1."""
    return tl.minimum(u, 0.99999994)


@triton.jit
def gumbel(u):
    """Standard Gumbel noise -log(-log u). float32 rounds the top uniform to 1.0,
    which would give +inf: clamp to the largest float32 below 1, as the references do."""
    return -tl.log(-tl.log(below_one(u)))


@triton.jit(do_not_specialize=COUNTER_WORDS)
def philox_uniform_kernel(rows_ptr, cols_ptr, n_cols, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
                          out_ptr, BLOCK: tl.constexpr):
    """out[r, j] = the uniform of (seed, offset, rows[r], cols[j]): ddpd.ops.rng.philox_uniform
    on CUDA. One program per BLOCK columns of a row, on one grid axis, column blocks fastest."""
    blocks = tl.cdiv(n_cols, BLOCK)
    row = tl.program_id(0).to(tl.int64) // blocks
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    index = (tl.program_id(0).to(tl.int64) % blocks) * BLOCK + tl.arange(0, BLOCK)
    live = index < n_cols
    cols = tl.load(cols_ptr + index, mask=live, other=0)
    u = philox_uniform(seed_lo, seed_hi, offset_lo, offset_hi, tl.load(rows_ptr + row), cols)
    tl.store(out_ptr + row * n_cols + index, u, mask=live)
