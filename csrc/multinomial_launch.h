// Launch configuration of the CUDA multinomial (csrc/cuda/multinomial.cu), plain
// C++ so that the CPU build can report it too (ddpd::multinomial_launch, used by the
// tests that check every grid fills the device).
//
// Rows of at most kInlineChunks chunks are drawn by one warp each, eight rows per
// block, the warp summing its row's chunks itself: one launch. Longer rows first
// have their chunk sums computed by a grid of (rows, splits) blocks, enough for
// kBlocksPerSM blocks per multiprocessor, then drawn by one warp per row. The draws
// of a row are sequential by the law (each depends on the prefix sums left by the
// one before), so the draw pass has one warp per row and is kept short: its state
// sits in shared memory and every loop over the weights reads them coalesced.
#pragma once
#include <cstdint>

#include "chunked_cdf.h"

namespace ddpd {

constexpr int64_t kInlineChunks = 32;     // rows of up to 32 x 64 weights: one warp, one launch
constexpr int64_t kRowsPerDrawBlock = 8;  // warps (rows) per block of the inline draw kernel
constexpr int64_t kSumThreads = 256;      // threads per chunk-sum block, one chunk each at a time
constexpr int64_t kBlocksPerSM = 4;
constexpr int64_t kSharedStateBytes = 48 * 1024;  // default shared memory limit of a block

struct MultinomialLaunch {
  bool inline_sums;      // one launch, the draw warps sum the chunks themselves
  int64_t splits;        // chunk-sum blocks per row (0 when inline_sums)
  int64_t sum_blocks;    // blocks of the chunk-sum grid: rows x splits
  int64_t draw_blocks;   // blocks of the draw grid
  int64_t draw_threads;  // threads per draw block (32 per row)
  bool shared_state;     // the per-row state (sums, prefix sums, removed masks) fits in shared memory
};

// Bytes of one row's draw state: chunk sums, prefix sums, the staged chunk, and the
// removed-masks without replacement.
inline int64_t multinomial_state_bytes(int64_t n, bool replacement) {
  return num_chunks(n) * (replacement ? 2 : 3) * 8 + kChunk * 8;
}

inline MultinomialLaunch multinomial_launch(int64_t rows, int64_t n, bool replacement, int64_t multiprocessors) {
  const int64_t m = num_chunks(n);
  MultinomialLaunch c{};
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
