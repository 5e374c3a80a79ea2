// CPU kernel of ddpd::multinomial and ddpd::categorical_from_weights (uniforms given,
// or from counter-based Philox streams, csrc/rng.h): k draws per row by the two-level
// inverse CDF of
// csrc/multinomial.h, with replacement or without (sequential draws, each drawn
// weight set to zero: the successive-sampling law of torch.multinomial(replacement=False)).
// One pass per row builds the chunk prefix sums, then the k draws (rows of one chunk: a few
// at a time in vector lanes, draw_lanes); rows are spread
// over threads with at::parallel_for (OpenMP). Python wrapper: ddpd/ops/multinomial.py.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "../multinomial.h"
#include "isa.h"
#include "lanes.h"
#include "stream.h"
#include "uniforms.h"

// draw_lanes passes vectors by value; it is always inlined, so no call passes them through
// the ABI that GCC warns about for vectors wider than the baseline's.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ddpd {
namespace cpu {
namespace {

// Chunk sums and prefix sums of one row; returns whether a weight is negative.
// Four chunks at a time: four independent addition chains overlap in the FPU
// (a single chain would wait for each addition's latency).
template <typename scalar_t>
bool build_prefix(const scalar_t* w, int64_t n, double* sums, double* prefix) {
  const int64_t m = num_chunks(n), full = n / kChunk;
  bool negative = false;
  int64_t j = 0;
  for (; j + 4 <= full; j += 4) {
    const scalar_t* p = w + j * kChunk;
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    bool n0 = false, n1 = false, n2 = false, n3 = false;
    for (int64_t i = 0; i < kChunk; ++i) {
      const scalar_t x0 = p[i], x1 = p[kChunk + i], x2 = p[2 * kChunk + i], x3 = p[3 * kChunk + i];
      a0 += static_cast<double>(x0);
      a1 += static_cast<double>(x1);
      a2 += static_cast<double>(x2);
      a3 += static_cast<double>(x3);
      n0 |= x0 < 0;
      n1 |= x1 < 0;
      n2 |= x2 < 0;
      n3 |= x3 < 0;
    }
    sums[j] = a0;
    sums[j + 1] = a1;
    sums[j + 2] = a2;
    sums[j + 3] = a3;
    negative |= n0 | n1 | n2 | n3;
  }
  for (; j < m; ++j) {
    const int64_t begin = j * kChunk, end = chunk_end(j, n);
    sums[j] = chunk_sum_from(w + begin, 0, static_cast<int>(end - begin), 0, 0.0);
    for (int64_t i = begin; i < end; ++i) negative |= w[i] < 0;
  }
  prefix_from(sums, prefix, 0, m);
  return negative;
}

template <typename scalar_t>
int64_t count_positive(const scalar_t* w, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += w[i] > 0;
  return count;
}

// The uniforms of a row's draws: given (float64 [rows, k]), or from the row's Philox stream,
// whose words a run of draws computes together (philox_words, in vector lanes). at(r)
// starts row r; then (*this)(d) is the uniform of its draw d, for d = 0, 1, ... in order.
class DrawUniforms {
 public:
  static constexpr int64_t kRun = 64;  // draws whose words are computed together

  DrawUniforms(const double* given, int64_t k, uint64_t seed, uint64_t offset, const int64_t* row_ids)
      : given_(given), k_(k), seed_(seed), offset_(offset), row_ids_(row_ids) {}

  DrawUniforms& at(int64_t r) {
    r_ = r;
    start_ = -1;
    return *this;
  }

  double operator()(int64_t d) const {
    if (given_) return given_[r_ * k_ + d];
    if (start_ < 0 || d >= start_ + kRun) {
      start_ = d;
      philox_words(seed_, offset_, static_cast<uint64_t>(row_ids_[r_]), static_cast<uint64_t>(2 * d),
                   2 * std::min(kRun, k_ - d), words_);
    }
    return uniform_of_words(words_[2 * (d - start_)], words_[2 * (d - start_) + 1]);
  }

