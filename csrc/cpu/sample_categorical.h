// The categorical law on the CPU: the two-level exact Gumbel-max over vocabulary
// tiles of sample_categorical.cpp, which sample_from_hidden.cpp draws too.
//
// The vocabulary is cut into tiles of kTile tokens. With m_t the maximum of tile
// t, M the row maximum and shift(a, b) = (a - b) / T: tile t wins the race
// argmax_t shift(m_t, M) + (s_t + G_t), s_t = log sum_{j in t} exp shift(l_j, m_t),
// then token j wins argmax_{j in t} shift(l_j, m_t) + G_j inside the winning tile,
// so P(j) = softmax(l / T)_j at any scale of logits and temperature, uniform among
// +inf logits (ddpd/ops/sample_categorical.py has the derivation).
// Uniforms: token j reads column j, tile t column V + t, of an explicit noise
// row or of the row's Philox stream.
// Mirrors ddpd/ops/sample_categorical.py token for token.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "../rng.h"

namespace ddpd {
namespace cpu {

constexpr int64_t kTile = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Where a row's uniforms come from: an explicit noise row or its Philox stream.
struct RowUniforms {
  const float* noise = nullptr;  // one row of explicit noise, or null
  uint64_t seed = 0, offset = 0, row_id = 0;

  float operator()(int64_t column) const {
    return noise ? noise[column] : philox_uniform(seed, offset, row_id, static_cast<uint64_t>(column));
  }
};

// -log(-log u); float32 rounds the top Philox uniform to 1.0, which would give
// +inf: clamp to the largest float32 below 1, as the references do.
inline float gumbel(float u) {
  constexpr float kBelowOne = 1.0f - 5.9604644775390625e-08f;
  return -std::log(-std::log(u < kBelowOne ? u : kBelowOne));
}

// Tokens a row may not draw: the shared list plus an optional per-row id.
struct Exclusions {
  at::IntArrayRef ids;
  int64_t row_id = -1;

