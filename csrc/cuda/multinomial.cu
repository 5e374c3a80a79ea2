// CUDA kernels of ddpd::categorical_from_weights, ddpd::multinomial and
// ddpd::multinomial_with_uniforms: the two-level inverse CDF of csrc/multinomial.h,
// bit-identical to the CPU kernel and the torch reference (the same double
// additions in the same order; --fmad=false).
//
// Launch configuration: multinomial_launch in csrc/multinomial.h. Two kernels:
// - chunk_sums_kernel, grid (rows, splits): the pass over the weights, many blocks
//   per row so that every shape fills the device; each chunk's sum is an addition
//   chain in double (its order is part of the law), one chunk per thread at a time;
//   also the positive count and the negative flag of each (row, split);
// - draw_kernel, one warp per row: the prefix sums and the k draws. They are
//   sequential by the law, so the work is arranged for latency: the row's state
//   sits in shared memory, the lane-0 chains read it in register batches, and the
//   one chunk a draw walks is first staged into shared memory by the whole warp
//   with coalesced loads (the old kernel walked it from global memory, one
//   dependent load at a time, which dominated its time). For short rows (at most
//   kInlineChunks chunks) the warp sums the chunks itself and the first kernel is
//   not launched.
#include <cfloat>
#include <cstdint>

#include "../multinomial.h"
#include "multinomial.cuh"

namespace ddpd {
namespace cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// Sums of chunks [first, end) of every row: thread t takes chunks first + t,
// first + t + blockDim.x, ... Also writes the split's positive count and whether it
// saw a negative weight.
template <typename scalar_t>
__global__ void __launch_bounds__(kSumThreads)
    chunk_sums_kernel(const scalar_t* __restrict__ weights, int64_t n, int64_t splits,
                      double* __restrict__ sums, unsigned long long* __restrict__ positive,
                      int* __restrict__ negative) {
  const int64_t r = blockIdx.x, split = blockIdx.y, m = num_chunks(n);
  const int64_t per_split = (m + splits - 1) / splits;
  const int64_t first = split * per_split, end = first + per_split < m ? first + per_split : m;
  const scalar_t* row = weights + r * n;
  unsigned long long count = 0;
  bool neg = false;
  for (int64_t j = first + threadIdx.x; j < end; j += blockDim.x) {
    const int64_t stop = chunk_end(j, n);
    double q = 0.0;
#pragma unroll 8
    for (int64_t i = j * kChunk; i < stop; ++i) {
      const scalar_t x = row[i];
      q += static_cast<double>(x);
      neg |= x < 0;
      count += x > 0;
    }
    sums[r * m + j] = q;
  }
  // Block reductions: warp shuffles, then one atomic per warp into shared memory.
  __shared__ unsigned long long block_count;
  __shared__ int block_neg;
  if (threadIdx.x == 0) {
    block_count = 0;
    block_neg = 0;
  }
  __syncthreads();
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_down_sync(kFullMask, count, offset);
  const bool warp_neg = __any_sync(kFullMask, neg);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&block_count, count);
    if (warp_neg) atomicOr(&block_neg, 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    positive[r * splits + split] = block_count;
    negative[r * splits + split] = block_neg;
  }
}

// The warp stages weights [begin, end) of a row as doubles into chunk[0, end - begin).
template <typename scalar_t>
__device__ __forceinline__ void stage_chunk(const scalar_t* row, int64_t begin, int64_t end, double* chunk,
                                            int lane) {
  for (int64_t i = begin + lane; i < end; i += 32) chunk[i - begin] = static_cast<double>(row[i]);
  __syncwarp();
}

// prefix[c] = P_c for c >= first given P_{first-1} in place (csrc/chunked_cdf.h's
// prefix_from), lane 0 only, the sums read eight at a time so the shared-memory
// latency is paid once per eight dependent additions.
__device__ __forceinline__ void prefix_batched(const double* sums, double* prefix, int64_t first, int64_t m) {
  double acc = first > 0 ? prefix[first - 1] + sums[first] : sums[first];
  prefix[first] = acc;
  int64_t c = first + 1;
  for (; c + 8 <= m; c += 8) {
    double s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = sums[c + i];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      acc += s[i];
      prefix[c + i] = acc;
    }
  }
  for (; c < m; ++c) {
    acc += sums[c];
    prefix[c] = acc;
  }
}

