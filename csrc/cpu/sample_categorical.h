// The categorical law on the CPU: the two-level exact Gumbel-max over vocabulary
// tiles of sample_categorical.cpp, which sample_from_hidden.cpp draws too, with the
// sampling controls (per-row temperature, greedy, truncation thresholds) and the
// statistics behind the log-probability and confidence outputs.
//
// The vocabulary is cut into tiles of kTile tokens. With m_t the maximum of tile
// t, M the row maximum and shift(a, b) = (a - b) / T: tile t wins the race
// argmax_t shift(m_t, M) + (s_t + G_t), s_t = log sum_{j in t} exp shift(l_j, m_t),
// then token j wins argmax_{j in t} shift(l_j, m_t) + G_j inside the winning tile,
// so P(j) = softmax(l / T)_j at any scale of logits and temperature, uniform among
// +inf logits (ddpd/ops/sample_categorical.py has the derivation). A greedy row
// (temperature 0, passed as a negative value) races without the noise terms and uses
// T = 1 for its statistics. Tokens below the row's truncation threshold tau (top-k,
// top-p, min-p) read as -inf.
// Uniforms: token j reads column j, tile t column V + t, of an explicit noise
// row or of the row's Philox stream.
// Mirrors ddpd/ops/sample_categorical.py token for token.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "lanes.h"
#include "stream.h"
#include "uniforms.h"

namespace ddpd {
namespace cpu {

constexpr int64_t kTile = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Tokens a row may not draw: the shared list, an optional per-row id, an optional
// allowed mask of the row, and the row's truncation threshold (tokens below it).
struct RowMask {
  const int64_t* ids = nullptr;
  int64_t n_ids = 0;
  int64_t row_id = -1;
  const bool* allowed = nullptr;  // the row of the [N, V] mask, or null
  float tau = kNegInf;

  // Sets the masked logits of the tile [start, start + n) to -inf.
  void apply(float* x, int64_t start, int64_t n) const {
    for (int64_t i = 0; i < n_ids; ++i) {
      if (ids[i] >= start && ids[i] < start + n) x[ids[i] - start] = kNegInf;
    }
    if (row_id >= start && row_id < start + n) x[row_id - start] = kNegInf;
    if (allowed) {
      for (int64_t j = 0; j < n; ++j) x[j] = allowed[start + j] ? x[j] : kNegInf;
    }
    if (tau > kNegInf) {
      for (int64_t j = 0; j < n; ++j) x[j] = x[j] >= tau ? x[j] : kNegInf;
    }
  }
};

// ValueError unless every value of an id tensor is a token id in [0, vocab): the
// range checks of the CPU ops, here where they cost one pass over the ids.
inline void check_ids(const std::optional<at::Tensor>& ids, int64_t vocab, const char* name) {
  if (!ids) return;
  const int64_t* p = ids->data_ptr<int64_t>();
  for (int64_t r = 0; r < ids->numel(); ++r) {
    TORCH_CHECK_VALUE(p[r] >= 0 && p[r] < vocab, name, " values must be in [0, ", vocab, "), got ", p[r], " at ", r);
  }
}

// The per-row controls of a call: each a scalar for every row or a per-row array.
struct Controls {
  float temperature;  // < 0: greedy (temperature 0 as the user gives it)
  const float* temperature_row = nullptr;
  int64_t top_k = 0;  // <= 0 or >= the allowed tokens: off
  const int64_t* top_k_row = nullptr;
  float top_p = 1.0f;  // >= 1: off
  const float* top_p_row = nullptr;
  float log_min_p = kNegInf;  // -inf: off
  const float* log_min_p_row = nullptr;

