// Launchers of the plain CUDA kernels in csrc/cuda/*.cu. They take raw pointers
// and a stream, so each .cu file compiles with nvcc alone (no torch headers);
// csrc/cuda/cuda_ops.cpp binds them to the torch.ops.ddpd operators.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddpd {
namespace cuda {

// k draws per row of weights [rows, n] (csrc/chunked_cdf.h), on the grids of
// csrc/multinomial_launch.h for a device of `multiprocessors` SMs.
// uniforms: [rows, k] float64, or null to draw them from (seed, offset, row_ids);
// seed_ptr / offset_ptr: device int64 values that replace seed / offset, or null.
// scratch: multinomial_scratch_doubles(rows, n, replacement, multiprocessors) doubles
// of global memory when that is not 0, else null.
int64_t multinomial_scratch_doubles(int64_t rows, int64_t n, bool replacement, int64_t multiprocessors);

template <typename scalar_t>
cudaError_t launch_multinomial(const scalar_t* weights, int64_t rows, int64_t n, int64_t k,
                               bool replacement, const double* uniforms, uint64_t seed,
                               uint64_t offset, const int64_t* seed_ptr, const int64_t* offset_ptr,
                               const int64_t* row_ids, double* scratch,
                               int64_t multiprocessors, int64_t* out, bool* valid, cudaStream_t stream);

// index[p] = row number of the p-th active row for p < capacity, -1 past the last
// active row; *count = number of active rows (may exceed capacity).
cudaError_t launch_compact_index(const bool* active, int64_t rows, int64_t capacity,
                                 int64_t* index, int64_t* count, cudaStream_t stream);

// dst row r = src row index[r] (row_bytes bytes each), or zeros where index[r] < 0.
cudaError_t launch_gather_rows(const void* src, int64_t row_bytes, const int64_t* index,
                               int64_t out_rows, void* dst, cudaStream_t stream);

// dst row index[r] = src row r wherever index[r] >= 0.
cudaError_t launch_scatter_rows(const void* src, int64_t row_bytes, const int64_t* index,
                                int64_t rows, void* dst, cudaStream_t stream);

}  // namespace cuda
}  // namespace ddpd
