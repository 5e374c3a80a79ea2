// Row-parallel driver of the two-level inverse CDF (csrc/chunked_cdf.h) on CPU:
// one pass per row builds the chunk prefix sums, then k draws, with or without
// replacement. Rows are spread over threads with at::parallel_for (OpenMP).
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../chunked_cdf.h"

namespace ddpd {
namespace cpu {

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
    sums[j] = chunk_sum(w, begin, end, 0);
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
        idx[d] = draw_index(row, n, prefix.data(), m, replacement ? nullptr : removed.data(),
                            uniform(r, d));
        if (!replacement && d + 1 < k) {
          remove_index(row, n, sums.data(), prefix.data(), m, removed.data(), idx[d]);
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace ddpd
