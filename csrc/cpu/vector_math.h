// Elementwise transcendental functions of the CPU kernels over arrays of floats, many
// lanes at a time with AVX-512 or AVX2 where the CPU has them (the C library computes one
// value a call). Each value is computed in double and rounded once to float: within a few
// 1e-13 of the exact value before the rounding, so the float is the correctly rounded one
// but for exact values that close to a rounding boundary (of a million inputs of each
// function, tests/ops/test_op_vector_math.py, none differs from float64 torch's value rounded).
// Every path (isa.h) gives the same bits.
#pragma once

#include <cstdint>

#include "isa.h"

namespace ddpd {
namespace cpu {

// The largest float below 1: float32 rounds the top uniform to 1.0, where a coin u < p would
// miss p = 1 and a Gumbel -log(-log u) would be +inf.
constexpr float kBelowOne = 1.0f - 5.9604644775390625e-08f;

enum class VectorFn {
  kLog,         // log x, for x > 0 (subnormal included) and +inf
  kExp,         // exp x (+-inf and values beyond float's range included)
  kGumbel,      // -log(-log u) for u in (0, 1], u first clamped to the largest float below 1
  kSigmoid,     // 1 / (1 + exp(-x)), in float after the exp
  kLogSigmoid,  // log sigmoid(x) = min(x, 0) - log(1 + exp(-|x|)), in float after the exp and the log
};

// out[i] = fn(x[i]) for i in [0, n), by the path isa (out may be x).
void vector_math(VectorFn fn, const float* x, int64_t n, float* out, Isa isa = best_isa());

// The sums of a tile's statistics (sample_categorical.h tile_stats) over x[0, n), n a
// multiple of kSumLanes (-inf padding adds nothing): sum_j exp(y_j) with y_j = (x_j - m) /
// t (0 where x_j == m, -inf where x_j is -inf) and exp within 2 ulp in float, and where
// entropy sum_j exp(y_j) y_j. Lane l of kSumLanes adds the values j = l mod kSumLanes in
// order, then the lanes are added in order: the same float sums on every path.
constexpr int64_t kSumLanes = 16;

struct TileSums {
  float sum, ent;
};

TileSums tile_exp_sums(const float* x, int64_t n, float m, float t, bool entropy, Isa isa = best_isa());

// The Gumbel-max race over x[0, n) (n < 2^31), the draw inside a tile
// (sample_categorical.h draw_in_tile): the first j with the largest key, key_j = (x_j - m) /
// t as tile_exp_sums shifts it, plus G_j = -log(-log u_j) (kGumbel) where that is not -inf and
// u is given (null: a greedy race, no noise); j = 0 with key -inf where every key is -inf.
// The keys are float32 sums as a scalar loop adds them: every path picks the same j.
struct RaceWinner {
  int64_t index;
  float key;
};

RaceWinner gumbel_race(const float* x, const float* u, int64_t n, float m, float t, Isa isa = best_isa());

}  // namespace cpu
}  // namespace ddpd