  float t(int64_t r) const { return temperature_row ? temperature_row[r] : temperature; }
  int64_t k(int64_t r) const { return top_k_row ? top_k_row[r] : top_k; }
  float p(int64_t r) const { return top_p_row ? top_p_row[r] : top_p; }
  float min_p(int64_t r) const { return log_min_p_row ? log_min_p_row[r] : log_min_p; }
  bool truncates() const {
    return top_k_row || top_p_row || log_min_p_row || top_k > 0 || top_p < 1.0f || log_min_p > kNegInf;
  }
};

// What a draw reads besides its logits (or head) and controls, the same for
// sample_categorical and sample_from_hidden: the tokens it may not draw, where its
// uniforms come from, and the outputs asked for.
struct DrawInputs {
  const int64_t* exclude_ids;
  int64_t n_exclude;
  const int64_t* exclude_row;
  const bool* allowed;
  const float* noise;
  int64_t noise_stride;
  uint64_t seed, offset;
  const int64_t* row_ids;
  bool logprob;
  int confidence;  // 0 none, 1 prob, 2 margin, 3 entropy

  RowUniforms uniforms(int64_t r) const {
    return RowUniforms{noise ? noise + r * noise_stride : nullptr, seed, offset,
                       static_cast<uint64_t>(row_ids ? row_ids[r] : r)};
  }
  RowMask mask(int64_t r, int64_t vocab) const {
    return RowMask{exclude_ids, n_exclude, exclude_row ? exclude_row[r] : -1, allowed ? allowed + r * vocab : nullptr,
                   kNegInf};
  }
};

// The DrawInputs of an op's arguments, the ids and the noise checked.
inline DrawInputs draw_inputs(int64_t vocab, const std::optional<at::Tensor>& exclude_ids,
                              const std::optional<at::Tensor>& exclude_per_row,
                              const std::optional<at::Tensor>& allowed, const std::optional<at::Tensor>& noise,
                              int64_t seed, int64_t offset, const std::optional<at::Tensor>& row_ids,
                              const std::optional<at::Tensor>& seed_tensor,
                              const std::optional<at::Tensor>& offset_tensor, bool logprob, int64_t confidence) {
  check_ids(exclude_ids, vocab, "exclude_ids");
  check_ids(exclude_per_row, vocab, "exclude_per_row");
  check_noise(noise);
  return DrawInputs{optional_ptr<int64_t>(exclude_ids),
                    exclude_ids ? exclude_ids->numel() : 0,
                    optional_ptr<int64_t>(exclude_per_row),
                    optional_ptr<bool>(allowed),
                    optional_ptr<float>(noise),
                    noise ? noise->size(1) : 0,
                    counter(seed, seed_tensor),
                    counter(offset, offset_tensor),
                    optional_ptr<int64_t>(row_ids),
                    logprob,
                    static_cast<int>(confidence)};
}

// A row's temperature as the law uses it: greedy rows (t < 0, or NaN) draw the argmax
// and compute their statistics at T = 1.
inline bool is_greedy(float t) { return !(t >= 0.0f); }
inline float effective_temperature(float t) { return is_greedy(t) ? 1.0f : t; }

// Inner loops work on kLanes floats at a time: the SIMD width of SSE2 and NEON,
// the baseline of x86-64 and aarch64 builds (wider vectors than the target has
// are split into slow scalar code by the compiler).
constexpr int64_t kLanes = 4;

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }
inline int64_t padded_for_sums(int64_t n) { return (n + kSumLanes - 1) / kSumLanes * kSumLanes; }

// Logits of the tile of tokens [start, start + n), read from tile as float32, NaN
// read as -inf (never drawn), masked tokens -inf, into out; out is -inf padded to
// a multiple of kSumLanes (tile_exp_sums; kTile values hold it). No temperature yet: it
// divides differences (shift below).
template <typename scalar_t>
inline void load_tile(const scalar_t* tile, int64_t start, int64_t n, const RowMask& mask, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = static_cast<float>(tile[j]);
    out[j] = x != x ? kNegInf : x;
  }
  for (int64_t j = n; j < padded_for_sums(n); ++j) out[j] = kNegInf;
  mask.apply(out, start, n);
}

// (a - b) / t for a <= b: exactly 0 where a == b (+inf == +inf too, not NaN), -inf
// where a is -inf. Subtracting first keeps a small t from overflowing the quotient; a - b
// overflows only for a spread beyond float32's range, whose weight is 0 anyway for t up
// to MAX_TEMPERATURE (ddpd/ops/sample_categorical.py); t = 0 (a temperature below
// float32's range) leaves only the maxima finite.
inline float shift(float a, float b, float t) {
  if (a == kNegInf) return kNegInf;
  return a == b ? 0.0f : (a - b) / t;
}

