"""Triton kernels of ddpd.ops.sample_categorical: the two-level exact Gumbel-max, with
each row's vocabulary split over several programs, the sampling controls and the
statistics behind the log-probability and confidence outputs.

- thresholds_kernel, one program a row, only for top-k / top-p / min-p: the row's
  truncation threshold, by a radix search over the order-preserving keys of the logits;
- tile_stats_kernel, grid (rows, splits): per tile of TILE logits, its maximum m_t and
  s_t = log sum_j exp(shift(l_j, m_t)), and on request the second largest value and a_t;
- finish_kernel, one program a row: the winning tile argmax_t shift(m_t, M) + s_t + G_t,
  the token argmax_j y_j + G_j inside it, and the log-probability and confidence.

float32 arithmetic only; a row's temperature T < 0 marks a greedy row. docs/kernels.md
("sample_categorical") has the method: the threshold search, the aligned windows."""
import triton
import triton.language as tl

from ddpd.kernels.rng import COUNTER_WORDS, gumbel, load_counters, load_row_id, row_uniform

N_BUCKETS = tl.constexpr(16)  # ranges per pass of the threshold search
N_CUTS = tl.constexpr(16)  # top-p's candidate cuts (top_p_cut)
# A tile's statistics are one record of float32 fields, at stats_ptr + (row * n_tiles +
# tile) * RECORD: one buffer and one pointer per call, whatever the fields asked for.
TILE_MAX, TILE_MASS, TILE_SECOND, TILE_ENT = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
RECORD = tl.constexpr(4)
LOG2E = tl.constexpr(1.4426950408889634)  # exp(y) = exp2(y log2(e)), as tl.exp computes it


@triton.jit
def masked_logits(logits_ptr, row, offs, V, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau):
    """float32 logits at offs, -inf at or beyond limit (at most V), for NaN, excluded and not
    allowed tokens, and below the row's threshold tau. (A limit rather than offsets moved
    out of range keeps the offsets provably contiguous: vector loads where rows are aligned.)"""
    x = tl.load(logits_ptr + row * V + offs, mask=offs < limit, other=float("-inf"))
    return mask_logits(x.to(tl.float32), row, offs, V, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr,
                       tau)


@triton.jit
def mask_logits(x, row, offs, V, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau):
    """float32 logits x of columns offs, -inf for NaN, excluded and not allowed tokens and
    below tau (allowed read where offs < limit, and at row * V + offs >= 0)."""
    for e in range(n_exclude):
        x = tl.where(offs == tl.load(exclude_ptr + e), float("-inf"), x)
    if exclude_row_ptr is not None:
        x = tl.where(offs == tl.load(exclude_row_ptr + row), float("-inf"), x)
    if allowed_ptr is not None:
        ok = tl.load(allowed_ptr + row * V + offs, mask=offs < limit, other=0).to(tl.int1)
        x = tl.where(ok, x, float("-inf"))
    # NaN >= tau is false: one comparison also sends NaN to -inf (tau is -inf without truncation)
    return tl.where(x >= tau, x, float("-inf"))


@triton.jit
def row_value(scalar, ptr, row):
    """A per-row control: ptr[row] where a per-row tensor is given, else the scalar."""
    if ptr is not None:
        value = tl.load(ptr + row)
    else:
        value = scalar
    return value


@triton.jit
def row_temperature(temperature, temperature_ptr, row):
    """(greedy, T) of a row: T < 0 marks a greedy row, whose statistics use T = 1. float32
    (a scalar below float32's range arrives as float64 and rounds to 0 here)."""
    given = tl.cast(row_value(temperature, temperature_ptr, row), tl.float32)
    greedy = given < 0
    return greedy, tl.where(greedy, 1.0, given)


@triton.jit
def row_threshold(tau_ptr, row):
    if tau_ptr is not None:
        tau = tl.load(tau_ptr + row)
    else:
        tau = float("-inf")
    return tau


@triton.jit
def shift(a, b, temperature, UNIT: tl.constexpr = False):
    """(a - b) / temperature for a <= b: 0 where a == b (+inf too), -inf where a is -inf.
    UNIT: the temperature is known to be 1, and the IEEE division by it, which is exact and
    costs a dozen instructions a value, is left out (the same values)."""
    zero = tl.zeros_like(a)  # div_rn takes operands of one shape; 0 * a would be NaN at inf
    b = b + zero
    if UNIT:
        d = tl.where(a == b, 0.0, a - b)
    else:
        d = tl.where(a == b, 0.0, tl.math.div_rn(a - b, temperature + zero))
    return tl.where(a == float("-inf"), float("-inf"), d)


