"""Triton kernels of ddpd.ops.sample_from_hidden: the output head as a GEMM on the
tensor cores with the two-level exact Gumbel-max of ddpd.kernels.sample_categorical
as its epilogue; the [N, V] logits never exist.

- head_tiles_kernel, grid (row blocks, vocabulary splits): each tile's logits by tl.dot
  (float32 operands as three TF32 products), and in the epilogue the tile statistics of
  sample_categorical; with a single tile it draws the token itself (one launch);
- finish_kernel, one program a row: the tile race, then the winning tile's logits
  computed again and the token drawn there from the same stream columns;
- head_logits_kernel: the float32 logits themselves, for the truncating calls.

docs/kernels.md ("sample_from_hidden") has the method and the launch choices."""
import triton
import triton.language as tl

from ddpd.kernels.rng import COUNTER_WORDS, gumbel, load_counters, load_row_id, row_uniform
from ddpd.kernels.sample_categorical import (
    RECORD,
    TILE_ENT,
    TILE_MASS,
    TILE_MAX,
    TILE_SECOND,
    race,
    row_maximum,
    row_summary,
    row_temperature,
    shift,
    store_outputs,
    tile_draw,
    tile_statistics,
)


@triton.jit
def head_logits(h_ptr, w_ptr, b_ptr, rows, cols, N, V, H, BLOCK_H: tl.constexpr, DOT_F32: tl.constexpr):
    """float32 logits [len(cols), len(rows)] = weight[cols] @ hidden[rows]^T + bias[cols]."""
    acc = tl.zeros((cols.shape[0], rows.shape[0]), dtype=tl.float32)
    # Row starts in int64: V * H and N * H may pass 2**31 (a 256k vocabulary at H = 8192).
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * H
    h_rows = h_ptr + rows.to(tl.int64)[None, :] * H
    for h0 in range(0, H, BLOCK_H):
        k = h0 + tl.arange(0, BLOCK_H)
        w = tl.load(w_rows + k[None, :], mask=(cols[:, None] < V) & (k[None, :] < H), other=0.0)
        h = tl.load(h_rows + k[:, None], mask=(rows[None, :] < N) & (k[:, None] < H), other=0.0)
        if DOT_F32:  # float32 operands, or the interpreter (no bf16 arithmetic there; it ignores tf32x3)
            acc += tl.dot(w.to(tl.float32), h.to(tl.float32), input_precision="tf32x3")
        else:
            acc += tl.dot(w, h.to(w.dtype))
    if b_ptr is not None:
        acc += tl.load(b_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)[:, None]
    return acc


@triton.jit
def masked_head_logits(x, cols, rows_in_block, V, exclude_ptr, n_exclude, exclude_row, allowed_ptr):
    """x [TILE, BLOCK_N] with NaN, excluded, not allowed and out-of-vocabulary tokens at -inf."""
    x = tl.where(x != x, float("-inf"), x)
    for e in range(n_exclude):
        x = tl.where(cols[:, None] == tl.load(exclude_ptr + e), float("-inf"), x)
    x = tl.where((cols[:, None] == exclude_row[None, :]) | (cols[:, None] >= V), float("-inf"), x)
    if allowed_ptr is not None:
        ok = tl.load(allowed_ptr + rows_in_block[None, :] * V + cols[:, None], mask=cols[:, None] < V, other=0)
        x = tl.where(ok.to(tl.int1), x, float("-inf"))
    return x


