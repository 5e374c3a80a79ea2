// CUDA implementations of the torch.ops.ddpd operators of csrc/registration.cpp:
// checks, output allocation and stream handling around the launchers of
// csrc/cuda/launchers.h. Compiled only when torch has CUDA and a toolkit is found.
#include "compact_args.h"
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "launchers.h"

namespace ddpd {
namespace cuda {
namespace {

void check_launch(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, what, ": CUDA launch failed: ", cudaGetErrorString(status));
}

// Shared by the three sampling ops; uniforms [rows, k] float64 or undefined.
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
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t scratch_doubles = multinomial_scratch_doubles(rows, n, replacement, sms);
  at::Tensor scratch = scratch_doubles > 0 ? at::empty({scratch_doubles}, opts.dtype(at::kDouble)) : at::Tensor();
  const at::Tensor u = uniforms.defined() ? uniforms.contiguous() : at::Tensor();
  const at::Tensor ids = row_ids.defined() ? row_ids.contiguous() : at::Tensor();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "ddpd::multinomial", [&] {
    check_launch(launch_multinomial<scalar_t>(
                     w.data_ptr<scalar_t>(), rows, n, k, replacement,
                     u.defined() ? u.data_ptr<double>() : nullptr, seed, offset,
                     seed_tensor.defined() ? seed_tensor.data_ptr<int64_t>() : nullptr,
                     offset_tensor.defined() ? offset_tensor.data_ptr<int64_t>() : nullptr,
                     ids.defined() ? ids.data_ptr<int64_t>() : nullptr,
                     scratch.defined() ? scratch.data_ptr<double>() : nullptr, sms, index.data_ptr<int64_t>(),
                     valid.data_ptr<bool>(), stream),
                 "multinomial");
  });
  return {index, valid};
}

void check_uniforms(const at::Tensor& uniforms, const at::Tensor& weights, int64_t dims) {
  TORCH_CHECK(uniforms.scalar_type() == at::kDouble && uniforms.dim() == dims &&
                  uniforms.size(0) == weights.size(0) && uniforms.device() == weights.device(),
              "multinomial: uniforms must be float64 with ", weights.size(0), " rows on ",
              weights.device(), ", got ", uniforms.scalar_type(), " ", uniforms.sizes(), " on ",
              uniforms.device());
}

std::tuple<at::Tensor, at::Tensor> categorical_from_weights(const at::Tensor& weights,
                                                            const at::Tensor& uniforms) {
  check_uniforms(uniforms, weights, 1);
  auto [index, valid] = sample(weights, 1, true, uniforms.view({-1, 1}), 0, 0, at::Tensor());
  return {index.view({-1}), valid};
}

// A tensor seed or offset: one int64 on the device of weights, read by the kernel.
at::Tensor device_counter(const std::optional<at::Tensor>& t, const at::Tensor& weights, const char* name) {
  if (!t) return at::Tensor();
  TORCH_CHECK(t->numel() == 1 && t->scalar_type() == at::kLong && t->device() == weights.device(), "multinomial: ",
              name, " must be one int64 on the device of weights");
  return t->contiguous();
}

std::tuple<at::Tensor, at::Tensor> multinomial(const at::Tensor& weights, int64_t k, bool replacement,
                                               int64_t seed, int64_t offset, const at::Tensor& row_ids,
                                               const std::optional<at::Tensor>& seed_tensor,
                                               const std::optional<at::Tensor>& offset_tensor) {
  TORCH_CHECK(row_ids.dim() == 1 && row_ids.size(0) == weights.size(0) &&
                  row_ids.scalar_type() == at::kLong && row_ids.device() == weights.device(),
              "multinomial: row_ids must be int64 [B] on the device of weights");
  return sample(weights, k, replacement, at::Tensor(), static_cast<uint64_t>(seed),
                static_cast<uint64_t>(offset), row_ids, device_counter(seed_tensor, weights, "seed"),
                device_counter(offset_tensor, weights, "offset"));
}

std::tuple<at::Tensor, at::Tensor> multinomial_with_uniforms(const at::Tensor& weights,
                                                             const at::Tensor& uniforms,
                                                             bool replacement) {
  check_uniforms(uniforms, weights, 2);
  return sample(weights, uniforms.size(1), replacement, uniforms, 0, 0, at::Tensor());
}

// Packs `out_rows` rows of every tensor by `index` (entries < 0 give zero rows).
std::vector<at::Tensor> gather(at::TensorList tensors, const at::Tensor& index, int64_t out_rows,
                               cudaStream_t stream) {
  std::vector<at::Tensor> packed;
  for (const at::Tensor& t : tensors) {
    const at::Tensor src = t.contiguous();
    std::vector<int64_t> sizes = src.sizes().vec();
    sizes[0] = out_rows;
    at::Tensor dst = at::empty(sizes, src.options());
    check_launch(launch_gather_rows(src.data_ptr(), row_bytes(src), index.data_ptr<int64_t>(),
                                    out_rows, dst.data_ptr(), stream),
                 "compact");
    packed.push_back(dst);
  }
  return packed;
}

std::tuple<std::vector<at::Tensor>, at::Tensor> compact(const at::Tensor& active, at::TensorList tensors) {
  check_compact_args(active, tensors);
  const c10::cuda::CUDAGuard guard(active.device());
  const at::Tensor flags = active.contiguous();
  const int64_t rows = flags.size(0);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor index = at::empty({rows}, flags.options().dtype(at::kLong));
  at::Tensor count = at::empty({}, flags.options().dtype(at::kLong));
  check_launch(launch_compact_index(flags.data_ptr<bool>(), rows, rows, index.data_ptr<int64_t>(),
                                    count.data_ptr<int64_t>(), stream),
               "compact");
  const int64_t n = count.item<int64_t>();  // the one wait: it sizes the outputs
  index = index.narrow(0, 0, n);
  return {gather(tensors, index, n, stream), index};
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
  check_launch(launch_compact_index(flags.data_ptr<bool>(), flags.size(0), capacity,
                                    index.data_ptr<int64_t>(), count.data_ptr<int64_t>(), stream),
               "compact_fixed");
  return {gather(tensors, index, capacity, stream), index, count};
}

at::Tensor& scatter_back(const at::Tensor& index, const at::Tensor& packed, at::Tensor& out) {
  check_scatter_back_args(index, packed, out);
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor idx = index.contiguous(), src = packed.contiguous();
  at::Tensor dense = out.is_contiguous() ? out : out.contiguous();
  check_launch(launch_scatter_rows(src.data_ptr(), row_bytes(src), idx.data_ptr<int64_t>(),
                                   src.size(0), dense.data_ptr(), stream),
               "scatter_back");
  if (!dense.is_same(out)) out.copy_(dense);
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace ddpd

TORCH_LIBRARY_IMPL(ddpd, CUDA, m) {
  m.impl("categorical_from_weights", &ddpd::cuda::categorical_from_weights);
  m.impl("multinomial", &ddpd::cuda::multinomial);
  m.impl("multinomial_with_uniforms", &ddpd::cuda::multinomial_with_uniforms);
  m.impl("compact", &ddpd::cuda::compact);
  m.impl("compact_fixed", &ddpd::cuda::compact_fixed);
  m.impl("scatter_back", &ddpd::cuda::scatter_back);
}
