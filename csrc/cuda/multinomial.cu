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
//   dependent load at a time, which dominated its time), and stays there for the
//   next draws that fall in it. The uniforms of 32 draws come from the 32 lanes at
//   once (two Philox evaluations each, which lane 0 made one after the other, 2k of
//   them a row), and the chunk sum rebuilt after a removal continues the sum the
//   draw's walk made up to the removed weight (csrc/multinomial.h remove_drawn): the
//   same additions, about half of them. For short rows (at most
//   kInlineChunks chunks) the warp sums the chunks itself and the first kernel is
//   not launched;
// - short_rows_kernel, rows of one chunk (n <= kChunk: text8's alphabet, DNA, amino
//   acids): one thread a row runs draw_short_row (csrc/multinomial.h, which the CPU kernel
//   runs for the rows its vector lanes leave over), its state in registers; a warp would
//   have one lane walk the chain while the others wait.
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

// prefix[c] = P_c for c >= first given P_{first-1} in place (csrc/multinomial.h's
// prefix_from, the same additions in the same order), lane 0 only. The sums are read eight
// at a time, each batch loaded while the batch before it is added: the loads cannot move
// above the stores of the prefix sums before them (the compiler cannot tell the two arrays
// apart), so loaded in turn, every batch paid the shared-memory latency on the chain.
__device__ __forceinline__ void prefix_batched(const double* sums, double* prefix, int64_t first, int64_t m) {
  double acc = first > 0 ? prefix[first - 1] + sums[first] : sums[first];
  prefix[first] = acc;
  int64_t c = first + 1;
  double s[8];
  if (c + 8 <= m) {
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = sums[c + i];
  }
  for (; c + 8 <= m; c += 8) {
    double next[8];
    const bool more = c + 16 <= m;
    if (more) {
#pragma unroll
      for (int i = 0; i < 8; ++i) next[i] = sums[c + 8 + i];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      acc += s[i];
      prefix[c + i] = acc;
    }
    if (more) {
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i] = next[i];
    }
  }
  for (; c < m; ++c) {
    acc += sums[c];
    prefix[c] = acc;
  }
}

// The draw for uniform u (draw_index's arithmetic: find_chunk, then walk_chunk over the
// chunk staged by the whole warp), lane 0 with the warp's help; the index is broadcast
// to the warp, `before` (for remove_drawn) is lane 0's. `staged`: the chunk already in
// `chunk` (-1: none), which is not staged again (the copy holds the row's weights, which
// no draw changes: removals are flags): a row of one chunk is staged once for all its draws.
template <typename scalar_t>
__device__ Draw warp_draw(const scalar_t* row, int64_t n, const double* prefix, int64_t m, const uint64_t* removed,
                          double u, double* chunk, int64_t& staged, int lane) {
  int64_t j = 0;
  double threshold = 0.0;
  if (lane == 0) {
    threshold = draw_threshold(u, prefix[m - 1]);
    j = find_chunk(prefix, m, threshold);
  }
  j = __shfl_sync(kFullMask, j, 0);
  const int64_t begin = j * kChunk, end = chunk_end(j, n);
  if (j != staged) {  // j is the warp's: every lane takes the same branch
    stage_chunk(row, begin, end, chunk, lane);
    staged = j;
  }
  ChunkHit hit{0, 0.0};
  if (lane == 0) {
    hit = walk_chunk(chunk, static_cast<int>(end - begin), removed ? removed[j] : 0, j > 0 ? prefix[j - 1] : 0.0,
                     threshold);
  }
  return {begin + __shfl_sync(kFullMask, hit.at, 0), hit.before};
}