@triton.jit(do_not_specialize=COUNTER_WORDS)
def head_tiles_kernel(
    h_ptr, w_ptr, b_ptr, N, V, H, n_tiles, tiles_per_split, temperature, temperature_ptr,
    exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
    stats_ptr, tokens_ptr, valid_ptr, logprob_ptr, confidence_ptr,
    TILE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, DOT_F32: tl.constexpr,
    SINGLE_TILE: tl.constexpr, LOGPROB: tl.constexpr, CONFIDENCE: tl.constexpr, UNIT: tl.constexpr = False,
):
    """UNIT: every row's temperature is 1 (no division in the epilogue)."""
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live_row = rows < N
    safe_rows = tl.where(live_row, rows, 0).to(tl.int64)
    row_id = load_row_id(row_ids_ptr, safe_rows)
    if exclude_row_ptr is not None:
        exclude_row = tl.load(exclude_row_ptr + safe_rows)
    else:
        exclude_row = tl.full((BLOCK_N,), -1, tl.int64)
    if temperature_ptr is not None:
        given = tl.load(temperature_ptr + safe_rows)
    else:
        given = tl.full((BLOCK_N,), tl.cast(temperature, tl.float32), tl.float32)
    greedy = given < 0
    t = tl.where(greedy, 1.0, given)
    j = tl.arange(0, TILE)
    first = tl.program_id(1) * tiles_per_split
    for tile in range(first, tl.minimum(first + tiles_per_split, n_tiles)):
        cols = tile * TILE + j
        x = head_logits(h_ptr, w_ptr, b_ptr, rows, cols, N, V, H, BLOCK_H, DOT_F32)
        x = masked_head_logits(x, cols, safe_rows, V, exclude_ptr, n_exclude, exclude_row, allowed_ptr)
        # statistics per row: tile_statistics works along axis 1, so on x^T [BLOCK_N, TILE]
        if SINGLE_TILE:  # the tile wins whenever anything is drawable: no finish pass
            m, s, second, ent = tile_statistics(tl.trans(x), t[:, None], CONFIDENCE == 2, CONFIDENCE == 3,
                                                UNIT=UNIT)
            y = shift(x, m[None, :], t[None, :], UNIT)  # the token: a Philox draw a logit
            u_tok = row_uniform(noise_ptr, V + n_tiles, safe_rows[None, :], tl.where(cols < V, cols, 0)[:, None],
                                row_id[None, :], seed_lo, seed_hi, offset_lo, offset_hi, noise_ptr is not None)
            keys = tl.where(greedy[None, :], y, y + gumbel(u_tok))
            keys = tl.where(cols[:, None] < V, keys, float("-inf"))
            best = tl.max(keys, axis=0)
            token = tl.min(tl.where(keys == best[None, :], cols[:, None], V), axis=0)
            if LOGPROB or CONFIDENCE != 0:  # the token's own logit, for its probability
                token_logit = tl.max(tl.where(cols[:, None] == token[None, :], x, float("-inf")), axis=0)
            else:
                token_logit = m
            valid = m > float("-inf")
            tl.store(tokens_ptr + safe_rows, tl.where(valid, token, 0).to(tl.int64), mask=live_row)
            tl.store(valid_ptr + safe_rows, valid, mask=live_row)
            store_outputs(safe_rows, valid, token_logit, m, t, s, second, ent * tl.exp(-s) - s, logprob_ptr,
                          confidence_ptr, LOGPROB, CONFIDENCE, live_row)
        else:
            # statistics alone, with the tile statistics kernel's fewer instructions a logit
            # (STREAM, and no division at temperature 1); finish_kernel draws the token
            if UNIT or tl.min(t, axis=0) > 0.0:
                m, s, second, ent = tile_statistics(tl.trans(x), t[:, None], CONFIDENCE == 2, CONFIDENCE == 3,
                                                    UNIT=UNIT, STREAM=True)
            else:  # a temperature below float32's range, 0 here: STREAM's (x - m) / T is 0 / 0 at m
                m, s, second, ent = tile_statistics(tl.trans(x), t[:, None], CONFIDENCE == 2, CONFIDENCE == 3)
            record = stats_ptr + (safe_rows * n_tiles + tile) * RECORD
            tl.store(record + TILE_MAX, m, mask=live_row)
            tl.store(record + TILE_MASS, s, mask=live_row)
            if CONFIDENCE == 2:
                tl.store(record + TILE_SECOND, second, mask=live_row)
            if CONFIDENCE == 3:
                tl.store(record + TILE_ENT, ent, mask=live_row)


@triton.jit
def winning_tile_draw(h_ptr, w_ptr, b_ptr, row, tile, V, H, n_tiles, t, greedy, exclude_ptr, n_exclude,
                      exclude_row_ptr, allowed_ptr, noise_ptr, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                      TILE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, DOT_F32: tl.constexpr):
    """The token drawn inside the row's winning tile from that tile's logits,
    computed again (one tile of W, TILE x H, against the row's hidden state), and those
    logits. The GEMM's product of BLOCK_N rows with only this row loaded (a dot wants at
    least 16): the logits of the same tl.dot as the tile statistics'."""
    cols = tile * TILE + tl.arange(0, TILE)
    rows = row + tl.arange(0, BLOCK_N)
    x = head_logits(h_ptr, w_ptr, b_ptr, rows, cols, row + 1, V, H, BLOCK_H, DOT_F32)  # rows past `row` read as 0
    this_row = row + tl.zeros((BLOCK_N,), tl.int64)  # every column masked as the row (none read past it)
    if exclude_row_ptr is not None:
        exclude_row = tl.load(exclude_row_ptr + this_row)
    else:
        exclude_row = tl.full((BLOCK_N,), -1, tl.int64)
    x = masked_head_logits(x, cols, this_row, V, exclude_ptr, n_exclude, exclude_row, allowed_ptr)
    x = tl.max(tl.where(rows[None, :] == row, x, float("-inf")), axis=1)  # the row's column
    token, _ = tile_draw(x, cols, V, n_tiles, t, greedy, noise_ptr, row, row_id, seed_lo, seed_hi, offset_lo,
                         offset_hi)
    return token, x