@triton.jit
def first_argmax(keys, index, sentinel):
    """The index of the first maximum of keys (1-D), and that maximum."""
    best = tl.max(keys, axis=0)
    return tl.min(tl.where(keys == best, index, sentinel), axis=0), best


@triton.jit
def tile_statistics(x, temperature, SECOND: tl.constexpr, ENTROPY: tl.constexpr, UNIT: tl.constexpr = False,
                    STREAM: tl.constexpr = False):
    """Per tile (axis 1 of x [tiles, TILE]): m_t, s_t, and where asked the second largest
    value (with multiplicity) and a_t = sum exp(y) y; -inf tiles give m = s = -inf.
    UNIT: the temperature is 1 (see shift). STREAM: the tile statistics kernel's fewer
    instructions a value, which the head's epilogue does not take: there the branch, and
    exp2 alone too, made the wide head's GEMM spill more registers (Triton 3.9)."""
    m = tl.max(x, axis=1)
    if STREAM:
        if (tl.min(m, axis=0) > float("-inf")) & (tl.max(m, axis=0) < float("inf")):
            # every tile maximum finite (the usual case): shift(x, m) is (x - m) / T, whose
            # -inf and 0 come out of the arithmetic, without shift's comparisons and selects
            if UNIT:
                y = x - m[:, None]
            else:
                d = x - m[:, None]
                y = tl.math.div_rn(d, temperature + tl.zeros_like(d))
        else:
            y = shift(x, m[:, None], temperature, UNIT)
        # y <= 0: exp2 compiles to one ex2.approx.ftz, where tl.exp adds three instructions
        # to keep results below 2**-126, which cannot move a sum whose largest term is 1
        e = tl.math.exp2(y * LOG2E)
    else:
        y = shift(x, m[:, None], temperature, UNIT)
        e = tl.exp(y)
    s = tl.log(tl.sum(e, axis=1))
    if SECOND:
        at_max = tl.sum((x == m[:, None]).to(tl.int32), axis=1)
        below = tl.max(tl.where(x < m[:, None], x, float("-inf")), axis=1)
        second = tl.where(at_max > 1, m, below)
    else:
        second = m
    if ENTROPY:
        ent = tl.sum(tl.where(e > 0, e * y, 0.0), axis=1)
    else:
        ent = s
    return m, s, second, ent


