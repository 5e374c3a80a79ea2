// Launcher of the CUDA kernels of ddpd::multinomial (csrc/cuda/multinomial.cu). Raw
// pointers and a stream, so the .cu file compiles with nvcc alone (no torch headers);
// csrc/cuda/multinomial_binding.cpp binds it to the torch.ops.ddpd operators.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddpd {
namespace cuda {

// k draws per row of weights [rows, n] by the law of csrc/multinomial.h, on the grids of
// its multinomial_launch for a device of `multiprocessors` SMs.
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

}  // namespace cuda
}  // namespace ddpd