@triton.jit(do_not_specialize=COUNTER_WORDS)
def finish_kernel(
    h_ptr, w_ptr, b_ptr, H, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr,
    n_tiles, V, temperature, temperature_ptr, noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi,
    seed_ptr, offset_ptr, stats_ptr, tokens_ptr, valid_ptr, logprob_ptr, confidence_ptr,
    BLOCK_T: tl.constexpr, LOGPROB: tl.constexpr, CONFIDENCE: tl.constexpr, TILE: tl.constexpr = 256,
    BLOCK_N: tl.constexpr = 16, BLOCK_H: tl.constexpr = 64, DOT_F32: tl.constexpr = False,
):
    row = tl.program_id(0).to(tl.int64)
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    row_id = load_row_id(row_ids_ptr, row)
    greedy, t = row_temperature(temperature, temperature_ptr, row)
    tile, row_max = race(row, n_tiles, V, t, greedy, stats_ptr, noise_ptr, row_id, seed_lo, seed_hi, offset_lo,
                         offset_hi, BLOCK_T, RECORD)
    valid = row_max > float("-inf")
    winner = stats_ptr + (row * n_tiles + tile) * RECORD
    token, x = winning_tile_draw(h_ptr, w_ptr, b_ptr, row, tile, V, H, n_tiles, t, greedy, exclude_ptr, n_exclude,
                                 exclude_row_ptr, allowed_ptr, noise_ptr, row_id, seed_lo, seed_hi, offset_lo,
                                 offset_hi, TILE, BLOCK_N, BLOCK_H, DOT_F32)
    # An invalid row draws token 0.
    tl.store(tokens_ptr + row, tl.where(valid, token, 0).to(tl.int64))
    tl.store(valid_ptr + row, valid)
    if LOGPROB or CONFIDENCE != 0:
        # The winning tile's statistics from the recomputed logits, as the C++ path: the two
        # products may round a logit differently in the last bit, which divided by a small
        # temperature would put the log-probability far from the truth, even above 0.
        cols = tile * TILE + tl.arange(0, TILE)
        token_logit = tl.max(tl.where(cols == token, x, float("-inf")), axis=0)
        m, s, second, ent = tile_statistics(x[None, :], t, CONFIDENCE == 2, CONFIDENCE == 3)
        tl.store(winner + TILE_MAX, tl.max(m, axis=0))
        tl.store(winner + TILE_MASS, tl.max(s, axis=0))
        if CONFIDENCE == 2:
            tl.store(winner + TILE_SECOND, tl.max(second, axis=0))
        if CONFIDENCE == 3:
            tl.store(winner + TILE_ENT, tl.max(ent, axis=0))
        tl.debug_barrier()  # the record written, for every thread's reads below
        row_max = row_maximum(row, n_tiles, stats_ptr, BLOCK_T, RECORD)
        log_z, second, neg_entropy = row_summary(row, n_tiles, row_max, t, stats_ptr, CONFIDENCE == 2,
                                                 CONFIDENCE == 3, BLOCK_T, RECORD)
        store_outputs(row, valid, token_logit, row_max, t, log_z, second, neg_entropy, logprob_ptr, confidence_ptr,
                      LOGPROB, CONFIDENCE)


@triton.jit
def head_logits_kernel(h_ptr, w_ptr, b_ptr, N, V, H, out_ptr, TILE: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_H: tl.constexpr, DOT_F32: tl.constexpr):
    # one grid axis over (row block, tile) pairs, row blocks fastest (side by side on a W
    # tile): a second axis would be capped at 65535 tiles (V of 16.7M)
    row_blocks = tl.cdiv(N, BLOCK_N)
    rows = (tl.program_id(0) % row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (tl.program_id(0) // row_blocks) * TILE + tl.arange(0, TILE)
    x = head_logits(h_ptr, w_ptr, b_ptr, rows, cols, N, V, H, BLOCK_H, DOT_F32)
    inside = (rows[None, :] < N) & (cols[:, None] < V)
    tl.store(out_ptr + rows[None, :].to(tl.int64) * V + cols[:, None], x, mask=inside)
