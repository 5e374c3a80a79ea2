// CUDA implementations of ddpd::compact_fixed and ddpd::scatter_back (the ops
// compact_fixed_kernel and scatter_back_kernel)
// (schemas: csrc/cpu/compact.cpp): checks, output allocation and stream handling
// around the launchers of csrc/cuda/compact.cuh. Compiled only when torch has CUDA and
// a toolkit is found; only c10's CUDA headers, so .ci/nvcc_check.sh can check it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "../compact.h"
#include "check.h"
#include "compact.cuh"

namespace ddpd {
namespace cuda {
namespace {

// Packs `out_rows` rows of every tensor by `index` (entries < 0 give zero rows).
std::vector<at::Tensor> gather(at::TensorList tensors, const at::Tensor& index, int64_t out_rows,
                               cudaStream_t stream) {
  std::vector<at::Tensor> packed;
  for (const at::Tensor& t : tensors) {
    const at::Tensor src = t.contiguous();
    std::vector<int64_t> sizes = src.sizes().vec();
    sizes[0] = out_rows;
    at::Tensor dst = at::empty(sizes, src.options());
    check_cuda(launch_gather_rows(src.data_ptr(), row_bytes(src), index.data_ptr<int64_t>(),
                                  out_rows, dst.data_ptr(), stream),
               "compact_fixed", "CUDA launch");
    packed.push_back(dst);
  }
  return packed;
}

std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor> compact_fixed(const at::Tensor& active,
                                                                          int64_t capacity,
                                                                          at::TensorList tensors) {
  check_compact_args(active, tensors);
  TORCH_CHECK(capacity >= 0, "compact_fixed: capacity must be >= 0, got ", capacity);
  const c10::cuda::CUDAGuard guard(active.device());
  const at::Tensor flags = active.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor index = at::empty({capacity}, flags.options().dtype(at::kLong));
  at::Tensor count = at::empty({}, flags.options().dtype(at::kLong));
  check_cuda(launch_compact_index(flags.data_ptr<bool>(), flags.size(0), capacity,
                                  index.data_ptr<int64_t>(), count.data_ptr<int64_t>(), stream),
             "compact_fixed", "CUDA launch");
  return {gather(tensors, index, capacity, stream), index, count};
}

at::Tensor& scatter_back(const at::Tensor& index, const at::Tensor& packed, at::Tensor& out) {
  check_scatter_back_args(index, packed, out);
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor idx = index.contiguous();
  at::Tensor dense = out.is_contiguous() ? out : out.contiguous();
  const at::Tensor src = scatter_source(packed, dense);
  check_cuda(launch_scatter_rows(src.data_ptr(), row_bytes(src), idx.data_ptr<int64_t>(),
                                 src.size(0), dense.data_ptr(), dense.size(0), stream),
             "scatter_back", "CUDA launch");
  if (!dense.is_same(out)) out.copy_(dense);
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace ddpd

TORCH_LIBRARY_IMPL(ddpd, CUDA, m) {
  m.impl("compact_fixed_kernel", &ddpd::cuda::compact_fixed);
  m.impl("scatter_back_kernel", &ddpd::cuda::scatter_back);
}