 private:
  const double* given_;
  int64_t k_;
  uint64_t seed_, offset_;
  const int64_t* row_ids_;
  int64_t r_ = 0;
  mutable int64_t start_ = -1;
  mutable uint32_t words_[2 * kRun];
};

// Rows of one chunk, W at a time, a row a vector lane: draw_short_row's draws, with each
// draw's walk and the chunk sum rebuilt after its removal in one pass over the row, every
// lane through every weight (no branch leaves the walk early). A draw is a chain of
// additions through the row; a lane a row runs W chains at once, where one row at a time
// ran one (the vector instructions add each lane as the scalar code adds it, in the same
// order). x: the rows' weights as doubles, x[i * W + l] weight i of lane l's row; sums:
// their sums; index[l]: lane l's row of k indices.
template <int W>
DDPD_INLINE void draw_lanes(const double* x, int n, int64_t k, bool replacement, const double* sums,
                            const DrawUniforms* uniforms, int64_t* const* index) {
  using f64 = typename Lanes<W>::f64;
  using i64 = typename Lanes<W>::i64;
  f64 total;
  for (int l = 0; l < W; ++l) total[l] = sums[l];
  i64 removed = {};
  for (int64_t d = 0; d < k; ++d) {
    f64 u;
    for (int l = 0; l < W; ++l) u[l] = uniforms[l](d);
    // draw_threshold: u * total kept in [0, below total] (total > 0 and finite: one step down
    // is its bits - 1)
    const f64 product = u * total, below = reinterpret_cast<f64>(reinterpret_cast<i64>(total) - 1);
    const f64 high = product < below ? product : below, zero = {};
    const f64 threshold = high > zero ? high : zero;
    f64 q = {}, rebuilt = {};
    i64 found = {}, at = {};
    for (int i = 0; i < n; ++i) {
      f64 xi;
      std::memcpy(&xi, x + i * W, sizeof(xi));
      const i64 kept = ((removed >> i) & 1) == 0;
      const f64 weight = kept ? xi : f64{};  // a removed weight adds nothing (q + 0 is q: q >= +0)
      const f64 next = q + weight;
      const i64 hit = ~found & kept & (next > threshold);  // walk_chunk's test (base 0)
      rebuilt = hit ? q : (found ? rebuilt + weight : rebuilt);  // remove_drawn's sum from `before`
      at = hit ? i64{} + i : at;
      found |= hit;
      q = next;
    }
    for (int l = 0; l < W; ++l) index[l][d] = at[l];
    if (!replacement && d + 1 < k) {
      removed |= i64{} + 1 << at;
      total = rebuilt;
    }
  }
}

using LanesFn = void (*)(const double*, int, int64_t, bool, const double*, const DrawUniforms*, int64_t* const*);
constexpr int kMaxLanes = 4;

struct LanesPath {
  int lanes;
  LanesFn draw;
};

void lanes_baseline(const double* x, int n, int64_t k, bool r, const double* s, const DrawUniforms* u,
                    int64_t* const* i) {
  draw_lanes<2>(x, n, k, r, s, u, i);
}

#if defined(__x86_64__) || defined(__i386__)
void lanes_avx2(const double* x, int n, int64_t k, bool r, const double* s, const DrawUniforms* u,
                int64_t* const* i) __attribute__((target("avx2")));
void lanes_avx2(const double* x, int n, int64_t k, bool r, const double* s, const DrawUniforms* u,
                int64_t* const* i) {
  draw_lanes<4>(x, n, k, r, s, u, i);
}
#endif

// The lanes of path `isa` (isa.h). AVX-512 machines take the AVX2 path: compiled for
// AVX-512, GCC 12 turned the selects of 8 lanes into a scalar comparison a lane.
LanesPath lanes_path(Isa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx512:
    case Isa::kAvx2: return {4, lanes_avx2};
#endif
    default: return {2, lanes_baseline};
  }
}

// Rows [first, last) of one chunk each: valid rows W at a time in lanes, the rest of them
// one at a time (draw_short_row); invalid rows draw index 0.
template <typename scalar_t>
void sample_short_rows(const scalar_t* w, int64_t first, int64_t last, int64_t n, int64_t k, bool replacement,
                       const DrawUniforms& uniforms, const LanesPath& path, int64_t* out, bool* valid) {
  const int lanes = path.lanes;
  double x[kChunk * kMaxLanes], sums[kMaxLanes];
  std::vector<DrawUniforms> lane_uniforms(lanes, uniforms);
  int64_t* index[kMaxLanes];
  int filled = 0;
  for (int64_t r = first; r < last; ++r) {
    const scalar_t* row = w + r * n;
    bool ok;
    const double sum = short_row_sum(row, n, k, replacement, &ok);
    valid[r] = ok;
    if (!ok) {
      std::fill(out + r * k, out + (r + 1) * k, int64_t{0});
      continue;
    }
    for (int64_t i = 0; i < n; ++i) x[i * lanes + filled] = static_cast<double>(row[i]);
    sums[filled] = sum;
    lane_uniforms[filled].at(r);
    index[filled] = out + r * k;
    if (++filled == lanes) {
      path.draw(x, static_cast<int>(n), k, replacement, sums, lane_uniforms.data(), index);
      filled = 0;
    }
  }
  for (int l = 0; l < filled; ++l) {  // the last few valid rows
    const int64_t r = (index[l] - out) / k;
    draw_short_row(w + r * n, n, k, replacement, lane_uniforms[l], index[l]);
  }
}

// Draws k indices from each row of w [rows, n]. A row is valid when its weights are
// finite, non-negative and (at least one | at least k, without replacement) positive; an
// invalid row gets index 0 everywhere and valid = false.
template <typename scalar_t>
void sample_rows(const scalar_t* w, int64_t rows, int64_t n, int64_t k, bool replacement,
                 const DrawUniforms& uniforms, int64_t* out, bool* valid) {
  const int64_t m = num_chunks(n);
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(n, 1));
  static const LanesPath lanes = lanes_path(best_isa());
  at::parallel_for(0, rows, grain, [&](int64_t first, int64_t last) {
    if (m == 1) return sample_short_rows(w, first, last, n, k, replacement, uniforms, lanes, out, valid);
    std::vector<double> sums(m), prefix(m);
    std::vector<uint64_t> removed(replacement ? 0 : m);
    DrawUniforms row_uniforms = uniforms;
    for (int64_t r = first; r < last; ++r) {
      const scalar_t* row = w + r * n;
      int64_t* idx = out + r * k;
      const DrawUniforms& uniform = row_uniforms.at(r);
      const bool negative = build_prefix(row, n, sums.data(), prefix.data());
      const double total = prefix[m - 1];
      bool ok = !negative && total > 0 && total <= 1.7976931348623157e308;  // also rejects NaN
      if (ok && !replacement && k > 1) ok = count_positive(row, n) >= k;
      valid[r] = ok;
      if (!ok) {
        std::fill(idx, idx + k, int64_t{0});
        continue;
      }
      if (!replacement) std::fill(removed.begin(), removed.end(), uint64_t{0});
      for (int64_t d = 0; d < k; ++d) {
        const Draw drawn = draw_index(row, n, prefix.data(), m, replacement ? nullptr : removed.data(), uniform(d));
        idx[d] = drawn.index;
        if (!replacement && d + 1 < k) {
          const int64_t j = remove_drawn(row + drawn.index / kChunk * kChunk, n, sums.data(), removed.data(), drawn);
          prefix_from(sums.data(), prefix.data(), j, m);
        }
      }
    }
  });
}

