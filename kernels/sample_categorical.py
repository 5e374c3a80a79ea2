"""Triton kernel of ddpd.ops.sample_categorical: two-level exact Gumbel-max.

Uniforms: column j drives token j, column V + t drives tile t.
One program per row. Phase 1 streams the row in chunks of TILES_PER_CHUNK tiles
of TILE tokens, computes each tile's log-sum-exp and keeps the running winner of
argmax_t (lse_t + G_t). Phase 2 re-reads the winning tile and draws
argmax_j (l_j + G_j) inside it. P(j) = softmax(l)_j; no probabilities are stored.
All arithmetic is float32 (inputs are cast on load).
"""
import triton
import triton.language as tl

from ddpd.kernels.philox import gumbel, row_uniform


@triton.jit
def tempered_logits(logits_ptr, row, offs, V, temperature, exclude_ptr, n_exclude, exclude_row_ptr,
                    HAS_EXCLUDE_ROW: tl.constexpr):
    """float32 logits / temperature at offs, -inf beyond V, for NaN and excluded tokens."""
    x = tl.load(logits_ptr + row * V + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    x = x / temperature
    x = tl.where(x != x, float("-inf"), x)
    for e in range(n_exclude):
        x = tl.where(offs == tl.load(exclude_ptr + e), float("-inf"), x)
    if HAS_EXCLUDE_ROW:
        x = tl.where(offs == tl.load(exclude_row_ptr + row), float("-inf"), x)
    return x


@triton.jit
def tile_logsumexp(x):
    """log-sum-exp along axis 1; -inf for an all -inf tile, +inf if one is +inf."""
    m = tl.max(x, axis=1)
    shift = tl.where(tl.abs(m) < float("inf"), m, 0.0)  # no inf - inf
    return shift + tl.log(tl.sum(tl.exp(x - shift[:, None]), axis=1))


@triton.jit
def sample_categorical_kernel(
    logits_ptr, V, n_tiles, temperature,
    exclude_ptr, n_exclude, exclude_row_ptr,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi,
    tokens_ptr, valid_ptr,
    TILE: tl.constexpr, BLOCK_J: tl.constexpr, TILES_PER_CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    HAS_NOISE: tl.constexpr = noise_ptr is not None
    HAS_EXCLUDE_ROW: tl.constexpr = exclude_row_ptr is not None
    if row_ids_ptr is not None:
        row_id = tl.load(row_ids_ptr + row)
    else:
        row_id = row
    noise_width = V + n_tiles
    j = tl.arange(0, BLOCK_J)
    tile_in_chunk = tl.arange(0, TILES_PER_CHUNK)

    best_key = tl.full([], float("-inf"), tl.float32)
    best_tile = tl.full([], 0, tl.int32)
    for chunk in range(0, tl.cdiv(n_tiles, TILES_PER_CHUNK)):
        tiles = chunk * TILES_PER_CHUNK + tile_in_chunk
        offs = tiles[:, None] * TILE + j[None, :]
        x = tempered_logits(logits_ptr, row, offs, V, temperature, exclude_ptr, n_exclude, exclude_row_ptr,
                            HAS_EXCLUDE_ROW)
        live = tiles < n_tiles
        tile = tl.where(live, tiles, 0)
        u = row_uniform(noise_ptr, noise_width, row, V + tile, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                        HAS_NOISE)
        key = tl.where(live, tile_logsumexp(x) + gumbel(u), float("-inf"))
        chunk_key = tl.max(key, axis=0)
        chunk_tile = tl.min(tl.where(key == chunk_key, tiles, n_tiles), axis=0)
        better = chunk_key > best_key  # strict: the lowest tile wins ties
        best_tile = tl.where(better, chunk_tile, best_tile)
        best_key = tl.where(better, chunk_key, best_key)

    offs = best_tile * TILE + j
    x = tempered_logits(logits_ptr, row, offs, V, temperature, exclude_ptr, n_exclude, exclude_row_ptr,
                        HAS_EXCLUDE_ROW)
    column = tl.where(offs < V, offs, 0)
    u = row_uniform(noise_ptr, noise_width, row, column, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                    HAS_NOISE)
    key = tl.where(offs < V, x + gumbel(u), float("-inf"))
    # An invalid row has tile 0 and only -inf keys: the first token, 0, is returned.
    token = tl.min(tl.where(key == tl.max(key, axis=0), offs, V), axis=0)
    tl.store(tokens_ptr + row, token.to(tl.int64))
    tl.store(valid_ptr + row, best_key > float("-inf"))
