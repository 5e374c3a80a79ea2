// The row pieces of the CPU planner kernels (planner_select.cpp, and planner_mask.cpp
// for its mask alone):
// per-position planner probabilities p(z^d = N | x_t) = sigmoid(logit), the
// selection weights of prop:self-loop-jumps, Gumbel-top-k, and the Bernoulli
// mask of prop:draw_with_maskD. Mirrors ddpd/ops/planner_select.py and
// ddpd/ops/planner_mask.py formula for formula.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "uniforms.h"

namespace ddpd {
namespace cpu {

constexpr float kPlannerNegInf = -std::numeric_limits<float>::infinity();

// A row of planner logits as float32 into l[0, length); NaN reads as -inf (probability 0,
// never chosen).
template <typename scalar_t>
inline void planner_logits(const scalar_t* row, int64_t length, float* l) {
  for (int64_t d = 0; d < length; ++d) {
    const float v = static_cast<float>(row[d]);
    l[d] = v != v ? kPlannerNegInf : v;
  }
}

// p = sigmoid(l) of a row's logits l (vector_math.h).
inline void planner_probabilities(const float* l, int64_t length, float* p) {
  vector_math(VectorFn::kSigmoid, l, length, p);
}

// The log-weights of a row's positions before their shift: log sigmoid(l) (options A/B;
// min(l, 0) - log(1 + exp(-|l|)), finite for every finite l even where sigmoid(l)
// underflows to 0), or l (option C).
inline void selection_bases(const float* l, int64_t length, bool softmax, float* base) {
  if (softmax) {
    std::copy(l, l + length, base);
  } else {
    vector_math(VectorFn::kLogSigmoid, l, length, base);
  }
}

// The log-weight: the base relative to the row's largest base `top`, divided by tau
// (option C's softmax; 1 for A/B), so that huge logits keep their noise (log sigmoid(-1e8)
// = -1e8, whose float32 spacing of 8 would absorb it) and +inf logits tie at 0 (drawn
// uniformly among themselves): exactly 0 where base == top, -inf where base is -inf.
inline float selection_log_weight(float base, float top, float tau) {
  if (base == kPlannerNegInf) return kPlannerNegInf;
  return base == top ? 0.0f : (base - top) / tau;
}

// Gumbel-top-k: the k largest keys, larger first, the lower position first on
// ties (a stable descending sort), written to out[0..k).
inline void top_k(const std::vector<float>& keys, int64_t k, std::vector<int64_t>& order, int64_t* out) {
  order.resize(keys.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  const auto before = [&](int64_t a, int64_t b) { return keys[a] > keys[b] || (keys[a] == keys[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  std::copy(order.begin(), order.begin() + k, out);
}

// Keys of positions more than this below the top log-weight are rebased (gumbel_rounds):
// at 64 the float32 spacing, 2^-17, is far below the Gumbel noise's scale of 1.
constexpr float kRebaseGap = 64.0f;

// Gumbel-top-k as k rounds of argmax (the lower free position on ties), the keys of a
// round taken relative to the largest free base once that lies more than kRebaseGap
// below the current top (and is not -inf): a shift of every key, the same order in exact
// arithmetic, but the free positions keep their noise in float32 (keys 1e8 below the top,
// or below +inf, would all round to one value and go in position order). taken: scratch.
inline void gumbel_rounds(const std::vector<float>& base, const std::vector<float>& gumbel, float top, float tau,
                          int64_t k, std::vector<float>& keys, std::vector<char>& taken, int64_t* out) {
  const int64_t n = static_cast<int64_t>(base.size());
  taken.assign(n, 0);
  for (int64_t i = 0; i < k; ++i) {
    float free_top = kPlannerNegInf;
    for (int64_t d = 0; d < n; ++d) {
      if (!taken[d]) free_top = std::max(free_top, base[d]);
    }
    if (free_top != kPlannerNegInf && selection_log_weight(free_top, top, tau) < -kRebaseGap) top = free_top;
    int64_t best = -1;
    for (int64_t d = 0; d < n; ++d) {
      if (taken[d]) continue;
      keys[d] = selection_log_weight(base[d], top, tau) + gumbel[d];
      if (best < 0 || keys[d] > keys[best]) best = d;
    }
    out[i] = best;
    taken[best] = 1;
  }
}

// k positions without replacement, P proportional to exp(base / tau), exact at any
// spread: keys relative to the row's largest base `top` (selection_log_weight) plus the
// Gumbel variables, their k largest; where fewer than k positions lie within kRebaseGap
// of the top and a position of weight > 0 lies beyond it, by gumbel_rounds (which
// chooses what the sort would wherever no round rebases: rounds rebase only to reach
// such a position).
inline void gumbel_top_k(const std::vector<float>& base, const std::vector<float>& gumbel, float top, float tau,
                         int64_t k, std::vector<float>& keys, std::vector<int64_t>& order, std::vector<char>& taken,
                         int64_t* out) {
  int64_t near = 0, far = 0;
  for (size_t d = 0; d < base.size(); ++d) {
    const float log_weight = selection_log_weight(base[d], top, tau);
    near += log_weight >= -kRebaseGap;
    far += log_weight < -kRebaseGap && base[d] != kPlannerNegInf;
    keys[d] = log_weight + gumbel[d];
  }
  if (near >= k || far == 0) {
    top_k(keys, k, order, out);
  } else {
    gumbel_rounds(base, gumbel, top, tau, k, keys, taken, out);
  }
}

// z^d = min(u^d, kBelowOne) < p^d, forced to 1 at the chosen positions (forced[d] != 0); writes
// the masked sequence (mask_id where z) and z; returns the number masked.
inline int64_t draw_mask(const float* p, const RowUniforms& u, const std::vector<char>& forced,
                         const int64_t* x, int64_t mask_id, int64_t length, int64_t* masked, bool* z) {
  int64_t count = 0;
  for_each_uniform(u, 0, length, [&](int64_t d, float ud) {
    // without branches (z is a coin flip a position, which a branch mispredicts half the
    // time): the select as bit masks, which the compiler keeps
    const bool noise = (forced[d] != 0) | (std::min(ud, kBelowOne) < p[d]);
    const int64_t all = -static_cast<int64_t>(noise);
    z[d] = noise;
    masked[d] = (mask_id & all) | (x[d] & ~all);
    count += noise;
  });
  return count;
}

}  // namespace cpu
}  // namespace ddpd