void check_weights(const at::Tensor& weights, int64_t k, bool replacement) {
  TORCH_CHECK(weights.dim() == 2 && weights.size(1) > 0,
              "multinomial: weights must be [B, N] with N > 0, got ", weights.sizes());
  TORCH_CHECK(k >= 1, "multinomial: k must be >= 1, got ", k);
  TORCH_CHECK(replacement || k <= weights.size(1),
              "multinomial: k must be <= N = ", weights.size(1), " without replacement, got ", k);
}

std::tuple<at::Tensor, at::Tensor> run(const at::Tensor& weights, int64_t k, bool replacement,
                                       const DrawUniforms& uniform) {
  const at::Tensor w = weights.contiguous();
  const int64_t rows = w.size(0), n = w.size(1);
  at::Tensor index = at::empty({rows, k}, w.options().dtype(at::kLong));
  at::Tensor valid = at::empty({rows}, w.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "ddpd::multinomial", [&] {
    sample_rows(w.data_ptr<scalar_t>(), rows, n, k, replacement, uniform,
                index.data_ptr<int64_t>(), valid.data_ptr<bool>());
  });
  return {index, valid};
}

// k draws per row: from the given uniforms [B, k] (float64), or from the Philox
// streams of (seed, offset, row_ids).
std::tuple<at::Tensor, at::Tensor> multinomial_kernel(const at::Tensor& weights, int64_t k, bool replacement,
                                                      const std::optional<at::Tensor>& uniforms, int64_t seed,
                                                      int64_t offset, const std::optional<at::Tensor>& row_ids,
                                                      const std::optional<at::Tensor>& seed_tensor,
                                                      const std::optional<at::Tensor>& offset_tensor) {
  check_weights(weights, k, replacement);
  if (uniforms) {
    TORCH_CHECK(uniforms->dim() == 2 && uniforms->size(0) == weights.size(0) && uniforms->size(1) == k &&
                    uniforms->scalar_type() == at::kDouble,
                "multinomial: uniforms must be float64 [", weights.size(0), ", ", k, "], got ",
                uniforms->scalar_type(), " ", uniforms->sizes());
    const at::Tensor u = uniforms->contiguous();
    return run(weights, k, replacement, DrawUniforms(u.data_ptr<double>(), k, 0, 0, nullptr));
  }
  TORCH_CHECK(row_ids && row_ids->dim() == 1 && row_ids->size(0) == weights.size(0) &&
                  row_ids->scalar_type() == at::kLong,
              "multinomial: row_ids must be int64 [B] with B = ", weights.size(0));
  const at::Tensor ids = row_ids->contiguous();
  const int64_t* rows = ids.data_ptr<int64_t>();
  const uint64_t s = counter(seed, seed_tensor), o = counter(offset, offset_tensor);
  return run(weights, k, replacement, DrawUniforms(nullptr, k, s, o, rows));
}