  // Sets excluded logits of the tile [start, start + n) to -inf.
  void apply(float* x, int64_t start, int64_t n) const {
    for (const int64_t id : ids) {
      if (id >= start && id < start + n) x[id - start] = kNegInf;
    }
    if (row_id >= start && row_id < start + n) x[row_id - start] = kNegInf;
  }
};

// ValueError unless every exclude_per_row value is a token id in [0, vocab): the
// range check of the CPU ops, here where it costs one pass over N integers.
inline void check_exclude_per_row(const std::optional<at::Tensor>& exclude_per_row, int64_t vocab) {
  if (!exclude_per_row) return;
  const int64_t* ids = exclude_per_row->data_ptr<int64_t>();
  for (int64_t r = 0; r < exclude_per_row->numel(); ++r) {
    TORCH_CHECK_VALUE(ids[r] >= 0 && ids[r] < vocab, "exclude_per_row values must be in [0, ", vocab, "), got ",
                      ids[r], " at row ", r);
  }
}

// Inner loops work on kLanes floats at a time: the SIMD width of SSE2 and NEON,
// the baseline of x86-64 and aarch64 builds (wider vectors than the target has
// are split into slow scalar code by the compiler).
constexpr int64_t kLanes = 4;

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Logits of the tile of tokens [start, start + n), read from tile as float32, NaN
// read as -inf (never drawn), excluded tokens -inf, into out; out is -inf padded to
// a multiple of kLanes. No temperature yet: it divides differences (shift below).
template <typename scalar_t>
inline void load_tile(const scalar_t* tile, int64_t start, int64_t n, const Exclusions& excl, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = static_cast<float>(tile[j]);
    out[j] = x != x ? kNegInf : x;
  }
  for (int64_t j = n; j < padded(n); ++j) out[j] = kNegInf;
  excl.apply(out, start, n);
}

// (a - b) / t for a <= b: exactly 0 where a == b (+inf == +inf too, not NaN), -inf
// where a is -inf. Subtracting before dividing cannot overflow; t = 0 (a
// temperature below float32's range) leaves only the maxima finite.
inline float shift(float a, float b, float t) {
  if (a == kNegInf) return kNegInf;
  return a == b ? 0.0f : (a - b) / t;
}

// kLanes floats / int32s in one GCC/Clang vector value: the compiler maps the
// operations onto whatever SIMD width the target has.
typedef float LaneF __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t LaneI __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline LaneF load_lanes(const float* x) {
  LaneF v;
  std::memcpy(&v, x, sizeof(v));
  return v;
}

// exp(y) lane-wise for y <= 0 (y = -inf allowed), within 2 ulp; values below
// exp(-87) flush to 0, which cannot move a log-sum-exp whose largest term is 1.
inline LaneF exp_nonpositive(LaneF y) {
  const LaneF low = LaneF{} - 100.0f;  // y = -inf would give NaN below: clamp first
  y = y > low ? y : low;
  const LaneI n = __builtin_convertvector(y * 1.44269504088896341f - 0.5f, LaneI);  // round, y <= 0
  const LaneF nf = __builtin_convertvector(n, LaneF);
  // ln 2 split in a short high part (nf * hi is exact) and the rest.
  const LaneF r = y - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
  // Taylor series of exp(r), |r| <= ln2 / 2, Horner form (truncation error < 1e-8).
  LaneF p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const LaneF scale = reinterpret_cast<LaneF>((n + 127) << 23);
  return n > -126 ? p * scale : LaneF{};
}

// Maximum over x[0, padded(n)).
inline float tile_max(const float* x, int64_t n) {
  LaneF lane_max = load_lanes(x);
  for (int64_t j = kLanes; j < padded(n); j += kLanes) {
    const LaneF v = load_lanes(x + j);
    lane_max = v > lane_max ? v : lane_max;
  }
  float m = kNegInf;
  for (int64_t l = 0; l < kLanes; ++l) m = lane_max[l] > m ? lane_max[l] : m;
  return m;
}

// s = log sum_j exp(shift(x_j, m, t)) over x[0, padded(n)) with m its maximum: in
// [0, log kTile], -inf for an all -inf tile.
inline float tile_mass(const float* x, int64_t n, float m, float t) {
  if (m == kNegInf) return kNegInf;
  const LaneF zero = {}, neg_inf = zero + kNegInf;
  LaneF lane_sum = {};
  for (int64_t j = 0; j < padded(n); j += kLanes) {
    const LaneF v = load_lanes(x + j);
    LaneF y = (v - m) / t;  // NaN at inf - inf is replaced just below
    y = v == m ? zero : y;
    y = v == neg_inf ? neg_inf : y;
    lane_sum += exp_nonpositive(y);
  }
  float s = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) s += lane_sum[l];
  return std::log(s);
}

// Statistics of one tile for the tile race: its maximum m_t and r_t = s_t + G_t.
struct TileStats {
  float max = kNegInf;
  float key = kNegInf;
};

inline TileStats tile_stats(const float* x, int64_t n, float t, float u) {
  const float m = tile_max(x, n);
  return {m, tile_mass(x, n, m, t) + gumbel(u)};
}

// The tile race: argmax_t shift(m_t, M) + r_t with M the row maximum, the lowest
// tile on ties (as torch.argmax). Returns the winning tile; row_max gets M (-inf:
// nothing drawable).
inline int64_t race(const TileStats* stats, int64_t tiles, float t, float* row_max) {
  float m = kNegInf;
  for (int64_t i = 0; i < tiles; ++i) m = stats[i].max > m ? stats[i].max : m;
  *row_max = m;
  int64_t best = 0;
  float best_key = kNegInf;
  for (int64_t i = 0; i < tiles; ++i) {
    const float key = shift(stats[i].max, m, t) + stats[i].key;
    if (key > best_key) {
      best_key = key;
      best = i;
    }
  }
  return best;
}

// Gumbel-max inside the winning tile: argmax_j shift(x_j, m, t) + G_j over its n
// logits x (m their maximum), the first on ties.
inline int64_t draw_in_tile(const float* x, int64_t start, int64_t n, float t, const RowUniforms& u) {
  const float m = tile_max(x, n);
  int64_t best = 0;
  float best_key = kNegInf;
  for (int64_t j = 0; j < n; ++j) {
    const float k = shift(x[j], m, t) + gumbel(u(start + j));
    if (j == 0 || k > best_key) {
      best_key = k;
      best = j;
    }
  }
  return start + best;
}

inline int64_t n_tiles(int64_t vocab) { return (vocab + kTile - 1) / kTile; }

}  // namespace cpu
}  // namespace ddpd