// kLanes floats / int32s in one vector value (lanes.h).
typedef Lanes<kLanes>::f32 LaneF;
typedef Lanes<kLanes>::i32 LaneI;

inline LaneF load_lanes(const float* x) { return ddpd::cpu::load_lanes<kLanes>(x); }
inline LaneF exp_nonpositive(LaneF y) { return ddpd::cpu::exp_nonpositive<kLanes>(y); }
inline LaneF shift_lanes(LaneF v, float m, float t) { return ddpd::cpu::shift_lanes<kLanes>(v, m, t); }

inline bool any_lane(LaneI mask) {
  int32_t any = 0;
  for (int64_t l = 0; l < kLanes; ++l) any |= mask[l];
  return any != 0;
}

// Whether any of x[0, kSkip) is above `floor`: one test for a run of logits that a scan
// turns away together (most of a row, past a top-k threshold).
constexpr int64_t kSkip = 4 * kLanes;

inline bool any_above(const float* x, float floor) {
  const LaneF f = LaneF{} + floor;
  return any_lane((load_lanes(x) > f) | (load_lanes(x + kLanes) > f) | (load_lanes(x + 2 * kLanes) > f) |
                  (load_lanes(x + 3 * kLanes) > f));
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

// Statistics of one tile: its maximum m_t, s_t = log sum_j exp(y_j) with y_j =
// shift(x_j, m_t) (in [0, log kTile], -inf for an all -inf tile), and where asked,
// its second largest value (counted with multiplicity: a maximum twice is also the
// second) and a_t = sum_j exp(y_j) y_j (for the entropy).
struct TileStats {
  float max = kNegInf;
  float mass = kNegInf;
  float second = kNegInf;
  float ent = 0.0f;
};

inline TileStats tile_stats(const float* x, int64_t n, float t, bool want_second, bool want_entropy) {
  TileStats s;
  s.max = tile_max(x, n);
  if (s.max == kNegInf) return s;
  const TileSums sums = tile_exp_sums(x, padded_for_sums(n), s.max, t, want_entropy);
  s.mass = std::log(sums.sum);
  s.ent = sums.ent;
  if (want_second) {
    int64_t at_max = 0;
    float below = kNegInf;
    for (int64_t j = 0; j < n; ++j) {
      at_max += x[j] == s.max;
      if (x[j] < s.max && x[j] > below) below = x[j];
    }
    s.second = at_max > 1 ? s.max : below;
  }
  return s;
}

// The statistics a draw reads of one tile of a row of `tiles` tiles: only the maximum
// where the row is a single tile and no log-probability or confidence is asked (it races
// alone, and no mass is read), else tile_stats. In rows of a small vocabulary those
// exps and the log were a good part of the work.
inline TileStats drawn_tile_stats(const float* x, int64_t n, float t, int64_t tiles, const DrawInputs& in) {
  if (tiles == 1 && !in.logprob && in.confidence == 0) {
    TileStats s;
    s.max = tile_max(x, n);
    return s;
  }
  return tile_stats(x, n, t, in.confidence == 2, in.confidence == 3);
}

// The tile race: argmax_t shift(m_t, M) + s_t + G_t with M the row maximum (greedy:
// argmax_t shift(m_t, M), the first tile holding M), the lowest tile on ties (as
// torch.argmax). A single tile needs no tile uniform. Returns the winning tile;
// row_max gets M (-inf: nothing drawable).
inline int64_t race(const TileStats* stats, int64_t tiles, int64_t vocab, float t, bool greedy,
                    const RowUniforms& u, float* row_max) {
  float m = kNegInf;
  for (int64_t i = 0; i < tiles; ++i) m = stats[i].max > m ? stats[i].max : m;
  *row_max = m;
  if (tiles == 1 || m == kNegInf) return 0;
  int64_t best = 0;
  float best_key = kNegInf;
  const auto enter = [&](int64_t i, float g) {  // g: the tile's Gumbel variable (unread for a greedy row)
    float key = shift(stats[i].max, m, t);
    if (!greedy && key > kNegInf) key += stats[i].mass + g;
    if (key > best_key) {
      best_key = key;
      best = i;
    }
  };
  if (greedy) {
    for (int64_t i = 0; i < tiles; ++i) enter(i, 0.0f);
  } else {
    for_each_gumbel(u, vocab, tiles, [&](int64_t column, float g) { enter(column - vocab, g); });
  }
  return best;
}

// Gumbel-max inside the winning tile: argmax_j shift(x_j, m, t) + G_j over its n
// logits x (m their maximum; greedy: without G_j), the first on ties.
inline int64_t draw_in_tile(const float* x, int64_t start, int64_t n, float t, bool greedy, const RowUniforms& u) {
  return start + gumbel_race_row(x, n, tile_max(x, n), t, greedy ? nullptr : &u, start).index;
}

inline int64_t n_tiles(int64_t vocab) { return (vocab + kTile - 1) / kTile; }

// What the log-probability and confidence outputs need from a row's tile
// statistics: log Z = log sum_t exp(d_t + s_t) with d_t = shift(m_t, M) (Z relative
// to the row maximum), and on request the second largest value and sum_j p_j log p_j.
struct RowStats {
  float log_z = kNegInf;
  float second = kNegInf;
  float neg_entropy = kNegInf;
};

inline RowStats row_stats(const TileStats* stats, int64_t tiles, float row_max, float t, bool want_second,
                          bool want_entropy) {
  RowStats r;
  if (row_max == kNegInf) return r;
  double z = 0.0, ey = 0.0;
  float first = kNegInf, second = kNegInf;
  for (int64_t i = 0; i < tiles; ++i) {
    const TileStats& s = stats[i];
    if (s.max == kNegInf) continue;
    const float d = shift(s.max, row_max, t);
    const double scale = std::exp(static_cast<double>(d));
    const double mass = std::exp(static_cast<double>(s.mass));
    z += scale * mass;
    // sum_j e_j y_j of the tile relative to M: exp(d) (a_t + d exp(s_t)), y_j = y_j^t + d
    if (want_entropy && scale > 0.0) ey += scale * (static_cast<double>(s.ent) + static_cast<double>(d) * mass);
    for (const float v : {s.max, s.second}) {  // the top two of the row, with multiplicity
      if (v > first) {
        second = first;
        first = v;
      } else if (v > second) {
        second = v;
      }
    }
  }
  r.log_z = static_cast<float>(std::log(z));
  r.second = second;
  if (want_entropy) r.neg_entropy = static_cast<float>(ey / z - std::log(z));
  return r;
}

// The confidence outputs (ddpd/ops/sample_categorical.py, CONFIDENCES): 1 prob of the
// drawn token, 2 margin p(top 1) - p(top 2), 3 sum_j p_j log p_j (minus the entropy);
// -inf for a row with nothing drawable.
inline float confidence(int kind, float token_logit, float row_max, float t, const RowStats& r) {
  if (row_max == kNegInf) return kNegInf;
  switch (kind) {
    case 1: return std::exp(shift(token_logit, row_max, t) - r.log_z);
    case 2: return (1.0f - std::exp(shift(r.second, row_max, t))) * std::exp(-r.log_z);
    default: return r.neg_entropy;
  }
}

// -------------------------------------------------------------- truncation thresholds

// Order-preserving uint32 key of a float32 (-0 read as +0, so equal values share a key).
inline uint32_t ordered_key(float x) {
  uint32_t bits;
  const float canonical = x == 0.0f ? 0.0f : x;
  std::memcpy(&bits, &canonical, sizeof(bits));
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

inline float key_value(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? key & 0x7FFFFFFFu : ~key;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// select_key's digits: a key's bits (shift, mask) that one round histograms. Up to
// kFewKeys keys four rounds of 256 buckets, else three of 2048, 2048 and 1024: a round
// clears and scans its histogram whatever the number of keys, and at a few hundred keys
// the wide rounds' 5120 buckets were most of the search.
struct Digit {
  int shift;
  uint32_t mask;
};
constexpr Digit kFewKeyDigits[] = {{24, 0xFFu}, {16, 0xFFu}, {8, 0xFFu}, {0, 0xFFu}};
constexpr Digit kManyKeyDigits[] = {{21, 0x7FFu}, {10, 0x7FFu}, {0, 0x3FFu}};
constexpr size_t kFewKeys = 4096;

// select_key's histograms, kept across the rows of a thread.
struct Histograms {
  std::vector<double> weight = std::vector<double>(2048);
  std::vector<int64_t> present = std::vector<int64_t>(2048);
};

// The largest key k* with W(k*) = above + sum of the weights of the keys >= k* at
// least `target`, given W(smallest key) >= target: radix selection over the keys in
// rounds of the Digits above, each a histogram of the weights (in double) over the
// candidates left by the round before, until one key is left. A target above every sum
// (p Z rounded above the sums here) keeps everything: the smallest key.
inline uint32_t select_key(std::vector<uint32_t>& keys, std::vector<float>& weights, double target, double above,
                           Histograms& h) {
  const bool few = keys.size() <= kFewKeys;
  const Digit* digits = few ? kFewKeyDigits : kManyKeyDigits;
  const int rounds = few ? 4 : 3;
  for (int round = 0; round < rounds && keys.size() > 1; ++round) {
    const int shift = digits[round].shift;
    const uint32_t mask = digits[round].mask;
    std::fill(h.weight.begin(), h.weight.begin() + mask + 1, 0.0);
    std::fill(h.present.begin(), h.present.begin() + mask + 1, 0);
    for (size_t i = 0; i < keys.size(); ++i) {
      h.weight[(keys[i] >> shift) & mask] += weights[i];
      ++h.present[(keys[i] >> shift) & mask];
    }
    int64_t bucket = -1, lowest = -1;
    for (int64_t b = mask; b >= 0; --b) {
      if (!h.present[b]) continue;
      lowest = b;
      if (above + h.weight[b] >= target) {
        bucket = b;
        break;
      }
      above += h.weight[b];
    }
    if (bucket < 0) bucket = lowest;
    size_t kept = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (static_cast<int64_t>((keys[i] >> shift) & mask) == bucket) {
        keys[kept] = keys[i];
        weights[kept] = weights[i];
        ++kept;
      }
    }
    keys.resize(kept);
    weights.resize(kept);
  }
  return keys.empty() ? 0u : keys[0];
}

// The k-th largest of the row's allowed logits, with multiplicity (0 < k < their
// number), into *kth: a min-heap of the k largest seen so far, which past the first k
// logits turns most of the rest away with one comparison (the radix selection of
// select_key passes over the row four times). Each logit that enters costs log k: past
// a budget of them (a row in ascending order, say) it gives up and returns false, and
// so does a k beyond kHeapTopK, for select_key to find it.
constexpr int64_t kHeapTopK = 256;

inline bool kth_largest(const float* x, int64_t vocab, int64_t k, std::vector<float>& heap, float* kth) {
  if (k > kHeapTopK) return false;
  const auto above = std::greater<float>();
  int64_t budget = k + vocab / 16;
  heap.clear();
  for (int64_t j = 0; j < vocab; ++j) {
    // Once the heap is full, 4 kLanes logits at a time are turned away together when none
    // passes its smallest (most of a row).
    if (static_cast<int64_t>(heap.size()) == k && j % kSkip == 0 && j + kSkip <= vocab &&
        !any_above(x + j, heap.front())) {
      j += kSkip - 1;
      continue;
    }
    const float v = x[j];
    if (!(v > kNegInf) || (static_cast<int64_t>(heap.size()) == k && !(v > heap.front()))) continue;
    if (--budget < 0) return false;
    if (static_cast<int64_t>(heap.size()) == k) {
      std::pop_heap(heap.begin(), heap.end(), above);
      heap.back() = v;
    } else {
      heap.push_back(v);
    }
    std::push_heap(heap.begin(), heap.end(), above);
  }
  *kth = heap.front();
  return true;
}

// Rows of at most kShortRow allowed logits (text8's 27 characters, DNA's 5 bases) find
// top-k's and top-p's thresholds among their values sorted on the stack: select_key's
// histograms cost the same a row whatever its length, and such a sort far less
// (docs/performance.md).
constexpr int64_t kShortRow = 64;

// a[0, n) (n <= kCap, a -inf padded to kCap) sorted, larger first, into v[0, n): each value
// goes to the place its count of larger values names, all at once and without a branch
// (an insertion sort's mispredicted branches cost more at these lengths), the counts kept
// in kCap / kLanes registers. Tied values share a place: the places after it, left +inf,
// take its value in the final pass.
template <int64_t kCap>
inline void rank_sort(const float* a, int64_t n, float* v) {
  constexpr int64_t kVectors = kCap / kLanes;
  LaneI above[kVectors] = {};
  for (int64_t j = 0; j < n; ++j) {
    const LaneF b = LaneF{} + a[j];
    for (int64_t c = 0; c < kVectors; ++c) above[c] -= b > load_lanes(a + c * kLanes);  // a true lane is -1
  }
  std::fill(v, v + n, kPosInf);
  for (int64_t c = 0; c < kVectors; ++c) {
    for (int64_t l = 0; l < kLanes && c * kLanes + l < n; ++l) v[above[c][l]] = a[c * kLanes + l];
  }
  for (int64_t i = 1; i < n; ++i) v[i] = v[i] < v[i - 1] ? v[i] : v[i - 1];
}

// The allowed logits of x[0, vocab) (at most kShortRow), larger first, into v. Returns
// their number.
inline int64_t sorted_allowed(const float* x, int64_t vocab, float* v) {
  std::array<float, kShortRow + 1> a;  // + 1: a value past the last allowed one is written, not counted
  int64_t n = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    a[n] = x[j];
    n += x[j] > kNegInf;
  }
  std::fill(a.begin() + n, a.end(), kNegInf);
  if (n <= 8) {
    rank_sort<8>(a.data(), n, v);
  } else if (n <= 32) {
    rank_sort<32>(a.data(), n, v);
  } else {
    rank_sort<kShortRow>(a.data(), n, v);
  }
  return n;
}

// top-p's threshold over the kept values v[0, m) (sorted, larger first; v has room for
// padded(m)) by the reference's arithmetic (ddpd/ops/sample_categorical.py
// truncation_threshold): float32 weights cumulated in double in sorted order, and a run of
// equal values kept when the cumulative sum at its first member, less that member's
// weight, is below p Z.
inline float short_row_top_p(float* v, int64_t m, float row_max, float t, float p) {
  std::array<float, kShortRow> e;
  for (int64_t i = m; i < padded(m); ++i) v[i] = kNegInf;
  for (int64_t i = 0; i < padded(m); i += kLanes) {
    const LaneF w = exp_nonpositive(shift_lanes(load_lanes(v + i), row_max, t));
    std::memcpy(e.data() + i, &w, sizeof(w));
  }
  double z = 0.0;
  for (int64_t i = 0; i < m; ++i) z += e[i];
  const double target = static_cast<double>(p) * z;
  double cumulative = 0.0, strictly_above = 0.0;
  int64_t count = 0;
  for (int64_t i = 0; i < m; ++i) {
    cumulative += e[i];
    if (i == 0 || v[i] != v[i - 1]) strictly_above = cumulative - e[i];
    count += strictly_above < target;
  }
  return v[count > 0 ? count - 1 : 0];
}

// top-k's and top-p's threshold of a row of `allowed` <= kShortRow allowed logits.
inline float short_row_cut(const float* x, int64_t vocab, int64_t allowed, float row_max, float t, int64_t k,
                           float p) {
  std::array<float, kShortRow> v;
  sorted_allowed(x, vocab, v.data());
  const float tau = k > 0 && k < allowed ? v[k - 1] : kNegInf;
  if (!(p < 1.0f)) return tau;
  int64_t m = allowed;
  while (v[m - 1] < tau) --m;  // top-p weighs what top-k keeps
  const float tau_p = short_row_top_p(v.data(), m, row_max, t, p);
  return tau_p > tau ? tau_p : tau;
}

// Rows of at most kMidRow allowed logits find top-k's k-th largest in two steps: their
// count in each of kBuckets equal ranges between the row's minimum and maximum (a
// monotone map of the value, so the k-th largest lies in the bucket where the counts from
// the top reach k), then std::nth_element among that bucket's values. On such rows a
// heap's budget runs out (about k (1 + ln(n / k)) of n random logits enter it), and
// select_key's rounds, like nth_element over the whole row, cost several times more.
constexpr int64_t kMidRow = 4096;
constexpr int kBuckets = 256;

inline float kth_by_selection(const float* x, int64_t vocab, int64_t allowed, int64_t k, float row_max,
                              std::vector<float>& values) {
  values.resize(allowed + 1);  // + 1: a value past the last allowed one is written, not counted
  int64_t n = 0;
  float lo = kPosInf;
  for (int64_t j = 0; j < vocab; ++j) {
    values[n] = x[j];
    n += x[j] > kNegInf;
    lo = x[j] > kNegInf && x[j] < lo ? x[j] : lo;
  }
  const float scale = static_cast<float>(kBuckets) / (row_max - lo);
  int64_t above = 0;  // how many values the buckets above the k-th largest's hold
  if (scale > 0.0f && scale < kPosInf) {  // a finite spread that neither overflows nor vanishes
    const auto bucket = [lo, scale](float v) {
      const float b = (v - lo) * scale;  // in [0, kBuckets]
      return b < static_cast<float>(kBuckets - 1) ? static_cast<int>(b) : kBuckets - 1;
    };
    std::array<int64_t, kBuckets> count{};
    for (int64_t i = 0; i < n; ++i) ++count[bucket(values[i])];
    int b = kBuckets - 1;
    for (; above + count[b] < k; --b) above += count[b];
    int64_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
      values[m] = values[i];
      m += bucket(values[i]) == b;
    }
    n = m;  // the bucket's values, in values[0, m)
  }
  const auto kth = values.begin() + (k - above - 1);
  std::nth_element(values.begin(), kth, values.begin() + n, std::greater<float>());
  return *kth;
}