// Sum of the staged chunk in order, skipping removed elements (chunk_sum's arithmetic).
__device__ __forceinline__ double staged_sum(const double* chunk, int64_t len, uint64_t removed) {
  double q = 0.0;
  for (int64_t i = 0; i < len; ++i) {
    if (!((removed >> i) & 1u)) q += chunk[i];
  }
  return q;
}

// The draw for uniform u (draw_index's arithmetic), lane 0 with the warp's help for
// staging the chunk; the result is broadcast to the warp.
template <typename scalar_t>
__device__ int64_t warp_draw(const scalar_t* row, int64_t n, const double* prefix, int64_t m,
                             const uint64_t* removed, double u, double* chunk, int lane) {
  int64_t lo = 0;
  double threshold = 0.0;
  if (lane == 0) {
    threshold = draw_threshold(u, prefix[m - 1]);
    int64_t hi = m - 1;  // smallest j with P_j > threshold; P_{m-1} is one
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (prefix[mid] > threshold) hi = mid; else lo = mid + 1;
    }
  }
  lo = __shfl_sync(kFullMask, lo, 0);
  const int64_t begin = lo * kChunk, end = chunk_end(lo, n);
  stage_chunk(row, begin, end, chunk, lane);
  int64_t index = end - 1;  // not reached: base + q at the chunk end is P_j > threshold
  if (lane == 0) {
    const double base = lo > 0 ? prefix[lo - 1] : 0.0;
    const uint64_t mask = removed ? removed[lo] : 0;
    double q = 0.0;
    for (int64_t i = 0; i < end - begin; ++i) {
      if (!((mask >> i) & 1u)) q += chunk[i];
      if (base + q > threshold) {
        index = begin + i;
        break;
      }
    }
  }
  return __shfl_sync(kFullMask, index, 0);
}

// One warp per row: the chunk sums (inline for short rows, else from chunk_sums_kernel),
// the prefix sums, then the k draws.
template <typename scalar_t, bool kInline>
__global__ void draw_kernel(const scalar_t* __restrict__ weights, int64_t rows, int64_t n, int64_t k,
                            bool replacement, const double* __restrict__ uniforms, uint64_t seed, uint64_t offset,
                            const int64_t* __restrict__ seed_ptr, const int64_t* __restrict__ offset_ptr,
                            const int64_t* __restrict__ row_ids, int64_t splits, double* __restrict__ sums_global,
                            const unsigned long long* __restrict__ positive, const int* __restrict__ negative,
                            double* __restrict__ state_global, int64_t* __restrict__ out, bool* __restrict__ valid) {
  extern __shared__ double shared_state[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (r >= rows) return;  // whole warps only: the shuffles below stay full-warp
  const int64_t m = num_chunks(n);
  const int64_t words = m * (replacement ? 2 : 3) + kChunk;
  double* state = state_global != nullptr ? state_global + r * words : shared_state + warp * words;
  double* sums = state;
  double* prefix = state + m;
  double* chunk = state + 2 * m;
  uint64_t* removed = replacement ? nullptr : reinterpret_cast<uint64_t*>(state + 2 * m + kChunk);
  const scalar_t* row = weights + r * n;
  // Tensor seeds and offsets are read here, at run time (a CUDA graph replays with their values then).
  if (seed_ptr != nullptr) seed = static_cast<uint64_t>(*seed_ptr);
  if (offset_ptr != nullptr) offset = static_cast<uint64_t>(*offset_ptr);

  unsigned long long count = 0;
  bool neg = false;
  if (kInline) {  // m <= 32: lane j sums chunk j
    if (lane < m) {
      const int64_t stop = chunk_end(lane, n);
      double q = 0.0;
      for (int64_t i = lane * kChunk; i < stop; ++i) {
        const scalar_t x = row[i];
        q += static_cast<double>(x);
        neg |= x < 0;
        count += x > 0;
      }
      sums[lane] = q;
    }
  } else {
    for (int64_t j = lane; j < m; j += 32) sums[j] = sums_global[r * m + j];
    for (int64_t s = lane; s < splits; s += 32) {
      count += positive[r * splits + s];
      neg |= negative[r * splits + s] != 0;
    }
  }
  for (int64_t j = lane; removed != nullptr && j < m; j += 32) removed[j] = 0;
  for (int offset_ = 16; offset_ > 0; offset_ /= 2) count += __shfl_down_sync(kFullMask, count, offset_);
  neg = __any_sync(kFullMask, neg);
  __syncwarp();

  bool ok = false;
  if (lane == 0) {
    prefix_batched(sums, prefix, 0, m);
    const double total = prefix[m - 1];
    ok = !neg && total > 0 && total <= DBL_MAX;  // also rejects NaN
    if (ok && !replacement && k > 1) ok = count >= static_cast<unsigned long long>(k);
    valid[r] = ok;
  }
  ok = __shfl_sync(kFullMask, ok, 0);
  __syncwarp();
  int64_t* index = out + r * k;
  for (int64_t d = 0; d < k; ++d) {
    if (!ok) {
      if (lane == 0) index[d] = 0;
      continue;
    }
    double u = 0.0;
    if (lane == 0) {
      u = uniforms != nullptr ? uniforms[r * k + d] : draw_uniform(seed, offset, static_cast<uint64_t>(row_ids[r]), d);
    }
    const int64_t i = warp_draw(row, n, prefix, m, removed, u, chunk, lane);
    if (lane == 0) {
      index[d] = i;
      if (removed != nullptr && d + 1 < k) {  // remove_index's arithmetic, on the staged chunk
        const int64_t j = i / kChunk;
        removed[j] |= uint64_t{1} << (i - j * kChunk);
        sums[j] = staged_sum(chunk, chunk_end(j, n) - j * kChunk, removed[j]);
        prefix_batched(sums, prefix, j, m);
      }
    }
    __syncwarp();
  }
}

}  // namespace

