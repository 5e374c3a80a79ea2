// The law of ddpd::multinomial (ddpd/ops/multinomial.py), reproduced bit for bit on
// CPU (csrc/cpu/multinomial.cpp) and GPU (csrc/cuda/multinomial.cu), and the launch
// configuration of the CUDA kernels, plain C++ so that any build can report it.
//
// Two-level inverse CDF of one row of non-negative weights. The row is cut into
// chunks of kChunk consecutive weights. A chunk sum s_j adds its weights one by one
// in double; P_j = P_{j-1} + s_j in chunk order; the cumulative weight of element i
// of chunk j is c_i = P_{j-1} + (its running sum inside the chunk). The draw for a
// uniform u in [0, 1) is the smallest i with c_i > u * P_last. Chunk sums are
// independent dependency chains, so the one pass over the row runs many at once
// (SIMD lanes, GPU threads); a draw then costs a binary search over the prefix sums
// and at most kChunk additions. Only IEEE additions and one multiplication in double
// are used (no transcendental), so the torch reference finds the same index for the
// same uniform.
#pragma once
#include <cmath>
#include <cstdint>

#include "rng.h"

namespace ddpd {

constexpr int64_t kChunk = 64;  // equals CHUNK in ddpd/ops/multinomial.py

DDPD_HD int64_t num_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

DDPD_HD int64_t chunk_end(int64_t j, int64_t n) {
  const int64_t end = (j + 1) * kChunk;
  return end < n ? end : n;
}

// A chunk's sum: its weights w[0, len) added in order from q = 0, skipping the elements
// flagged in `removed` (bit i): they count as zero, exactly as in the reference. Given q,
// the sum of the elements before `from`, it continues the sum from there (the same
// additions in the same order).
template <typename value_t>
DDPD_HD double chunk_sum_from(const value_t* w, int from, int len, uint64_t removed, double q) {
  for (int i = from; i < len; ++i) {  // int: a chunk's offsets, cheaper than 64-bit ones on a GPU
    if (!((removed >> i) & 1u)) q += static_cast<double>(w[i]);
  }
  return q;
}

// prefix[c] = P_c for c >= first, given P_{first-1} already in place.
DDPD_HD void prefix_from(const double* sums, double* prefix, int64_t first, int64_t m) {
  double acc = first > 0 ? prefix[first - 1] + sums[first] : sums[first];
  prefix[first] = acc;
  for (int64_t c = first + 1; c < m; ++c) {
    acc += sums[c];
    prefix[c] = acc;
  }
}

// The draw's threshold u * total, kept in [0, below total]: u < 1, but where total is
// subnormal the product can round up to it, and no c_i would exceed it. Unchecked uniforms
// (traced or CUDA calls) thus still draw a positive weight: below 0 as 0, NaN and >= 1 as
// just below 1. The reference computes the same: ddpd/ops/multinomial.py inverse_cdf.
DDPD_HD double draw_threshold(double u, double total) {
  const double t = u * total, below = nextafter(total, 0.0);
  const double high = t < below ? t : below;  // NaN fails the test: below
  return high > 0.0 ? high : 0.0;
}

// A draw's element inside its chunk: offset `at` of the first element whose cumulative
// weight base + q exceeds threshold (q: the running sum of the chunk's kept weights,
// draw_index's additions), and `before`, q just ahead of it. Removing that element
// leaves the chunk a new sum that a fresh chunk_sum_from builds by the same additions as
// far as `before`, so remove_drawn continues from there instead of summing the whole
// chunk again. w: the chunk's weights (the row itself, or a copy staged in double).
struct ChunkHit {
  int at;
  double before;
};

template <typename value_t>
DDPD_HD ChunkHit walk_chunk(const value_t* w, int len, uint64_t removed, double base, double threshold) {
  double q = 0.0;
  for (int i = 0; i < len; ++i) {
    // a removed element adds nothing, and the test before it already failed with this q
    if ((removed >> i) & 1u) continue;
    const double next = q + static_cast<double>(w[i]);
    if (base + next > threshold) return {i, q};
    q = next;
  }
  // not reached: base + q at the chunk end is P_j > threshold; if it were, the last element
  // and the sum ahead of it, as a fresh sum builds it
  return {len - 1, chunk_sum_from(w, 0, len - 1, removed, 0.0)};
}

// The chunk a threshold falls in: the smallest j with P_j > threshold (P_{m-1} is one).
DDPD_HD int64_t find_chunk(const double* prefix, int64_t m, double threshold) {
  int64_t lo = 0, hi = m - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (prefix[mid] > threshold) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// A drawn index, and its chunk's running sum just ahead of it (ChunkHit::before).
struct Draw {
  int64_t index;
  double before;
};

// The draw for uniform u from a row whose prefix sums are built (P_last > 0).
// `removed` holds one 64-bit mask per chunk, or is null when nothing was removed.
template <typename scalar_t>
DDPD_HD Draw draw_index(const scalar_t* w, int64_t n, const double* prefix, int64_t m, const uint64_t* removed,
                        double u) {
  const double threshold = draw_threshold(u, prefix[m - 1]);
  const int64_t j = find_chunk(prefix, m, threshold);
  const int64_t begin = j * kChunk;
  const int len = static_cast<int>(chunk_end(j, n) - begin);
  const ChunkHit hit = walk_chunk(w + begin, len, removed ? removed[j] : 0, j > 0 ? prefix[j - 1] : 0.0, threshold);
  return {begin + hit.at, hit.before};
}

// Sets the drawn weight to zero for the following draws: its flag in `removed` and its
// chunk's sum (chunk: that chunk's weights, in the row or staged); returns the chunk,
// from whose prefix sum on the caller rebuilds the prefix sums (prefix_from's order).
template <typename value_t>
DDPD_HD int64_t remove_drawn(const value_t* chunk, int64_t n, double* sums, uint64_t* removed, Draw drawn) {
  const int64_t j = drawn.index / kChunk;
  const int at = static_cast<int>(drawn.index - j * kChunk);
  removed[j] |= uint64_t{1} << at;
  const int len = static_cast<int>(chunk_end(j, n) - j * kChunk);
  sums[j] = chunk_sum_from(chunk, at + 1, len, removed[j], drawn.before);
  return j;
}

// The sum of a row of one chunk (chunk_sum_from's additions) and, in *ok, whether the row
// is valid (draw_short_row says when).
template <typename scalar_t>
DDPD_HD double short_row_sum(const scalar_t* row, int64_t n, int64_t k, bool replacement, bool* ok) {
  double sum = 0.0;
  bool negative = false;
  int64_t positive = 0;
  for (int i = 0; i < static_cast<int>(n); ++i) {
    const scalar_t x = row[i];
    sum += static_cast<double>(x);
    negative |= x < 0;
    positive += x > 0;
  }
  *ok = !negative && sum > 0 && sum <= 1.7976931348623157e308;  // also rejects NaN
  if (*ok && !replacement && k > 1) *ok = positive >= k;
  return sum;
}

// The k draws of a row of one chunk (n <= kChunk): draw_index and remove_drawn with the
// row's whole state in registers (its chunk sum is its only prefix sum), and its validity as
// the CPU kernel decides it for every row: finite non-negative weights, a positive sum and,
// without replacement, at least k positive weights (an invalid row draws index 0). On a GPU
// one thread draws a row with it: the draws are one sequential chain, which a warp and
// shared memory only slow down. The CPU kernel draws such rows a few at a time in vector
// lanes by the same additions (csrc/cpu/multinomial.cpp draw_lanes), and the rows left over
// with it. uniform(d): the uniform of draw d. Returns whether the row is valid.
template <typename scalar_t, typename Uniform>
DDPD_HD bool draw_short_row(const scalar_t* row, int64_t n, int64_t k, bool replacement, const Uniform& uniform,
                            int64_t* index) {
  bool ok;
  double sum = short_row_sum(row, n, k, replacement, &ok);
  uint64_t removed = 0;
  double prefix = sum;
  for (int64_t d = 0; d < k; ++d) {
    if (!ok) {
      index[d] = 0;
      continue;
    }
    const Draw drawn = draw_index(row, n, &prefix, 1, replacement ? nullptr : &removed, uniform(d));
    index[d] = drawn.index;
    if (!replacement && d + 1 < k) {
      remove_drawn(row, n, &sum, &removed, drawn);
      prefix = sum;  // prefix_from with one chunk
    }
  }
  return ok;
}

// Uniform in (0, 1) with 48 random bits for draw number `draw` of a row, from the
// Philox words of columns 2 draw and 2 draw + 1: u = (a 2^24 + b + 1/2) 2^-48 with
// a, b their top 24 bits (exact in double). 24 bits alone would give no token of a
// large vocabulary a probability below 2^-24.
DDPD_HD double uniform_of_words(uint32_t word_a, uint32_t word_b) {
  const uint32_t a = word_a >> 8, b = word_b >> 8;
  return (static_cast<double>(a) * 16777216.0 + static_cast<double>(b) + 0.5) * 0x1p-48;
}

DDPD_HD double draw_uniform(uint64_t seed, uint64_t offset, uint64_t row, int64_t draw) {
  return uniform_of_words(philox_word(seed, offset, row, static_cast<uint64_t>(2 * draw)),
                          philox_word(seed, offset, row, static_cast<uint64_t>(2 * draw + 1)));
}

// Launch configuration of the CUDA kernels. Rows of one chunk are drawn by one thread
// each (draw_short_row), rows / multiprocessors rows a block (up to kMaxShortRowsPerBlock),
// so that every row's chain starts at once. Rows of at most kInlineChunks chunks are
// drawn by one warp each, eight rows per block, the warp summing its row's chunks
// itself: one launch. Longer rows first have their chunk sums computed by a grid of
// (rows, splits) blocks, enough for kBlocksPerSM blocks per multiprocessor, then drawn
// by one warp per row. The draws of a row are sequential by the law (each depends on
// the prefix sums left by the one before), so the draw pass has one warp per row and
// is kept short: its state sits in shared memory and every loop over the weights reads
// them coalesced.
constexpr int64_t kInlineChunks = 32;           // rows of up to 32 x 64 weights: one warp, one launch
constexpr int64_t kMaxShortRowsPerBlock = 256;  // rows of one chunk: one thread a row
constexpr int64_t kRowsPerDrawBlock = 8;        // warps (rows) per block of the inline draw kernel
constexpr int64_t kSumThreads = 256;            // threads per chunk-sum block, one chunk each at a time
constexpr int64_t kBlocksPerSM = 4;
constexpr int64_t kSharedStateBytes = 48 * 1024;  // default shared memory limit of a block

struct MultinomialLaunch {
  bool inline_sums;      // one launch, the draw warps (threads, for short_rows) sum the chunks themselves
  int64_t splits;        // chunk-sum blocks per row (0 when inline_sums)
  int64_t sum_blocks;    // blocks of the chunk-sum grid: rows x splits
  int64_t draw_blocks;   // blocks of the draw grid
  int64_t draw_threads;  // threads per draw block (32 per row)
  bool shared_state;     // the per-row state (sums, prefix sums, removed masks) fits in shared memory
  bool short_rows;       // rows of one chunk: draw_short_row, one thread a row, draw_threads rows a block
};

// Bytes of one row's draw state: chunk sums, prefix sums, the staged chunk, and the
// removed-masks without replacement.
inline int64_t multinomial_state_bytes(int64_t n, bool replacement) {
  return num_chunks(n) * (replacement ? 2 : 3) * 8 + kChunk * 8;
}

inline MultinomialLaunch multinomial_launch(int64_t rows, int64_t n, bool replacement, int64_t multiprocessors) {
  const int64_t m = num_chunks(n);
  MultinomialLaunch c{};
  if (m == 1) {  // as many blocks as multiprocessors, or more: every row's chain starts at once
    c.inline_sums = true;
    c.short_rows = true;
    const int64_t per_block = rows / (multiprocessors > 0 ? multiprocessors : 1);
    c.draw_threads = per_block < 1 ? 1 : (per_block > kMaxShortRowsPerBlock ? kMaxShortRowsPerBlock : per_block);
    c.draw_blocks = (rows + c.draw_threads - 1) / c.draw_threads;
    c.shared_state = false;
    return c;
  }
  c.inline_sums = m <= kInlineChunks;
  if (c.inline_sums) {
    c.splits = 0;
    c.sum_blocks = 0;
    c.draw_blocks = (rows + kRowsPerDrawBlock - 1) / kRowsPerDrawBlock;
    c.draw_threads = 32 * kRowsPerDrawBlock;
    c.shared_state = true;
    return c;
  }
  const int64_t want = kBlocksPerSM * multiprocessors;
  const int64_t most = (m + kSumThreads - 1) / kSumThreads;  // at least a chunk per thread
  int64_t splits = rows > 0 ? (want + rows - 1) / rows : 1;
  splits = splits < 1 ? 1 : (splits > most ? most : splits);
  c.splits = splits;
  c.sum_blocks = rows * splits;
  c.draw_blocks = rows;
  c.draw_threads = 32;
  c.shared_state = multinomial_state_bytes(n, replacement) <= kSharedStateBytes;
  return c;
}

}  // namespace ddpd