// The row's truncation threshold tau: top-k keeps the logits >= the k-th largest;
// top-p, on what top-k keeps, the smallest upper set whose mass under softmax(l / T)
// reaches p (a token is kept when the mass of the tokens strictly above it is below
// p Z); min-p the logits whose shift(l, M, T) >= log min_p. Each is an upper set of
// the row, so together they keep the logits >= tau. x: the row's masked logits
// (-inf where not allowed); scratch vectors are reused across rows.
struct ThresholdScratch {
  std::vector<uint32_t> keys;
  std::vector<float> weights;
  std::vector<float> kept;
  Histograms histograms;
};

// The maximum of x[0, n) and how many of its values are allowed (above -inf).
struct RowExtent {
  float max = kNegInf;
  int64_t allowed = 0;
};

inline RowExtent row_extent(const float* x, int64_t n) {
  RowExtent e;
  // kLanes at a time (a float maximum does not vectorise by itself without -ffast-math)
  const LaneF neg_inf = LaneF{} + kNegInf;
  LaneF lane_max = neg_inf;
  LaneI lane_allowed = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const LaneF v = load_lanes(x + j);
    lane_max = v > lane_max ? v : lane_max;
    lane_allowed -= v > neg_inf;  // a true lane is -1
  }
  for (int64_t l = 0; l < kLanes; ++l) {
    e.max = lane_max[l] > e.max ? lane_max[l] : e.max;
    e.allowed += lane_allowed[l];
  }
  for (; j < n; ++j) {
    e.max = x[j] > e.max ? x[j] : e.max;
    e.allowed += x[j] > kNegInf;
  }
  return e;
}