@triton.jit
def tile_stats_kernel(
    logits_ptr, V, n_tiles, tiles_per_split, temperature, temperature_ptr,
    exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau_ptr,
    stats_ptr,
    TILE: tl.constexpr, TILES_PER_CHUNK: tl.constexpr, ALIGN: tl.constexpr, SECOND: tl.constexpr,
    ENTROPY: tl.constexpr, UNIT: tl.constexpr = False,
):
    """Reads each tile through aligned windows. A row of V = 50257 bfloat16 logits starts at
    any even byte, and loads at its columns take one value each (a load, a 64-bit address and
    a predicate a value). Window w of a row starts `skew` columns before tile w, at a multiple
    of ALIGN logits (16 bytes) from the tensor's start, and is read with 16-byte vector loads;
    its first skew values, the end of tile w - 1, are replaced by those of window w + 1 (whose
    first ALIGN values one more vector load reads): the tile's own values, rotated by skew."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    _, t = row_temperature(temperature, temperature_ptr, row)
    tau = row_threshold(tau_ptr, row)
    start = row * V
    skew = (start % ALIGN).to(tl.int32)
    base = logits_ptr + tl.multiple_of(start - skew, ALIGN)  # start - skew >= 0: skew is 0 on row 0
    j = tl.arange(0, TILE)
    own = j >= skew  # from window w; the others from window w + 1
    rotated = tl.where(own, j - skew, j + TILE - skew)  # the column in the tile of each value
    first = split * tiles_per_split
    end = tl.minimum(first + tiles_per_split, n_tiles)
    limit = tl.minimum(V, end * TILE)
    masks = n_exclude > 0
    if (exclude_row_ptr is not None) or (allowed_ptr is not None):
        masks = True
    for chunk in range(first, end, TILES_PER_CHUNK):
        tiles = chunk + tl.arange(0, TILES_PER_CHUNK)
        live = tiles < end
        window = tiles[:, None] * TILE + j[None, :]  # from base: multiples of ALIGN, contiguous
        if tl.minimum(end, chunk + TILES_PER_CHUNK) * TILE + ALIGN <= V:
            # the windows of the live tiles, and the first ALIGN values of the next ones, lie in
            # the row: masks constant over each 16 bytes (tiles past the split's end read nothing,
            # and as 0 keep the chunk's maxima finite; their statistics are not stored)
            x = tl.load(base + window, mask=live[:, None], other=0.0)
            after = tl.load(base + window + TILE, mask=live[:, None] & (j[None, :] < ALIGN), other=0.0)
            x = tl.where(own[None, :], x, after)
        else:  # the row's last tiles: each value on its own, at its column
            cols = tiles[:, None] * TILE + rotated[None, :]
            x = tl.load(logits_ptr + start + cols, mask=cols < limit, other=float("-inf"))
        x = x.to(tl.float32)
        if masks:  # the columns, only then: 16 more registers a lane otherwise
            x = mask_logits(x, row, tiles[:, None] * TILE + rotated[None, :], V, limit, exclude_ptr, n_exclude,
                            exclude_row_ptr, allowed_ptr, tau)
        else:
            x = tl.where(x >= tau, x, float("-inf"))  # NaN too (mask_logits)
        if UNIT or t == 1.0:  # no division (UNIT: compiled without it; else a branch per program)
            m, s, second, ent = tile_statistics(x, t, SECOND, ENTROPY, UNIT=True, STREAM=True)
        elif t > 0.0:
            m, s, second, ent = tile_statistics(x, t, SECOND, ENTROPY, STREAM=True)
        else:  # a temperature below float32's range, 0 here: STREAM's (x - m) / T is 0 / 0 at m
            m, s, second, ent = tile_statistics(x, t, SECOND, ENTROPY)
        record = stats_ptr + (row * n_tiles + tiles) * RECORD
        tl.store(record + TILE_MAX, m, mask=live)
        tl.store(record + TILE_MASS, s, mask=live)
        if SECOND:
            tl.store(record + TILE_SECOND, second, mask=live)
        if ENTROPY:
            tl.store(record + TILE_ENT, ent, mask=live)


@triton.jit
def row_maximum(row, n_tiles, stats_ptr, BLOCK_T: tl.constexpr, RECORD_WIDTH: tl.constexpr):
    """M = max_t m_t over the stored statistics (records of RECORD_WIDTH fields)."""
    ts = tl.arange(0, BLOCK_T)
    row_max = tl.full([], float("-inf"), tl.float32)
    for t0 in range(0, n_tiles, BLOCK_T):
        record = stats_ptr + (row * n_tiles + t0 + ts) * RECORD_WIDTH
        m = tl.load(record + TILE_MAX, mask=t0 + ts < n_tiles, other=float("-inf"))
        row_max = tl.maximum(row_max, tl.max(m, axis=0))
    return row_max


@triton.jit
def race(row, n_tiles, V, t, greedy, stats_ptr, noise_ptr, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
         BLOCK_T: tl.constexpr, RECORD_WIDTH: tl.constexpr):
    """The tile race over the stored statistics (records of RECORD_WIDTH fields):
    (winning tile, row maximum M)."""
    ts = tl.arange(0, BLOCK_T)
    row_max = row_maximum(row, n_tiles, stats_ptr, BLOCK_T, RECORD_WIDTH)
    best_key = tl.full([], float("-inf"), tl.float32)
    tile = tl.full([], 0, tl.int32)
    for t0 in range(0, n_tiles, BLOCK_T):
        live = t0 + ts < n_tiles
        record = stats_ptr + (row * n_tiles + t0 + ts) * RECORD_WIDTH
        m = tl.load(record + TILE_MAX, mask=live, other=float("-inf"))
        s = tl.load(record + TILE_MASS, mask=live, other=0.0)
        u = row_uniform(noise_ptr, V + n_tiles, row, V + tl.where(live, t0 + ts, 0), row_id, seed_lo, seed_hi,
                        offset_lo, offset_hi, noise_ptr is not None)
        d = shift(m, row_max, t)
        key = tl.where(greedy, d, d + (s + gumbel(u)))
        key = tl.where(live, key, float("-inf"))
        chunk_tile, chunk_key = first_argmax(key, t0 + ts, n_tiles)
        better = chunk_key > best_key  # strict: the lowest tile wins ties
        tile = tl.where(better, chunk_tile, tile)
        best_key = tl.where(better, chunk_key, best_key)
    return tile, row_max


@triton.jit
def row_summary(row, n_tiles, row_max, t, stats_ptr, SECOND: tl.constexpr, ENTROPY: tl.constexpr,
                BLOCK_T: tl.constexpr, RECORD_WIDTH: tl.constexpr):
    """From the tile statistics: log Z = log sum_t exp(d_t + s_t), d_t = shift(m_t, M);
    the second largest value of the row; sum_j p_j log p_j (ENTROPY)."""
    ts = tl.arange(0, BLOCK_T)
    z = tl.full([], 0.0, tl.float32)
    ey = tl.full([], 0.0, tl.float32)
    first = tl.full([], float("-inf"), tl.float32)
    second = tl.full([], float("-inf"), tl.float32)
    for t0 in range(0, n_tiles, BLOCK_T):
        live = t0 + ts < n_tiles
        record = stats_ptr + (row * n_tiles + t0 + ts) * RECORD_WIDTH
        m = tl.load(record + TILE_MAX, mask=live, other=float("-inf"))
        s = tl.load(record + TILE_MASS, mask=live, other=float("-inf"))
        d = shift(m, row_max, t)
        scale = tl.exp(d)
        mass = tl.exp(s)
        z += tl.sum(scale * mass, axis=0)
        if ENTROPY:
            a = tl.load(record + TILE_ENT, mask=live, other=0.0)
            ey += tl.sum(tl.where(scale > 0, scale * (a + d * mass), 0.0), axis=0)
        if SECOND:
            m2 = tl.load(record + TILE_SECOND, mask=live, other=float("-inf"))
            first, second = top_two(first, second, m, m2, t0 + ts, BLOCK_T)
    log_z = tl.log(z)
    return log_z, second, ey / z - log_z


@triton.jit
def top_two(first, second, m, m2, index, BLOCK_T: tl.constexpr):
    """The two largest values (with multiplicity) of {first, second} and the chunk's
    tile maxima m and second values m2."""
    c1, _ = first_argmax(m, index, 2**30)
    top = tl.max(m, axis=0)
    rest = tl.maximum(tl.max(tl.where(index == c1, float("-inf"), m), axis=0), tl.max(m2, axis=0))
    # merge (top, rest) with (first, second)
    new_first = tl.maximum(first, top)
    new_second = tl.maximum(tl.minimum(first, top), tl.maximum(second, rest))
    return new_first, new_second


@triton.jit
def confidence_of(CONFIDENCE: tl.constexpr, token_logit, row_max, t, log_z, second, neg_entropy):
    """1 prob of the drawn token, 2 margin p(top 1) - p(top 2), 3 sum p log p."""
    if CONFIDENCE == 1:
        c = tl.exp(shift(token_logit, row_max, t) - log_z)
    elif CONFIDENCE == 2:
        c = (1.0 - tl.exp(shift(second, row_max, t))) * tl.exp(-log_z)
    else:
        c = neg_entropy
    return c


@triton.jit
def store_outputs(row, valid, token_logit, row_max, t, log_z, second, neg_entropy, logprob_ptr, confidence_ptr,
                  LOGPROB: tl.constexpr, CONFIDENCE: tl.constexpr, live=None):
    """The drawn token's log-probability and confidence at `row` (a row or a block of rows,
    stored where `live`), -inf where the row drew nothing."""
    if LOGPROB:
        lp = shift(token_logit, row_max, t) - log_z
        tl.store(logprob_ptr + row, tl.where(valid, lp, float("-inf")), mask=live)
    if CONFIDENCE != 0:
        c = confidence_of(CONFIDENCE, token_logit, row_max, t, log_z, second, neg_entropy)
        tl.store(confidence_ptr + row, tl.where(valid, c, float("-inf")), mask=live)


@triton.jit
def tile_draw(x, offs, V, n_tiles, t, greedy, noise_ptr, row, row_id, seed_lo, seed_hi, offset_lo, offset_hi):
    """The token drawn inside one tile of a row: the first argmax over offs < V of
    shift(x_j, m) + G_j (greedy rows: of shift(x_j, m)), m = max x, G_j the Gumbel variable of
    column j of the row's stream; returns (token, m)."""
    tile_max = tl.max(x, axis=0)
    y = shift(x, tile_max, t)
    column = tl.where(offs < V, offs, 0)
    u = row_uniform(noise_ptr, V + n_tiles, row, column, row_id, seed_lo, seed_hi, offset_lo, offset_hi,
                    noise_ptr is not None)
    keys = tl.where(greedy, y, y + gumbel(u))
    keys = tl.where(offs < V, keys, float("-inf"))
    token, _ = first_argmax(keys, offs, V)
    return token, tile_max


