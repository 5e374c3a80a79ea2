// CUDA kernels of ddpd::compact_fixed and ddpd::scatter_back.
//
// compact_index: one block scans the active flags tile by tile (warp ballots, then
// a scan of the per-warp counts), writing the row numbers of the active rows in
// order, -1 padding and the count, all on the device. gather_rows/scatter_rows
// then move whole rows as raw bytes, in 16-, 4- or 1-byte words depending on the
// row size and alignment, so any dtype and trailing shape is handled.
#include <cstdint>
#include <type_traits>

#include "compact.cuh"

namespace ddpd {
namespace cuda {
namespace {

constexpr int kScanThreads = 1024;  // a multiple of 32, at most 32 warps
constexpr int kCopyThreads = 256;
constexpr int64_t kMaxCopyBlocks = 4096;

__global__ void __launch_bounds__(kScanThreads)
    compact_index_kernel(const bool* __restrict__ active, int64_t rows, int64_t capacity,
                         int64_t* __restrict__ index, int64_t* __restrict__ count) {
  __shared__ int64_t warp_end[32];  // inclusive scan of the per-warp counts of a tile
  __shared__ int64_t carry;         // active rows in the tiles before
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < rows; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool flag = i < rows && active[i];
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) warp_end[warp] = __popc(ballot);
    __syncthreads();
    if (warp == 0) {
      int64_t v = lane < warps ? warp_end[lane] : 0;
      for (int d = 1; d < 32; d <<= 1) {
        const int64_t up = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += up;
      }
      if (lane < warps) warp_end[lane] = v;
    }
    __syncthreads();
    const int64_t slot = carry + (warp > 0 ? warp_end[warp - 1] : 0) + __popc(ballot & ((1u << lane) - 1u));
    if (flag && slot < capacity) index[slot] = i;
    __syncthreads();  // everyone has read carry and warp_end
    if (threadIdx.x == 0) carry += warp_end[warps - 1];
    __syncthreads();
  }
  for (int64_t p = carry + threadIdx.x; p < capacity; p += blockDim.x) index[p] = -1;
  if (threadIdx.x == 0) *count = carry;
}

template <typename word_t>
__global__ void gather_rows_kernel(const word_t* __restrict__ src, int64_t row_words,
                                   const int64_t* __restrict__ index, int64_t out_rows,
                                   word_t* __restrict__ dst) {
  const int64_t total = out_rows * row_words;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / row_words, c = e - r * row_words;
    const int64_t from = index[r];
    dst[e] = from >= 0 ? src[from * row_words + c] : word_t{};
  }
}

template <typename word_t>
__global__ void scatter_rows_kernel(const word_t* __restrict__ src, int64_t row_words,
                                    const int64_t* __restrict__ index, int64_t rows,
                                    word_t* __restrict__ dst, int64_t dst_rows) {
  const int64_t total = rows * row_words;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / row_words, c = e - r * row_words;
    const int64_t to = index[r];
    // an index past dst is skipped, not written: checking it on the host would wait for the device
    if (to >= 0 && to < dst_rows) dst[to * row_words + c] = src[e];
  }
}

unsigned copy_blocks(int64_t words) {
  const int64_t blocks = (words + kCopyThreads - 1) / kCopyThreads;
  return static_cast<unsigned>(blocks < kMaxCopyBlocks ? (blocks > 0 ? blocks : 1) : kMaxCopyBlocks);
}

// Widest word that divides the row size and the alignment of both pointers.
int word_bytes(const void* a, const void* b, int64_t row_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                        static_cast<uint64_t>(row_bytes);
  if (bits % 16 == 0) return 16;
  if (bits % 4 == 0) return 4;
  return 1;
}

template <typename word_t, typename Launch>
cudaError_t launch_words(int64_t rows, int64_t row_bytes, Launch launch) {
  const int64_t row_words = row_bytes / static_cast<int64_t>(sizeof(word_t));
  if (rows == 0 || row_words == 0) return cudaSuccess;
  launch(static_cast<word_t*>(nullptr), row_words, copy_blocks(rows * row_words));
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_compact_index(const bool* active, int64_t rows, int64_t capacity,
                                 int64_t* index, int64_t* count, cudaStream_t stream) {
  compact_index_kernel<<<1, kScanThreads, 0, stream>>>(active, rows, capacity, index, count);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const void* src, int64_t row_bytes, const int64_t* index,
                               int64_t out_rows, void* dst, cudaStream_t stream) {
  auto run = [&](auto word, int64_t row_words, unsigned blocks) {
    using word_t = std::remove_pointer_t<decltype(word)>;
    gather_rows_kernel<word_t><<<blocks, kCopyThreads, 0, stream>>>(
        static_cast<const word_t*>(src), row_words, index, out_rows, static_cast<word_t*>(dst));
  };
  switch (word_bytes(src, dst, row_bytes)) {
    case 16: return launch_words<uint4>(out_rows, row_bytes, run);
    case 4: return launch_words<uint32_t>(out_rows, row_bytes, run);
    default: return launch_words<unsigned char>(out_rows, row_bytes, run);
  }
}

cudaError_t launch_scatter_rows(const void* src, int64_t row_bytes, const int64_t* index,
                                int64_t rows, void* dst, int64_t dst_rows, cudaStream_t stream) {
  auto run = [&](auto word, int64_t row_words, unsigned blocks) {
    using word_t = std::remove_pointer_t<decltype(word)>;
    scatter_rows_kernel<word_t><<<blocks, kCopyThreads, 0, stream>>>(
        static_cast<const word_t*>(src), row_words, index, rows, static_cast<word_t*>(dst), dst_rows);
  };
  switch (word_bytes(src, dst, row_bytes)) {
    case 16: return launch_words<uint4>(rows, row_bytes, run);
    case 4: return launch_words<uint32_t>(rows, row_bytes, run);
    default: return launch_words<unsigned char>(rows, row_bytes, run);
  }
}

}  // namespace cuda
}  // namespace ddpd
