"""Triton kernels of ddpd.ops.sample_from_hidden: the output head as a GEMM on the
tensor cores with the two-level exact Gumbel-max of ddpd.kernels.sample_categorical
as its epilogue; the [N, V] logits never exist.

- head_tiles_kernel, grid (row blocks, vocabulary splits): for each of its tiles,
  the logits x[j, n] of TILE tokens j for BLOCK_N rows n, as weight[tile, H] @
  hidden[rows, H]^T (+ bias) by tl.dot over BLOCK_H slices of H (bf16 / fp16
  operands with float32 accumulation; float32 operands in IEEE float32). The tile
  dimension is the dot's M (256, what the tensor cores want) and the rows its N,
  so a few rows still make a full-width product. Epilogue, per row: the tile
  maximum m_t, r_t = s_t + G_t (s_t = log sum_j exp y_j, y_j = shift(x_j, m_t)) and
  the tile's candidate token c_t = argmax_j y_j + G_j (column j's Gumbel variable).
  The race inside a tile does not depend on which tile wins, so every tile's winner
  is kept (three numbers) and the weight is read once.
  With a single tile (V <= TILE) it writes the tokens itself: one launch.
- finish_kernel, one program per row: M = max_t m_t, the winning tile argmax_t
  shift(m_t, M) + r_t (the first on ties), its candidate is the token.
The logits are those of the torch reference up to the order of the float32
additions; everything after them is ddpd.kernels.sample_categorical's arithmetic.
"""
import triton
import triton.language as tl

from ddpd.kernels.rng import gumbel, load_counters, row_uniform
from ddpd.kernels.sample_categorical import first_argmax, shift


@triton.jit
def head_logits(h_ptr, w_ptr, b_ptr, rows, cols, N, V, H, BLOCK_H: tl.constexpr, DOT_F32: tl.constexpr):
    """float32 logits [len(cols), len(rows)] = weight[cols] @ hidden[rows]^T + bias[cols]."""
    acc = tl.zeros((cols.shape[0], rows.shape[0]), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        k = h0 + tl.arange(0, BLOCK_H)
        w = tl.load(w_ptr + cols[:, None] * H + k[None, :], mask=(cols[:, None] < V) & (k[None, :] < H), other=0.0)
        h = tl.load(h_ptr + rows[None, :] * H + k[:, None], mask=(rows[None, :] < N) & (k[:, None] < H), other=0.0)
        if DOT_F32:  # float32 operands, or the interpreter (no bf16 arithmetic there)
            acc += tl.dot(w.to(tl.float32), h.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(w, h.to(w.dtype))
    if b_ptr is not None:
        acc += tl.load(b_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)[:, None]
    return acc


@triton.jit
def head_tiles_kernel(
    h_ptr, w_ptr, b_ptr, N, V, H, n_tiles, tiles_per_split, temperature,
    exclude_ptr, n_exclude, exclude_row_ptr,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
    tile_max_ptr, tile_key_ptr, candidate_ptr, tokens_ptr, valid_ptr,
    TILE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, DOT_F32: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
):
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live_row = rows < N
    safe_rows = tl.where(live_row, rows, 0).to(tl.int64)
    if row_ids_ptr is not None:
        row_id = tl.load(row_ids_ptr + safe_rows)
    else:
        row_id = safe_rows
    if exclude_row_ptr is not None:
        exclude_row = tl.load(exclude_row_ptr + safe_rows)
    else:
        exclude_row = tl.full((BLOCK_N,), -1, tl.int64)
    j = tl.arange(0, TILE)
    first = tl.program_id(1) * tiles_per_split
    for t in range(first, tl.minimum(first + tiles_per_split, n_tiles)):
        cols = t * TILE + j
        x = head_logits(h_ptr, w_ptr, b_ptr, rows, cols, N, V, H, BLOCK_H, DOT_F32)
        x = tl.where(x != x, float("-inf"), x)
        for e in range(n_exclude):
            x = tl.where(cols[:, None] == tl.load(exclude_ptr + e), float("-inf"), x)
        x = tl.where((cols[:, None] == exclude_row[None, :]) | (cols[:, None] >= V), float("-inf"), x)
        m = tl.max(x, axis=0)
        y = shift(x, m[None, :], temperature)
        s = tl.log(tl.sum(tl.exp(y), axis=0))
        u = row_uniform(noise_ptr, V + n_tiles, safe_rows, V + t, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                        noise_ptr is not None)
        u_tok = row_uniform(noise_ptr, V + n_tiles, safe_rows[None, :], tl.where(cols < V, cols, 0)[:, None],
                            row_id[None, :], seed_lo, seed_hi, offset_lo, offset_hi, noise_ptr is not None)
        keys = tl.where(cols[:, None] < V, y + gumbel(u_tok), float("-inf"))
        best = tl.max(keys, axis=0)
        candidate = tl.min(tl.where(keys == best[None, :], cols[:, None], V), axis=0)
        if SINGLE_TILE:  # the tile wins whenever anything is drawable: no finish pass
            valid = m > float("-inf")
            tl.store(tokens_ptr + safe_rows, tl.where(valid, candidate, 0).to(tl.int64), mask=live_row)
            tl.store(valid_ptr + safe_rows, valid, mask=live_row)
        else:
            at = safe_rows * n_tiles + t
            tl.store(tile_max_ptr + at, m, mask=live_row)
            tl.store(tile_key_ptr + at, s + gumbel(u), mask=live_row)
            tl.store(candidate_ptr + at, candidate, mask=live_row)


@triton.jit
def finish_kernel(
    n_tiles, temperature, tile_max_ptr, tile_key_ptr, candidate_ptr, tokens_ptr, valid_ptr,
    BLOCK_T: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
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
    valid = row_max > float("-inf")
    token = tl.load(candidate_ptr + row * n_tiles + tile)
    # An invalid row draws token 0.
    tl.store(tokens_ptr + row, tl.where(valid, token, 0).to(tl.int64))
    tl.store(valid_ptr + row, valid)