// One warp per row: the chunk sums (inline for short rows, else from chunk_sums_kernel),
// the prefix sums, then the k draws.
// kShared: the state sits in shared memory. A compile-time choice: the compiler then
// knows the pointers' address space and reads and writes the state with shared-memory
// instructions instead of generic ones (which first resolve the address's space).
template <typename scalar_t, bool kInline, bool kShared>
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
  double* state = kShared ? shared_state + warp * words : state_global + r * words;
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
  double lane_u = 0.0;  // lane l: the uniform of draw d0 + l of the current run of 32 draws
  int64_t staged = -1;  // the chunk in `chunk`
  for (int64_t d = 0; d < k; ++d) {
    if (!ok) {
      if (lane == 0) index[d] = 0;
      continue;
    }
    const int source = static_cast<int>(d % 32);
    if (source == 0 && d + lane < k) {  // the next 32 uniforms at once, one a lane, off lane 0's chain
      lane_u = uniforms != nullptr ? uniforms[r * k + d + lane]
                                   : draw_uniform(seed, offset, static_cast<uint64_t>(row_ids[r]), d + lane);
    }
    const double u = __shfl_sync(kFullMask, lane_u, source);
    const Draw drawn = warp_draw(row, n, prefix, m, removed, u, chunk, staged, lane);
    if (lane == 0) {
      index[d] = drawn.index;
      if (removed != nullptr && d + 1 < k) {  // the drawn chunk is still staged
        prefix_batched(sums, prefix, remove_drawn(chunk, n, sums, removed, drawn), m);
      }
    }
    __syncwarp();
  }
}

// The uniform of draw d of row r: given, or from the row's Philox stream.
struct RowUniform {
  const double* uniforms;
  int64_t k, r;
  uint64_t seed, offset, row_id;
  __device__ double operator()(int64_t d) const {
    return uniforms != nullptr ? uniforms[r * k + d] : draw_uniform(seed, offset, row_id, d);
  }
};

// One thread a row of one chunk, blockDim.x rows a block.
template <typename scalar_t>
__global__ void short_rows_kernel(const scalar_t* __restrict__ weights, int64_t rows, int64_t n, int64_t k,
                                  bool replacement, const double* __restrict__ uniforms, uint64_t seed,
                                  uint64_t offset, const int64_t* __restrict__ seed_ptr,
                                  const int64_t* __restrict__ offset_ptr, const int64_t* __restrict__ row_ids,
                                  int64_t* __restrict__ out, bool* __restrict__ valid) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  // Tensor seeds and offsets are read here, at run time (a CUDA graph replays with their values then).
  if (seed_ptr != nullptr) seed = static_cast<uint64_t>(*seed_ptr);
  if (offset_ptr != nullptr) offset = static_cast<uint64_t>(*offset_ptr);
  const RowUniform uniform{uniforms, k, r, seed, offset, row_ids != nullptr ? static_cast<uint64_t>(row_ids[r]) : 0};
  valid[r] = draw_short_row(weights + r * n, n, k, replacement, uniform, out + r * k);
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
  if (c.short_rows) {
    short_rows_kernel<scalar_t><<<static_cast<unsigned>(c.draw_blocks), static_cast<unsigned>(c.draw_threads), 0,
                                  stream>>>(weights, rows, n, k, replacement, uniforms, seed, offset, seed_ptr,
                                            offset_ptr, row_ids, out, valid);
    return cudaGetLastError();
  }
  if (c.inline_sums) {
    draw_kernel<scalar_t, true, true><<<static_cast<unsigned>(c.draw_blocks), static_cast<unsigned>(c.draw_threads),
                                        state_bytes * kRowsPerDrawBlock, stream>>>(
        weights, rows, n, k, replacement, uniforms, seed, offset, seed_ptr, offset_ptr, row_ids, 0, nullptr, nullptr,
        nullptr, nullptr, out, valid);
    return cudaGetLastError();
  }
  double* sums = scratch;
  auto* positive = reinterpret_cast<unsigned long long*>(scratch + rows * m);
  auto* negative = reinterpret_cast<int*>(scratch + rows * m + rows * c.splits);
  double* state = scratch + rows * m + rows * c.splits * 2;  // the draw state where shared memory is short
  chunk_sums_kernel<scalar_t><<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(c.splits)), kSumThreads, 0,
                                stream>>>(weights, n, c.splits, sums, positive, negative);
  const dim3 grid(static_cast<unsigned>(c.draw_blocks)), block(static_cast<unsigned>(c.draw_threads));
  if (c.shared_state) {
    draw_kernel<scalar_t, false, true><<<grid, block, state_bytes, stream>>>(
        weights, rows, n, k, replacement, uniforms, seed, offset, seed_ptr, offset_ptr, row_ids, c.splits, sums,
        positive, negative, nullptr, out, valid);
  } else {
    draw_kernel<scalar_t, false, false><<<grid, block, 0, stream>>>(
        weights, rows, n, k, replacement, uniforms, seed, offset, seed_ptr, offset_ptr, row_ids, c.splits, sums,
        positive, negative, state, out, valid);
  }
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
