// Launchers of the CUDA kernels of ddpd::compact_fixed and ddpd::scatter_back
// (csrc/cuda/compact.cu). Raw pointers and a stream, so the .cu file compiles with nvcc
// alone (no torch headers); csrc/cuda/compact_binding.cpp binds them to the
// torch.ops.ddpd operators.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddpd {
namespace cuda {

// index[p] = row number of the p-th active row for p < capacity, -1 past the last
// active row; *count = number of active rows (may exceed capacity).
cudaError_t launch_compact_index(const bool* active, int64_t rows, int64_t capacity,
                                 int64_t* index, int64_t* count, cudaStream_t stream);

// dst row r = src row index[r] (row_bytes bytes each), or zeros where index[r] < 0.
cudaError_t launch_gather_rows(const void* src, int64_t row_bytes, const int64_t* index,
                               int64_t out_rows, void* dst, cudaStream_t stream);

// dst row index[r] = src row r wherever 0 <= index[r] < dst_rows.
cudaError_t launch_scatter_rows(const void* src, int64_t row_bytes, const int64_t* index,
                                int64_t rows, void* dst, int64_t dst_rows, cudaStream_t stream);

}  // namespace cuda
}  // namespace ddpd
