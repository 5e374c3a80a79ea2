// CPU kernel of ddpd::multinomial and ddpd::categorical_from_weights (uniforms given,
// or from counter-based Philox streams, csrc/rng.h): k draws per row by the two-level
// inverse CDF of
// csrc/multinomial.h, with replacement or without (sequential draws, each drawn
// weight set to zero: the successive-sampling law of torch.multinomial(replacement=False)).
// One pass per row builds the chunk prefix sums, then the k draws (a row of one chunk:
// draw_short_row, the state in registers, as a CUDA thread draws it); rows are spread
// over threads with at::parallel_for (OpenMP). Python wrapper: ddpd/ops/multinomial.py.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "../multinomial.h"
#include "stream.h"

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

// Draws k indices from each row of w [rows, n]; uniform(row, draw) gives the
// uniform of a draw. A row is valid when its weights are finite, non-negative
// and (at least one | at least k, without replacement) positive; an invalid row
// gets index 0 everywhere and valid = false.
template <typename scalar_t, typename Uniform>
void sample_rows(const scalar_t* w, int64_t rows, int64_t n, int64_t k, bool replacement,
                 const Uniform& uniform, int64_t* out, bool* valid) {
  const int64_t m = num_chunks(n);
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(n, 1));
  at::parallel_for(0, rows, grain, [&](int64_t first, int64_t last) {
    std::vector<double> sums(m), prefix(m);
    std::vector<uint64_t> removed(replacement ? 0 : m);
    for (int64_t r = first; r < last; ++r) {
      const scalar_t* row = w + r * n;
      int64_t* idx = out + r * k;
      if (m == 1) {
        valid[r] = draw_short_row(row, n, k, replacement, [&](int64_t d) { return uniform(r, d); }, idx);
        continue;
      }
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
        const Draw drawn = draw_index(row, n, prefix.data(), m, replacement ? nullptr : removed.data(),
                                      uniform(r, d));
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

template <typename Uniform>
std::tuple<at::Tensor, at::Tensor> run(const at::Tensor& weights, int64_t k, bool replacement,
                                       const Uniform& uniform) {
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
    const double* up = u.data_ptr<double>();
    return run(weights, k, replacement, [=](int64_t r, int64_t d) { return up[r * k + d]; });
  }
  TORCH_CHECK(row_ids && row_ids->dim() == 1 && row_ids->size(0) == weights.size(0) &&
                  row_ids->scalar_type() == at::kLong,
              "multinomial: row_ids must be int64 [B] with B = ", weights.size(0));
  const at::Tensor ids = row_ids->contiguous();
  const int64_t* rows = ids.data_ptr<int64_t>();
  const uint64_t s = counter(seed, seed_tensor), o = counter(offset, offset_tensor);
  return run(weights, k, replacement, [=](int64_t r, int64_t d) {
    return draw_uniform(s, o, static_cast<uint64_t>(rows[r]), d);
  });
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
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("multinomial_kernel", &ddpd::cpu::multinomial_kernel); }
