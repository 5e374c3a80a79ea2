// The bindings' one check of a CUDA runtime call: the op, what it was doing, the error.
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace ddpd {
namespace cuda {

inline void check_cuda(cudaError_t status, const char* op, const char* action) {
  TORCH_CHECK(status == cudaSuccess, op, ": ", action, " failed: ", cudaGetErrorString(status));
}

}  // namespace cuda
}  // namespace ddpd
