// Shared pieces of the CPU categorical samplers (sample_categorical.cpp,
// sample_from_hidden.cpp): the two-level exact Gumbel-max over vocabulary tiles.
//
// The vocabulary is cut into tiles of kTile tokens. Tile t wins the race
// argmax_t lse_t + G_t (lse_t = log sum_{j in t} exp l_j), then token j wins
// argmax_{j in t} l_j + G_j inside the winning tile, so P(j) = softmax(l)_j.
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

#include "../philox.h"

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

// Inner loops work on kLanes floats at a time: the SIMD width of SSE2 and NEON,
// the baseline of x86-64 and aarch64 builds (wider vectors than the target has
// are split into slow scalar code by the compiler).
constexpr int64_t kLanes = 4;

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Tempered logits of the tile of tokens [start, start + n), read from tile,
// NaN read as -inf (never drawn), into out; out is -inf padded to a multiple
// of kLanes.
template <typename scalar_t>
inline void load_tile(const scalar_t* tile, int64_t start, int64_t n, float temperature,
                      const Exclusions& excl, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = static_cast<float>(tile[j]) / temperature;
    out[j] = x != x ? kNegInf : x;
  }
  for (int64_t j = n; j < padded(n); ++j) out[j] = kNegInf;
  excl.apply(out, start, n);
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

// log sum exp over x[0, padded(n)); -inf for an all -inf tile, +inf if one is +inf.
inline float tile_lse(const float* x, int64_t n) {
  const int64_t len = padded(n);
  LaneF lane_max = load_lanes(x);
  for (int64_t j = kLanes; j < len; j += kLanes) {
    const LaneF v = load_lanes(x + j);
    lane_max = v > lane_max ? v : lane_max;
  }
  float m = kNegInf;
  for (int64_t l = 0; l < kLanes; ++l) m = lane_max[l] > m ? lane_max[l] : m;
  if (!std::isfinite(m)) return m;  // all -inf, or a +inf logit
  LaneF lane_sum = {};
  for (int64_t j = 0; j < len; j += kLanes) lane_sum += exp_nonpositive(load_lanes(x + j) - m);
  float s = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) s += lane_sum[l];
  return m + std::log(s);
}

// Running winner of the tile race of one row.
struct TileRace {
  float key = kNegInf;
  int64_t tile = 0;

  // Strict > keeps the lowest tile on ties, as torch.argmax does.
  bool offer(float lse, int64_t t, float u) {
    const float k = lse + gumbel(u);
    if (k > key) {
      key = k;
      tile = t;
      return true;
    }
    return false;
  }
  bool valid() const { return key > kNegInf; }
};

// Gumbel-max inside the winning tile (x holds its n tempered logits).
inline int64_t draw_in_tile(const float* x, int64_t start, int64_t n, const RowUniforms& u) {
  int64_t best = 0;
  float best_key = kNegInf;
  for (int64_t j = 0; j < n; ++j) {
    const float k = x[j] + gumbel(u(start + j));
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
