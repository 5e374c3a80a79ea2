"""Triton kernels of ddpd.ops.sample_from_hidden: the output head fused with the
two-level exact Gumbel-max of ddpd.kernels.sample_categorical.

Phase 1 (grid: row blocks x vocabulary splits): each program computes the logits
of its tiles, TILE tokens at a time, as hidden[BLOCK_N, H] @ weight[tile, H]^T
(+ bias), reduces each tile to its log-sum-exp and keeps, per row, the winner of
argmax_t (lse_t + G_t) over its tiles. Phase 2 (one program per row): the winner
over splits, then the winning tile's logits are recomputed and the token drawn
by argmax_j (l_j + G_j) inside it. The [N, V] logits never exist. Uniforms:
column j drives token j, column V + t drives tile t. float32 arithmetic only
(inputs cast on load, IEEE products, no TF32).
"""
import triton
import triton.language as tl

from ddpd.kernels.philox import gumbel, row_uniform


@triton.jit
def head_logits_block(h_ptr, w_ptr, b_ptr, rows, cols, N, V, H, BLOCK_H: tl.constexpr):
    """float32 logits [len(rows), len(cols)] of hidden @ weight^T + bias; -inf outside."""
    acc = tl.zeros((rows.shape[0], cols.shape[0]), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        k = h0 + tl.arange(0, BLOCK_H)
        h = tl.load(h_ptr + rows[:, None] * H + k[None, :], mask=(rows[:, None] < N) & (k[None, :] < H),
                    other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols[None, :] * H + k[:, None], mask=(cols[None, :] < V) & (k[:, None] < H),
                    other=0.0).to(tl.float32)
        acc += tl.dot(h, w, input_precision="ieee")
    if b_ptr is not None:
        acc += tl.load(b_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)[None, :]
    return tl.where(cols[None, :] < V, acc, float("-inf"))


@triton.jit
def prepare_logits(x, cols, temperature, exclude_ptr, n_exclude, exclude_row):
    """Tempered logits with NaN and excluded tokens at -inf; exclude_row broadcasts
    against cols (one id per row, or a scalar), -1 for none."""
    x = x / temperature
    x = tl.where(x != x, float("-inf"), x)
    for e in range(n_exclude):
        x = tl.where(cols == tl.load(exclude_ptr + e), float("-inf"), x)
    return tl.where(cols == exclude_row, float("-inf"), x)


@triton.jit
def tile_race_kernel(
    h_ptr, w_ptr, b_ptr, N, V, H, n_tiles, tiles_per_split, temperature,
    exclude_ptr, n_exclude, exclude_row_ptr,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi,
    best_key_ptr, best_tile_ptr,
    TILE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
):
    block = tl.program_id(0)
    split = tl.program_id(1)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    live_row = rows < N
    safe_rows = tl.where(live_row, rows, 0).to(tl.int64)
    if row_ids_ptr is not None:
        row_id = tl.load(row_ids_ptr + safe_rows)
    else:
        row_id = safe_rows
    if exclude_row_ptr is not None:
        exclude_row = tl.load(exclude_row_ptr + safe_rows)[:, None]
    else:
        exclude_row = tl.full((BLOCK_N, 1), -1, tl.int64)
    j = tl.arange(0, TILE)
    best_key = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    best_tile = tl.full((BLOCK_N,), 0, tl.int32)
    first = split * tiles_per_split
    for t in range(first, tl.minimum(first + tiles_per_split, n_tiles)):
        cols = t * TILE + j
        x = head_logits_block(h_ptr, w_ptr, b_ptr, rows, cols, N, V, H, BLOCK_H)
        x = prepare_logits(x, cols[None, :], temperature, exclude_ptr, n_exclude, exclude_row)
        m = tl.max(x, axis=1)
        shift = tl.where(tl.abs(m) < float("inf"), m, 0.0)  # no inf - inf
        lse = shift + tl.log(tl.sum(tl.exp(x - shift[:, None]), axis=1))
        u = row_uniform(noise_ptr, V + n_tiles, safe_rows, V + t, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                        noise_ptr is not None)
        key = lse + gumbel(u)
        better = key > best_key  # strict: the lowest tile wins ties
        best_tile = tl.where(better, t, best_tile)
        best_key = tl.where(better, key, best_key)
    tl.store(best_key_ptr + split * N + rows, best_key, mask=live_row)
    tl.store(best_tile_ptr + split * N + rows, best_tile, mask=live_row)


@triton.jit
def draw_in_tile_kernel(
    h_ptr, w_ptr, b_ptr, N, V, H, n_tiles, n_splits, temperature,
    exclude_ptr, n_exclude, exclude_row_ptr,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi,
    best_key_ptr, best_tile_ptr, tokens_ptr, valid_ptr,
    TILE: tl.constexpr, BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    if row_ids_ptr is not None:
        row_id = tl.load(row_ids_ptr + row)
    else:
        row_id = row
    key = tl.full([], float("-inf"), tl.float32)
    tile = tl.full([], 0, tl.int32)
    for s in range(0, n_splits):  # splits hold increasing tiles: strict > keeps the lowest
        k = tl.load(best_key_ptr + s * N + row)
        better = k > key
        tile = tl.where(better, tl.load(best_tile_ptr + s * N + row), tile)
        key = tl.where(better, k, key)

    cols = tile * TILE + tl.arange(0, TILE)
    x = tl.zeros((TILE,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        k = h0 + tl.arange(0, BLOCK_H)
        h = tl.load(h_ptr + row * H + k, mask=k < H, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols[:, None] * H + k[None, :], mask=(cols[:, None] < V) & (k[None, :] < H),
                    other=0.0).to(tl.float32)
        x += tl.sum(w * h[None, :], axis=1)
    if b_ptr is not None:
        x += tl.load(b_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
    if exclude_row_ptr is not None:
        exclude_row = tl.load(exclude_row_ptr + row)
    else:
        exclude_row = -1
    x = prepare_logits(x, cols, temperature, exclude_ptr, n_exclude, exclude_row)
    column = tl.where(cols < V, cols, 0)
    u = row_uniform(noise_ptr, V + n_tiles, row, column, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                    noise_ptr is not None)
    keys = tl.where(cols < V, x + gumbel(u), float("-inf"))
    # An invalid row has tile 0 and only -inf keys: the first token, 0, is returned.
    token = tl.min(tl.where(keys == tl.max(keys, axis=0), cols, V), axis=0)
    tl.store(tokens_ptr + row, token.to(tl.int64))
    tl.store(valid_ptr + row, key > float("-inf"))