@triton.jit(do_not_specialize=COUNTER_WORDS)
def finish_kernel(
    logits_ptr, V, n_tiles, temperature, temperature_ptr,
    exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau_ptr,
    noise_ptr, row_ids_ptr, seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr, offset_ptr,
    stats_ptr, tokens_ptr, valid_ptr, logprob_ptr, confidence_ptr,
    TILE: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_T: tl.constexpr, SINGLE_TILE: tl.constexpr,
    LOGPROB: tl.constexpr, CONFIDENCE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seed_lo, seed_hi, offset_lo, offset_hi = load_counters(seed_lo, seed_hi, offset_lo, offset_hi, seed_ptr,
                                                           offset_ptr)
    row_id = load_row_id(row_ids_ptr, row)
    greedy, t = row_temperature(temperature, temperature_ptr, row)
    tau = row_threshold(tau_ptr, row)
    if SINGLE_TILE:
        tile = 0
    else:
        tile, row_max = race(row, n_tiles, V, t, greedy, stats_ptr, noise_ptr, row_id, seed_lo, seed_hi, offset_lo,
                             offset_hi, BLOCK_T, RECORD)

    offs = tile * TILE + tl.arange(0, BLOCK_J)
    x = masked_logits(logits_ptr, row, offs, V, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau)
    token, tile_max = tile_draw(x, offs, V, n_tiles, t, greedy, noise_ptr, row, row_id, seed_lo, seed_hi, offset_lo,
                                offset_hi)
    if SINGLE_TILE:
        row_max = tile_max
    valid = row_max > float("-inf")
    # An invalid row draws token 0.
    tl.store(tokens_ptr + row, tl.where(valid, token, 0).to(tl.int64))
    tl.store(valid_ptr + row, valid)
    if LOGPROB or CONFIDENCE != 0:
        token_logit = tl.max(tl.where(offs == token, x, float("-inf")), axis=0)
        if SINGLE_TILE:
            m, s, second, ent = tile_statistics(x[None, :], t, CONFIDENCE == 2, CONFIDENCE == 3)
            log_z = tl.sum(s, axis=0)
            second = tl.sum(second, axis=0)
            neg_entropy = tl.sum(ent, axis=0) * tl.exp(-log_z) - log_z
        else:
            log_z, second, neg_entropy = row_summary(row, n_tiles, row_max, t, stats_ptr, CONFIDENCE == 2,
                                                     CONFIDENCE == 3, BLOCK_T, RECORD)
        store_outputs(row, valid, token_logit, row_max, t, log_z, second, neg_entropy, logprob_ptr, confidence_ptr,
                      LOGPROB, CONFIDENCE)


# ------------------------------------------------------------- truncation thresholds


@triton.jit
def ordered_key(x):
    """Order-preserving key of float32 values as uint32 (32-bit arithmetic: half the
    instructions of int64 in the search's inner loop); -0 reads as +0. Every key of a
    value above -inf is at least 0x00800000."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits + 0x80000000)


@triton.jit
def key_value(key):
    """The float32 whose ordered key is `key` (uint32 scalar)."""
    bits = tl.where(key >= 0x80000000, key - 0x80000000, 0xFFFFFFFF - key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def min_p_bound(row_max, t, c):
    """The smallest float32 v with shift(v, row_max) >= c, for a row maximum above -inf and
    c <= 0: min-p keeps exactly the logits >= v, since shift is non-decreasing in v (a rounded
    difference, then a rounded division by T > 0). A bisection over the ordered keys up to
    the maximum's, 32 steps of scalar arithmetic, in place of a pass over the row for its
    smallest kept logit."""
    lo = ordered_key(tl.full([], -3.4028234663852886e38, tl.float32))  # the smallest finite float
    hi = ordered_key(row_max)  # shift(row_max, row_max) = 0 >= c: the answer's key is in [lo, hi]
    while lo < hi:  # at most 32 steps
        mid = lo + ((hi - lo) >> 1)
        keep = shift(key_value(mid), row_max, t) >= c
        hi = tl.where(keep, mid, hi)
        lo = tl.where(keep, lo, mid + 1)
    return key_value(hi)


@triton.jit
def weight_of(x, row_max, t, MASS: tl.constexpr):
    """A key's weight in the search: 1 (top-k counts) or exp(shift(x, M)) (top-p mass)."""
    if MASS:
        w = tl.exp(shift(x, row_max, t))
    else:
        w = tl.where(x > float("-inf"), 1.0, 0.0)
    return w


@triton.jit
def search_key(values_ptr, row, stride, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, floor, row_max,
               t, target, lo, hi, MASS: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr):
    """The largest key k* with W(k*) >= target, W(k) the weight of the row's values (the
    first `limit` of row `row`, rows `stride` apart) >= floor with key >= k, given
    W(lo) >= target > W(hi). Each pass buckets the keys in [lo, hi)
    into NB ranges of 2**width keys, keeps the bucket holding k* and narrows [lo, hi)
    to the smallest and largest key present in it; it ends when one key is left."""
    b = tl.arange(0, NB)
    above = tl.full([], 0.0, tl.float64)  # W(hi)
    while hi - lo > 1:
        width = 0
        while ((hi - lo - 1) >> width) >= NB:
            width += 1
        weight = tl.zeros([NB], tl.float64)
        smallest = tl.full([NB], 0xFFFFFFFF, tl.uint32)
        largest = tl.full([NB], 0, tl.uint32)  # 0: no key in the bucket (keys in play are above it)
        for start in range(0, limit, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = masked_logits(values_ptr, row, offs, stride, limit, exclude_ptr, n_exclude, exclude_row_ptr,
                              allowed_ptr, floor)
            key = ordered_key(x)
            inside = (x > float("-inf")) & (key >= lo) & (key < hi)
            bucket = tl.where(inside, (key - lo) >> width, NB)
            hit = bucket[:, None] == b[None, :]
            w = weight_of(x, row_max, t, MASS)
            weight += tl.sum(tl.where(hit, w[:, None], 0.0), axis=0).to(tl.float64)
            smallest = tl.minimum(smallest, tl.min(tl.where(hit, key[:, None], 0xFFFFFFFF), axis=0))
            largest = tl.maximum(largest, tl.max(tl.where(hit, key[:, None], 0), axis=0))
        at_or_above = above + tl.cumsum(weight, axis=0, reverse=True)  # W(lower end of each bucket)
        present = largest > 0
        chosen = tl.max(tl.where(present & (at_or_above >= target), b, -1), axis=0)
        # target above every sum (p Z rounded above the sums of this pass): keep everything
        chosen = tl.where(chosen >= 0, chosen, tl.min(tl.where(present, b, NB), axis=0))
        pick = b == chosen
        above = tl.sum(tl.where(pick, at_or_above - weight, 0.0), axis=0)
        lo = tl.sum(tl.where(pick, smallest, 0), axis=0)
        hi = tl.sum(tl.where(pick, largest, 0), axis=0) + 1
    return lo


@triton.jit
def compact(logits_ptr, row, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, floor, out_ptr, capacity,
            row_max, t, cut, SCAN_BLOCK: tl.constexpr, CUT: tl.constexpr = False):
    """Write the row's logits >= floor (masks applied; CUT: and with shift(x, row_max) >= cut)
    in index order to out_ptr[0, capacity) (the first capacity of them); return how many
    there are."""
    count = tl.full([], 0, tl.int32)
    for start in range(0, V, SCAN_BLOCK):
        offs = start + tl.arange(0, SCAN_BLOCK)
        x = masked_logits(logits_ptr, row, offs, V, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, floor)
        if CUT:
            x = tl.where(shift(x, row_max, t) >= cut, x, float("-inf"))
        keep = (x > float("-inf")).to(tl.int32)
        position = count + tl.cumsum(keep, axis=0) - 1
        tl.store(out_ptr + position, x, mask=(keep != 0) & (position < capacity))
        count += tl.sum(keep, axis=0)
    return count


@triton.jit
def top_p_threshold(values_ptr, row, stride, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau, row_max,
                    t, p, lowest, top, BLOCK: tl.constexpr, SCAN_BLOCK: tl.constexpr, NB: tl.constexpr):
    """tau raised to top-p's threshold over the values >= tau: Z their mass, then the largest
    key whose upper set holds p Z."""
    z = tl.full([], 0.0, tl.float64)
    for start in range(0, limit, SCAN_BLOCK):
        offs = start + tl.arange(0, SCAN_BLOCK)
        x = masked_logits(values_ptr, row, offs, stride, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr,
                          tau)
        z += tl.sum(tl.exp(shift(x, row_max, t)), axis=0).to(tl.float64)
    return top_p_search(values_ptr, row, stride, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau,
                        row_max, t, p.to(tl.float64) * z, lowest, top, BLOCK, NB)


@triton.jit
def top_p_search(values_ptr, row, stride, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau, row_max,
                 t, target, lowest, top, BLOCK: tl.constexpr, NB: tl.constexpr):
    """tau raised to the largest key whose upper set (among the values >= tau) holds target."""
    key = search_key(values_ptr, row, stride, limit, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau, row_max,
                     t, target, tl.maximum(ordered_key(tau), lowest), top, True, BLOCK, NB)
    return tl.maximum(tau, key_value(key))


@triton.jit
def top_p_cut(logits_ptr, row, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau, row_max, t, p,
              BLOCK: tl.constexpr):
    """(p Z, cut): Z the mass of the row's values >= tau, and the largest of the cuts
    -1, -2, ..., -N_CUTS whose upper set {shift(x, row_max) >= cut} holds p Z with a
    margin of 1e-4 Z over the rounding of the sums (-inf where none does). That set holds
    top-p's nucleus; one unit of log-weight apart, the cuts keep it to a few times the
    nucleus's size. (Eight coarser cuts, up to -12, left rows of random logits whose
    nucleus needed the -12 cut with more logits than the scratch holds, and such a row
    searched its whole row after the cut's pass and copy: slower than before.)"""
    cuts = -(tl.arange(0, N_CUTS) + 1).to(tl.float32)
    # Sums a lane, added up once at the end: no reduction across the program per block. Z in
    # float64, as the law sums it; the cuts' masses in float32: a lane adds V / BLOCK values,
    # so such a sum is off by at most V / BLOCK * 2**-24 of itself, under the margin up to
    # V = 429k for BLOCK = 256, and typically far less beyond
    z = tl.zeros([BLOCK], tl.float64)
    # cuts along axis 0: a lane's value and its 16 sums share the lane, where [BLOCK, N_CUTS]
    # passed y and e through shared memory, with three barriers, every block (sm_90 SASS)
    mass = tl.zeros([N_CUTS, BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = masked_logits(logits_ptr, row, offs, V, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau)
        y = shift(x, row_max, t)
        e = tl.exp(y)
        z += e.to(tl.float64)
        mass += tl.where(y[None, :] >= cuts[:, None], e[None, :], 0.0)
    total = tl.sum(z, axis=0)
    held = tl.sum(mass.to(tl.float64), axis=1)
    return p.to(tl.float64) * total, tl.max(tl.where(held >= (p.to(tl.float64) + 1e-4) * total, cuts,
                                                     float("-inf")), axis=0)


@triton.jit
def thresholds_kernel(
    logits_ptr, V, temperature, temperature_ptr, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr,
    top_k, top_k_ptr, top_p, top_p_ptr, log_min_p, log_min_p_ptr, tau_ptr, scratch_ptr, n_groups, capacity,
    TOP_K: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr, BLOCK: tl.constexpr, SCAN_BLOCK: tl.constexpr,
    GROUP: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    _, t = row_temperature(temperature, temperature_ptr, row)
    neg_inf = float("-inf")
    # scratch row: n_groups group maxima, then room for `capacity` candidates
    groups_ptr = scratch_ptr + row * (n_groups + capacity)
    candidates_ptr = groups_ptr + n_groups
    row_max = tl.full([], neg_inf, tl.float32)
    allowed = tl.full([], 0, tl.int64)
    finite_groups = tl.full([], 0, tl.int32)
    for start in range(0, V, SCAN_BLOCK):
        offs = start + tl.arange(0, SCAN_BLOCK)
        x = masked_logits(logits_ptr, row, offs, V, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, neg_inf)
        row_max = tl.maximum(row_max, tl.max(x, axis=0))
        allowed += tl.sum((x > neg_inf).to(tl.int64), axis=0)
        if TOP_K:  # the maximum of each group of GROUP logits
            g = tl.max(tl.reshape(x, [SCAN_BLOCK // GROUP, GROUP]), axis=1)
            index = start // GROUP + tl.arange(0, SCAN_BLOCK // GROUP)
            tl.store(groups_ptr + index, g, mask=index < n_groups)
            finite_groups += tl.sum(((g > neg_inf) & (index < n_groups)).to(tl.int32), axis=0)
    tau = tl.full([], neg_inf, tl.float32)
    min_p_tau = tl.full([], neg_inf, tl.float32)
    if MIN_P:  # min-p's bound needs only M and T: found first, before the searches' loops
        c = tl.cast(row_value(log_min_p, log_min_p_ptr, row), tl.float32)
        if (c > neg_inf) & (row_max > neg_inf):
            # c > 0 (a per-row min_p above 1, unchecked on CUDA) keeps nothing
            min_p_tau = tl.where(c > 0, float("inf"), min_p_bound(row_max, t, c))
    lowest = ordered_key(tl.full([], -3.4028234663852886e38, tl.float32))  # the smallest finite float
    top = ordered_key(row_max) + 1
    count = tl.full([], -1, tl.int32)  # candidates compacted by top-k (-1: none)
    if TOP_K:
        k = tl.cast(row_value(top_k, top_k_ptr, row), tl.int64)
        if (k > 0) & (k < allowed):
            lo = lowest
            if k <= finite_groups:
                # k group maxima are k logits: the k-th largest of them bounds the threshold below,
                # and the few logits at or above it are all the search needs
                lo = search_key(groups_ptr, 0, 0, n_groups, exclude_ptr, 0, None, None, neg_inf, row_max, t,
                                k.to(tl.float64), lowest, top, False, BLOCK, N_BUCKETS)
                count = compact(logits_ptr, row, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr,
                                key_value(lo), candidates_ptr, capacity, row_max, t, neg_inf, SCAN_BLOCK)
            if (count >= 0) & (count <= capacity):
                key = search_key(candidates_ptr, 0, 0, count, exclude_ptr, 0, None, None, neg_inf, row_max, t,
                                 k.to(tl.float64), lo, top, False, BLOCK, N_BUCKETS)
            else:
                key = search_key(logits_ptr, row, V, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, neg_inf,
                                 row_max, t, k.to(tl.float64), lo, top, False, BLOCK, N_BUCKETS)
            tau = key_value(key)
    if TOP_P:
        p = tl.cast(row_value(top_p, top_p_ptr, row), tl.float32)
        if (p < 1.0) & (allowed > 0):
            if (count >= 0) & (count <= capacity):  # every logit top-k keeps is a candidate
                tau = top_p_threshold(candidates_ptr, 0, 0, count, exclude_ptr, 0, None, None, tau, row_max, t, p,
                                      lowest, top, BLOCK, SCAN_BLOCK, N_BUCKETS)
            else:
                # the nucleus lies above the tightest cut whose upper set holds p Z: search those
                # logits, copied out, when the scratch holds them, else the whole row
                target, cut = top_p_cut(logits_ptr, row, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr,
                                        tau, row_max, t, p, BLOCK // 4)
                count = capacity + 1
                if (cut > neg_inf) & (capacity > 0):
                    count = compact(logits_ptr, row, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr, tau,
                                    candidates_ptr, capacity, row_max, t, cut, SCAN_BLOCK, True)
                if count <= capacity:
                    tau = top_p_search(candidates_ptr, 0, 0, count, exclude_ptr, 0, None, None, tau, row_max, t,
                                       target, lowest, top, BLOCK, N_BUCKETS)
                else:  # p Z is known: the whole row's search needs no pass for it
                    tau = top_p_search(logits_ptr, row, V, V, exclude_ptr, n_exclude, exclude_row_ptr, allowed_ptr,
                                       tau, row_max, t, target, lowest, top, BLOCK, N_BUCKETS)
    if MIN_P:  # the three thresholds' largest (top-p's is over what top-k keeps, not min-p)
        tau = tl.maximum(tau, min_p_tau)
    tl.store(tau_ptr + row, tau)
