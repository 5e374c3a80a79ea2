// CUDA kernel of ddpd::categorical_from_weights, ddpd::multinomial and
// ddpd::multinomial_with_uniforms: the two-level inverse CDF of csrc/chunked_cdf.h,
// bit-identical to the CPU kernel and the torch reference.
//
// One block per row. The threads sum the chunks (one chunk per thread at a time,
// each an addition chain in double, the costly pass over the weights); thread 0
// then forms the prefix sums in chunk order and makes the k draws, each a binary
// search plus at most one chunk, updating one chunk and the later prefix sums
// after each draw without replacement. The prefix sums stay sequential because
// their order is part of the law; they sit in shared memory up to N of about
// 196k (with replacement) or 130k (without), in global scratch beyond.
#include <cfloat>
#include <cstdint>

#include "../chunked_cdf.h"
#include "launchers.h"

namespace ddpd {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kSharedBytes = 48 * 1024 - 64;  // default limit, less the static `positive`

// Bytes of per-row state: chunk sums and prefix sums, plus the removed-masks
// without replacement.
int64_t state_bytes(int64_t n, bool replacement) {
  return num_chunks(n) * (replacement ? 2 : 3) * 8;
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    multinomial_kernel(const scalar_t* __restrict__ weights, int64_t n, int64_t k, bool replacement,
                       const double* __restrict__ uniforms, uint64_t seed, uint64_t offset,
                       const int64_t* __restrict__ row_ids, double* __restrict__ scratch,
                       int64_t* __restrict__ out, bool* __restrict__ valid) {
  extern __shared__ double shared_state[];
  __shared__ unsigned long long positive;
  const int64_t r = blockIdx.x, m = num_chunks(n);
  const scalar_t* row = weights + r * n;
  // The row state lives in shared memory when it fits (thread 0 then walks it at
  // shared-memory latency), else in this row's slice of the global scratch.
  double* state = scratch != nullptr ? scratch + r * m * (replacement ? 2 : 3) : shared_state;
  double* sums = state;
  double* prefix = state + m;
  uint64_t* removed = replacement ? nullptr : reinterpret_cast<uint64_t*>(state + 2 * m);
  const bool need_count = !replacement && k > 1;
  if (threadIdx.x == 0) positive = 0;
  __syncthreads();

  bool negative = false;
  unsigned long long count = 0;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    const int64_t end = chunk_end(j, n);
    double q = 0.0;
    for (int64_t i = j * kChunk; i < end; ++i) {
      const scalar_t x = row[i];
      q += static_cast<double>(x);
      negative |= x < 0;
      count += x > 0;
    }
    sums[j] = q;
    if (removed != nullptr) removed[j] = 0;
  }
  if (need_count) atomicAdd(&positive, count);
  negative = __syncthreads_or(negative);  // also makes the sums visible to thread 0
  if (threadIdx.x != 0) return;

  prefix_from(sums, prefix, 0, m);
  const double total = prefix[m - 1];
  bool ok = !negative && total > 0 && total <= DBL_MAX;  // also rejects NaN
  if (ok && need_count) ok = positive >= static_cast<unsigned long long>(k);
  valid[r] = ok;
  int64_t* index = out + r * k;
  for (int64_t d = 0; d < k; ++d) {
    if (!ok) {
      index[d] = 0;
      continue;
    }
    const double u = uniforms != nullptr ? uniforms[r * k + d]
                                         : draw_uniform(seed, offset, static_cast<uint64_t>(row_ids[r]), d);
    index[d] = draw_index(row, n, prefix, m, removed, u);
    if (removed != nullptr && d + 1 < k) remove_index(row, n, sums, prefix, m, removed, index[d]);
  }
}

}  // namespace

int64_t multinomial_scratch_doubles(int64_t rows, int64_t n, bool replacement) {
  const int64_t bytes = state_bytes(n, replacement);
  return bytes <= kSharedBytes ? 0 : rows * bytes / 8;
}

template <typename scalar_t>
cudaError_t launch_multinomial(const scalar_t* weights, int64_t rows, int64_t n, int64_t k,
                               bool replacement, const double* uniforms, uint64_t seed,
                               uint64_t offset, const int64_t* row_ids, double* scratch,
                               int64_t* out, bool* valid, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const size_t shared = scratch != nullptr ? 0 : static_cast<size_t>(state_bytes(n, replacement));
  multinomial_kernel<scalar_t><<<static_cast<unsigned>(rows), kThreads, shared, stream>>>(
      weights, n, k, replacement, uniforms, seed, offset, row_ids, scratch, out, valid);
  return cudaGetLastError();
}

template cudaError_t launch_multinomial<float>(const float*, int64_t, int64_t, int64_t, bool,
                                               const double*, uint64_t, uint64_t, const int64_t*,
                                               double*, int64_t*, bool*, cudaStream_t);
template cudaError_t launch_multinomial<double>(const double*, int64_t, int64_t, int64_t, bool,
                                                const double*, uint64_t, uint64_t, const int64_t*,
                                                double*, int64_t*, bool*, cudaStream_t);

}  // namespace cuda
}  // namespace ddpd