int64_t multinomial_scratch_doubles(int64_t rows, int64_t n, bool replacement, int64_t multiprocessors) {
  const MultinomialLaunch c = multinomial_launch(rows, n, replacement, multiprocessors);
  if (c.inline_sums) return 0;
  const int64_t m = num_chunks(n);
  // chunk sums, positive counts (as doubles' bits), negative flags, and the draw state
  // when it does not fit in shared memory
  const int64_t state = c.shared_state ? 0 : rows * (m * (replacement ? 2 : 3) + kChunk);
  return rows * m + rows * c.splits * 2 + state;
}

template <typename scalar_t>
cudaError_t launch_multinomial(const scalar_t* weights, int64_t rows, int64_t n, int64_t k, bool replacement,
                               const double* uniforms, uint64_t seed, uint64_t offset, const int64_t* seed_ptr,
                               const int64_t* offset_ptr, const int64_t* row_ids, double* scratch,
                               int64_t multiprocessors, int64_t* out, bool* valid, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const MultinomialLaunch c = multinomial_launch(rows, n, replacement, multiprocessors);
  const int64_t m = num_chunks(n);
  const size_t state_bytes = static_cast<size_t>(multinomial_state_bytes(n, replacement));
  if (c.inline_sums) {
    draw_kernel<scalar_t, true><<<static_cast<unsigned>(c.draw_blocks), static_cast<unsigned>(c.draw_threads),
                                  state_bytes * kRowsPerDrawBlock, stream>>>(
        weights, rows, n, k, replacement, uniforms, seed, offset, seed_ptr, offset_ptr, row_ids, 0, nullptr, nullptr,
        nullptr, nullptr, out, valid);
    return cudaGetLastError();
  }
  double* sums = scratch;
  auto* positive = reinterpret_cast<unsigned long long*>(scratch + rows * m);
  auto* negative = reinterpret_cast<int*>(scratch + rows * m + rows * c.splits);
  double* state = c.shared_state ? nullptr : scratch + rows * m + rows * c.splits * 2;
  chunk_sums_kernel<scalar_t><<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(c.splits)), kSumThreads, 0,
                                stream>>>(weights, n, c.splits, sums, positive, negative);
  draw_kernel<scalar_t, false><<<static_cast<unsigned>(c.draw_blocks), static_cast<unsigned>(c.draw_threads),
                                 c.shared_state ? state_bytes : 0, stream>>>(
      weights, rows, n, k, replacement, uniforms, seed, offset, seed_ptr, offset_ptr, row_ids, c.splits, sums,
      positive, negative, state, out, valid);
  return cudaGetLastError();
}

template cudaError_t launch_multinomial<float>(const float*, int64_t, int64_t, int64_t, bool, const double*,
                                               uint64_t, uint64_t, const int64_t*, const int64_t*, const int64_t*,
                                               double*, int64_t, int64_t*, bool*, cudaStream_t);
template cudaError_t launch_multinomial<double>(const double*, int64_t, int64_t, int64_t, bool, const double*,
                                                uint64_t, uint64_t, const int64_t*, const int64_t*, const int64_t*,
                                                double*, int64_t, int64_t*, bool*, cudaStream_t);

}  // namespace cuda
}  // namespace ddpd
