// CUDA implementation of ddpd::multinomial_kernel, the kernel of ddpd::multinomial and
// ddpd::categorical_from_weights (schema: csrc/cpu/multinomial.cpp): checks, output
// allocation and stream handling around the launcher of csrc/cuda/multinomial.cuh.
// Compiled only when torch has CUDA and a toolkit is found. Only c10's CUDA headers
// (no ATen/cuda, which pulls in cuSPARSE and cuBLAS): .ci/nvcc_check.sh can check it.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "check.h"
#include "multinomial.cuh"

namespace ddpd {
namespace cuda {
namespace {

// Streaming multiprocessors of a device: what the launch grids are sized for.
int64_t multiprocessors(int device) {
  int count = 0;
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "multinomial",
             "reading the multiprocessor count");
  return count;
}

// uniforms [rows, k] float64, or undefined for the Philox streams.
std::tuple<at::Tensor, at::Tensor> sample(const at::Tensor& weights, int64_t k, bool replacement,
                                          const at::Tensor& uniforms, uint64_t seed, uint64_t offset,
                                          const at::Tensor& row_ids, const at::Tensor& seed_tensor = at::Tensor(),
                                          const at::Tensor& offset_tensor = at::Tensor()) {
  TORCH_CHECK(weights.dim() == 2 && weights.size(1) > 0,
              "multinomial: weights must be [B, N] with N > 0, got ", weights.sizes());
  TORCH_CHECK(k >= 1 && (replacement || k <= weights.size(1)), "multinomial: invalid k = ", k,
              " for N = ", weights.size(1), replacement ? " with" : " without", " replacement");
  const c10::cuda::CUDAGuard guard(weights.device());
  const at::Tensor w = weights.contiguous();
  const int64_t rows = w.size(0), n = w.size(1);
  const auto opts = w.options();
  at::Tensor index = at::empty({rows, k}, opts.dtype(at::kLong));
  at::Tensor valid = at::empty({rows}, opts.dtype(at::kBool));
  const int64_t sms = multiprocessors(weights.device().index());
  const int64_t scratch_doubles = multinomial_scratch_doubles(rows, n, replacement, sms);
  at::Tensor scratch = scratch_doubles > 0 ? at::empty({scratch_doubles}, opts.dtype(at::kDouble)) : at::Tensor();
  const at::Tensor u = uniforms.defined() ? uniforms.contiguous() : at::Tensor();
  const at::Tensor ids = row_ids.defined() ? row_ids.contiguous() : at::Tensor();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "ddpd::multinomial", [&] {
    check_cuda(launch_multinomial<scalar_t>(
                   w.data_ptr<scalar_t>(), rows, n, k, replacement,
                   u.defined() ? u.data_ptr<double>() : nullptr, seed, offset,
                   seed_tensor.defined() ? seed_tensor.data_ptr<int64_t>() : nullptr,
                   offset_tensor.defined() ? offset_tensor.data_ptr<int64_t>() : nullptr,
                   ids.defined() ? ids.data_ptr<int64_t>() : nullptr,
                   scratch.defined() ? scratch.data_ptr<double>() : nullptr, sms, index.data_ptr<int64_t>(),
                   valid.data_ptr<bool>(), stream),
               "multinomial", "CUDA launch");
  });
  return {index, valid};
}

// A tensor seed or offset: one int64 on the device of weights, read by the kernel.
at::Tensor device_counter(const std::optional<at::Tensor>& t, const at::Tensor& weights, const char* name) {
  if (!t) return at::Tensor();
  TORCH_CHECK(t->numel() == 1 && t->scalar_type() == at::kLong && t->device() == weights.device(), "multinomial: ",
              name, " must be one int64 on the device of weights");
  return t->contiguous();
}

// The CUDA implementation of ddpd::multinomial_kernel (csrc/cpu/multinomial.cpp).
std::tuple<at::Tensor, at::Tensor> multinomial_kernel(const at::Tensor& weights, int64_t k, bool replacement,
                                                      const std::optional<at::Tensor>& uniforms, int64_t seed,
                                                      int64_t offset, const std::optional<at::Tensor>& row_ids,
                                                      const std::optional<at::Tensor>& seed_tensor,
                                                      const std::optional<at::Tensor>& offset_tensor) {
  if (uniforms) {
    TORCH_CHECK(uniforms->scalar_type() == at::kDouble && uniforms->dim() == 2 &&
                    uniforms->size(0) == weights.size(0) && uniforms->size(1) == k &&
                    uniforms->device() == weights.device(),
                "multinomial: uniforms must be float64 [", weights.size(0), ", ", k, "] on ", weights.device(),
                ", got ", uniforms->scalar_type(), " ", uniforms->sizes(), " on ", uniforms->device());
    return sample(weights, k, replacement, *uniforms, 0, 0, at::Tensor());
  }
  TORCH_CHECK(row_ids && row_ids->dim() == 1 && row_ids->size(0) == weights.size(0) &&
                  row_ids->scalar_type() == at::kLong && row_ids->device() == weights.device(),
              "multinomial: row_ids must be int64 [B] on the device of weights");
  return sample(weights, k, replacement, at::Tensor(), static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                *row_ids, device_counter(seed_tensor, weights, "seed"),
                device_counter(offset_tensor, weights, "offset"));
}

}  // namespace
}  // namespace cuda
}  // namespace ddpd

TORCH_LIBRARY_IMPL(ddpd, CUDA, m) { m.impl("multinomial_kernel", &ddpd::cuda::multinomial_kernel); }
