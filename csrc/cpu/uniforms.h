// Runs of a row's counter-based uniforms (csrc/rng.h) computed together, with vector
// instructions where the CPU has them: a scalar Philox4x32-10 is twenty 32 x 32-bit
// multiplications, and the CPU draws of small vocabularies and planner rows spent a third
// to a half of their time there (one Philox a uniform, by the law of the streams).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "vector_math.h"

namespace ddpd {
namespace cpu {

// out[i] = philox_uniform(seed, offset, row, first + i) for i in [0, n), bit for bit.
void philox_uniforms(uint64_t seed, uint64_t offset, uint64_t row, uint64_t first, int64_t n, float* out);

// out[i] = philox_word(seed, offset, row, first + i) for i in [0, n) (the draws of multinomial).
void philox_words(uint64_t seed, uint64_t offset, uint64_t row, uint64_t first, int64_t n, uint32_t* out);

// Where a row's uniforms come from: a row of explicit noise, or the row's stream.
struct RowUniforms {
  const float* noise = nullptr;  // one row of explicit noise, or null
  uint64_t seed = 0, offset = 0, row_id = 0;

  // Columns [first, first + n): the noise row's own, or the stream's written to out.
  const float* run(int64_t first, int64_t n, float* out) const {
    if (noise) return noise + first;
    philox_uniforms(seed, offset, row_id, static_cast<uint64_t>(first), n, out);
    return out;
  }
};

constexpr int64_t kUniformRun = 256;  // uniforms computed at a time by for_each_uniform

// f(column, v) for every column of [first, first + n), in order: v the column's uniform, or
// where kGumbel its Gumbel variable -log(-log u) (vector_math.h); kUniformRun at a time.
template <bool kGumbel = false, typename F>
inline void for_each_uniform(const RowUniforms& u, int64_t first, int64_t n, F&& f) {
  float run[kUniformRun];
  for (int64_t start = first; start < first + n; start += kUniformRun) {
    const int64_t m = std::min(kUniformRun, first + n - start);
    const float* v = u.run(start, m, run);
    if constexpr (kGumbel) {
      vector_math(VectorFn::kGumbel, v, m, run);
      v = run;
    }
    for (int64_t i = 0; i < m; ++i) f(start + i, v[i]);
  }
}

// gumbel_race (vector_math.h) over x[0, n) with the Gumbel variables of the row's columns
// [first, first + n), or without noise where u is null (a greedy race), kUniformRun columns
// at a time: the first x index of the largest key, and the key.
inline RaceWinner gumbel_race_row(const float* x, int64_t n, float m, float t, const RowUniforms* u, int64_t first) {
  float run[kUniformRun];
  RaceWinner best{0, -__builtin_inff()};
  for (int64_t i = 0; i < n; i += kUniformRun) {
    const int64_t len = std::min(kUniformRun, n - i);
    const RaceWinner w = gumbel_race(x + i, u ? u->run(first + i, len, run) : nullptr, len, m, t);
    if (i == 0 || w.key > best.key) best = {i + w.index, w.key};
  }
  return best;
}

template <typename F>
inline void for_each_gumbel(const RowUniforms& u, int64_t first, int64_t n, F&& f) {
  for_each_uniform<true>(u, first, n, std::forward<F>(f));
}

}  // namespace cpu
}  // namespace ddpd