// ddpd::multinomial_lanes_cpu: the draws of rows of one chunk (n <= 64) from given uniforms
// by the lanes of path `isa` (isa.h), for the test that holds every path this CPU has to
// the torch reference.
std::tuple<at::Tensor, at::Tensor> multinomial_lanes_cpu(const at::Tensor& weights, int64_t k, bool replacement,
                                                         const at::Tensor& uniforms, c10::string_view isa) {
  check_weights(weights, k, replacement);
  TORCH_CHECK(weights.size(1) <= kChunk && weights.scalar_type() == at::kFloat, "weights must be float32 [B, N <= ",
              kChunk, "]");
  TORCH_CHECK(uniforms.scalar_type() == at::kDouble && uniforms.sizes() == at::IntArrayRef({weights.size(0), k}),
              "uniforms must be float64 [B, k]");
  const LanesPath path = lanes_path(require_isa(isa));
  const at::Tensor w = weights.contiguous(), u = uniforms.contiguous();
  at::Tensor index = at::empty({w.size(0), k}, w.options().dtype(at::kLong));
  at::Tensor valid = at::empty({w.size(0)}, w.options().dtype(at::kBool));
  sample_short_rows(w.data_ptr<float>(), 0, w.size(0), w.size(1), k, replacement,
                    DrawUniforms(u.data_ptr<double>(), k, 0, 0, nullptr), path, index.data_ptr<int64_t>(),
                    valid.data_ptr<bool>());
  return {index, valid};
}

// The CUDA launch configuration for a device of `multiprocessors` SMs, computed by
// the code the CUDA launcher runs (any build can report it):
// [inline_sums, splits, sum_blocks, draw_blocks, draw_threads, shared_state, short_rows].
std::vector<int64_t> multinomial_launch_config(int64_t rows, int64_t n, bool replacement, int64_t multiprocessors) {
  const MultinomialLaunch c = multinomial_launch(rows, n, replacement, multiprocessors);
  return {c.inline_sums, c.splits, c.sum_blocks, c.draw_blocks, c.draw_threads, c.shared_state, c.short_rows};
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  // The kernel behind the custom op ddpd::multinomial (ddpd/ops/multinomial.py): k
  // draws per row from given uniforms or from counter-based Philox streams (seed and
  // offset are uint64 carried in int64, or one-element int64 tensors on the device of
  // weights that hold them) -> (index, valid).
  m.def(
      "multinomial_kernel(Tensor weights, int k, bool replacement, Tensor? uniforms, int seed, int offset, "
      "Tensor? row_ids, Tensor? seed_tensor, Tensor? offset_tensor) -> (Tensor, Tensor)");
  m.def("multinomial_launch(int rows, int n, bool replacement, int multiprocessors) -> int[]",
        &ddpd::cpu::multinomial_launch_config);
  m.def("multinomial_lanes_cpu(Tensor weights, int k, bool replacement, Tensor uniforms, str isa) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) {
  m.impl("multinomial_kernel", &ddpd::cpu::multinomial_kernel);
  m.impl("multinomial_lanes_cpu", &ddpd::cpu::multinomial_lanes_cpu);
}