// min-p's threshold: the smallest allowed logit l with shift(l, M, T) >= log min_p, kLanes
// at a time (the scalar shift's branches kept the loop from vectorising).
inline float min_p_threshold(const float* x, int64_t vocab, float row_max, float t, float log_min_p) {
  const LaneF neg_inf = LaneF{} + kNegInf, floor = LaneF{} + log_min_p;
  LaneF lane_min = LaneF{} + kPosInf;
  int64_t j = 0;
  for (; j + kLanes <= vocab; j += kLanes) {
    const LaneF v = load_lanes(x + j);
    lane_min = (v > neg_inf) & (shift_lanes(v, row_max, t) >= floor) & (v < lane_min) ? v : lane_min;
  }
  float smallest = kPosInf;
  for (int64_t l = 0; l < kLanes; ++l) smallest = lane_min[l] < smallest ? lane_min[l] : smallest;
  for (; j < vocab; ++j) {
    if (x[j] > kNegInf && shift(x[j], row_max, t) >= log_min_p && x[j] < smallest) smallest = x[j];
  }
  return smallest;
}

// The threshold of a row whose extent (row_extent) is known.
inline float truncation_threshold(const float* x, int64_t vocab, RowExtent extent, float t, int64_t k, float p,
                                  float log_min_p, ThresholdScratch& s) {
  const float row_max = extent.max;
  const int64_t allowed = extent.allowed;
  if (allowed == 0) return kNegInf;
  float tau = kNegInf;
  if (allowed <= kShortRow) {
    if ((k > 0 && k < allowed) || p < 1.0f) tau = short_row_cut(x, vocab, allowed, row_max, t, k, p);
  } else if (k > 0 && k < allowed && allowed <= kMidRow) {
    tau = kth_by_selection(x, vocab, allowed, k, row_max, s.kept);
  } else if (k > 0 && k < allowed && !kth_largest(x, vocab, k, s.weights, &tau)) {
    s.keys.clear();
    s.weights.clear();
    for (int64_t j = 0; j < vocab; ++j) {
      if (x[j] > kNegInf) {
        s.keys.push_back(ordered_key(x[j]));
        s.weights.push_back(1.0f);
      }
    }
    tau = key_value(select_key(s.keys, s.weights, static_cast<double>(k), 0.0, s.histograms));
  }
  if (p < 1.0f && allowed > kShortRow) {
    // The logits top-k kept (every allowed one without it), in row order: their
    // softmax weights, and Z summed in that order.
    s.kept.clear();
    s.keys.clear();
    const float below_tau = std::nextafter(tau, kNegInf);  // x >= tau is x > below_tau (tau > -inf)
    for (int64_t j = 0; j < vocab; ++j) {
      if (tau > kNegInf && j % kSkip == 0 && j + kSkip <= vocab && !any_above(x + j, below_tau)) {
        j += kSkip - 1;
        continue;
      }
      if (x[j] > kNegInf && x[j] >= tau) {
        s.kept.push_back(x[j]);
        s.keys.push_back(ordered_key(x[j]));
      }
    }
    const int64_t n = static_cast<int64_t>(s.kept.size());
    s.kept.resize(padded(n), kNegInf);
    s.weights.resize(padded(n));
    for (int64_t i = 0; i < padded(n); i += kLanes) {
      const LaneF e = exp_nonpositive(shift_lanes(load_lanes(s.kept.data() + i), row_max, t));
      std::memcpy(s.weights.data() + i, &e, sizeof(e));
    }
    s.weights.resize(n);
    double z = 0.0;
    for (const float e : s.weights) z += e;
    const float tau_p = key_value(select_key(s.keys, s.weights, static_cast<double>(p) * z, 0.0, s.histograms));
    tau = tau_p > tau ? tau_p : tau;
  }
  if (log_min_p > kNegInf) {
    const float smallest = min_p_threshold(x, vocab, row_max, t, log_min_p);
    tau = smallest > tau ? smallest : tau;
  }
  return tau;
}

inline float truncation_threshold(const float* x, int64_t vocab, float t, int64_t k, float p, float log_min_p,
                                  ThresholdScratch& s) {
  return truncation_threshold(x, vocab, row_extent(x, vocab), t, k, p, log_min_p, s);
}

}  // namespace cpu
}  // namespace ddpd
