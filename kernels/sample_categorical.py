"""Triton kernels of ddpd.ops.sample_categorical: the two-level exact Gumbel-max,
with each row's vocabulary split over several programs.

With l the logits (NaN and excluded tokens at -inf), m_t the maximum of tile t
(TILE tokens), M = max_t m_t and shift(a, b) = (a - b) / T (0 where a == b, -inf
where a is -inf):
- tile_stats_kernel, grid (rows, splits): each program takes a run of tiles and
  writes, per tile, m_t and r_t = s_t + G_t, where s_t = log sum_j exp(y_j),
  y_j = shift(l_j, m_t), and G_t the Gumbel variable of column V + t;
- finish_kernel, one program per row: M, the winning tile argmax_t shift(m_t, M)
  + r_t (first on ties), then the token argmax_j y_j + G_j inside it (column j).
  With a single tile (V <= TILE) it does everything itself, one launch.
Only the winning tile's TILE logits are read twice; no probabilities are stored.
float32 arithmetic only (inputs cast on load); the temperature division is IEEE
(div_rn), as in the torch reference and the C++ kernel.
"""
import triton
import triton.language as tl

from ddpd.kernels.rng import gumbel, load_counters, row_uniform


@triton.jit
def masked_logits(logits_ptr, row, offs, V, exclude_ptr, n_exclude, exclude_row_ptr,
                  HAS_EXCLUDE_ROW: tl.constexpr):
    """float32 logits at offs, -inf beyond V, for NaN and for excluded tokens."""
    x = tl.load(logits_ptr + row * V + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)
    for e in range(n_exclude):
        x = tl.where(offs == tl.load(exclude_ptr + e), float("-inf"), x)
    if HAS_EXCLUDE_ROW:
        x = tl.where(offs == tl.load(exclude_row_ptr + row), float("-inf"), x)
    return x


@triton.jit
def shift(a, b, temperature):
    """(a - b) / temperature for a <= b: 0 where a == b (+inf too), -inf where a is -inf."""
    zero = tl.zeros_like(a)  # div_rn takes operands of one shape; 0 * a would be NaN at inf
    b = b + zero
    d = tl.where(a == b, 0.0, tl.math.div_rn(a - b, temperature + zero))
    return tl.where(a == float("-inf"), float("-inf"), d)


@triton.jit
def tile_mass(y):
    """s = log sum exp(y) along axis 1 (y <= 0 with a 0 in every non-empty tile)."""
    return tl.log(tl.sum(tl.exp(y), axis=1))


@triton.jit
def first_argmax(keys, index, sentinel):
    """The index of the first maximum of keys (1-D), and that maximum."""
    best = tl.max(keys, axis=0)
    return tl.min(tl.where(keys == best, index, sentinel), axis=0), best


@triton.jit
def tile_stats_kernel(
    logits_ptr, V, n_tiles, tiles_per_split, temperature,
    exclude_ptr, n_exclude, exclude_row_ptr,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
    tile_max_ptr, tile_key_ptr,
    TILE: tl.constexpr, TILES_PER_CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    split = tl.program_id(1)
    if row_ids_ptr is not None:
        row_id = tl.load(row_ids_ptr + row)
    else:
        row_id = row
    j = tl.arange(0, TILE)
    first = split * tiles_per_split
    end = tl.minimum(first + tiles_per_split, n_tiles)
    for chunk in range(first, end, TILES_PER_CHUNK):
        tiles = chunk + tl.arange(0, TILES_PER_CHUNK)
        live = tiles < end
        offs = tiles[:, None] * TILE + j[None, :]
        x = masked_logits(logits_ptr, row, tl.where(live[:, None], offs, V), V, exclude_ptr, n_exclude,
                          exclude_row_ptr, exclude_row_ptr is not None)
        m = tl.max(x, axis=1)
        s = tile_mass(shift(x, m[:, None], temperature))
        u = row_uniform(noise_ptr, V + n_tiles, row, V + tl.where(live, tiles, 0), row_id, seed_lo, seed_hi,
                        offset_lo, offset_hi, noise_ptr is not None)
        tl.store(tile_max_ptr + row * n_tiles + tiles, m, mask=live)
        tl.store(tile_key_ptr + row * n_tiles + tiles, s + gumbel(u), mask=live)


@triton.jit
def finish_kernel(
    logits_ptr, V, n_tiles, temperature,
    exclude_ptr, n_exclude, exclude_row_ptr,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
    tile_max_ptr, tile_key_ptr, tokens_ptr, valid_ptr,
    TILE: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_T: tl.constexpr, SINGLE_TILE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    if row_ids_ptr is not None:
        row_id = tl.load(row_ids_ptr + row)
    else:
        row_id = row
    if SINGLE_TILE:
        tile = 0
    else:
        t = tl.arange(0, BLOCK_T)
        row_max = tl.full([], float("-inf"), tl.float32)
        for t0 in range(0, n_tiles, BLOCK_T):
            m = tl.load(tile_max_ptr + row * n_tiles + t0 + t, mask=t0 + t < n_tiles, other=float("-inf"))
            row_max = tl.maximum(row_max, tl.max(m, axis=0))
        best_key = tl.full([], float("-inf"), tl.float32)
        tile = tl.full([], 0, tl.int32)
        for t0 in range(0, n_tiles, BLOCK_T):
            live = t0 + t < n_tiles
            m = tl.load(tile_max_ptr + row * n_tiles + t0 + t, mask=live, other=float("-inf"))
            r = tl.load(tile_key_ptr + row * n_tiles + t0 + t, mask=live, other=0.0)
            key = tl.where(live, shift(m, row_max, temperature) + r, float("-inf"))
            chunk_tile, chunk_key = first_argmax(key, t0 + t, n_tiles)
            better = chunk_key > best_key  # strict: the lowest tile wins ties
            tile = tl.where(better, chunk_tile, tile)
            best_key = tl.where(better, chunk_key, best_key)

    offs = tile * TILE + tl.arange(0, BLOCK_J)
    x = masked_logits(logits_ptr, row, offs, V, exclude_ptr, n_exclude, exclude_row_ptr,
                      exclude_row_ptr is not None)
    tile_max = tl.max(x, axis=0)
    y = shift(x, tile_max, temperature)
    column = tl.where(offs < V, offs, 0)
    u = row_uniform(noise_ptr, V + n_tiles, row, column, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                    noise_ptr is not None)
    keys = tl.where(offs < V, y + gumbel(u), float("-inf"))
    token, _ = first_argmax(keys, offs, V)
    if SINGLE_TILE:
        valid = tile_max > float("-inf")
    else:
        valid = row_max > float("-inf")
    # An invalid row draws token 0.
    tl.store(tokens_ptr + row, tl.where(valid, token, 0).to(tl.int64))
    tl.store(valid_ptr + row, valid)
