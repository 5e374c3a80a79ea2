// CPU kernels of ddpd::multinomial (uniforms from counter-based Philox streams,
// csrc/philox.h) and ddpd::multinomial_with_uniforms (uniforms given): k draws per
// row, with replacement or without (sequential draws, each drawn weight set to
// zero: the successive-sampling law of torch.multinomial(replacement=False)).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>

#include "cdf_rows.h"
#include "counters.h"

namespace ddpd {
namespace cpu {
namespace {

void check_weights(const at::Tensor& weights, int64_t k, bool replacement) {
  TORCH_CHECK(weights.dim() == 2 && weights.size(1) > 0,
              "multinomial: weights must be [B, N] with N > 0, got ", weights.sizes());
  TORCH_CHECK(k >= 1, "multinomial: k must be >= 1, got ", k);
  TORCH_CHECK(replacement || k <= weights.size(1),
              "multinomial: k must be <= N = ", weights.size(1), " without replacement, got ", k);
}

template <typename Uniform>
std::tuple<at::Tensor, at::Tensor> run(const at::Tensor& weights, int64_t k, bool replacement,
                                       const Uniform& uniform) {
  const at::Tensor w = weights.contiguous();
  const int64_t rows = w.size(0), n = w.size(1);
  at::Tensor index = at::empty({rows, k}, w.options().dtype(at::kLong));
  at::Tensor valid = at::empty({rows}, w.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "ddpd::multinomial", [&] {
    sample_rows(w.data_ptr<scalar_t>(), rows, n, k, replacement, uniform,
                index.data_ptr<int64_t>(), valid.data_ptr<bool>());
  });
  return {index, valid};
}

std::tuple<at::Tensor, at::Tensor> multinomial(const at::Tensor& weights, int64_t k,
                                               bool replacement, int64_t seed, int64_t offset,
                                               const at::Tensor& row_ids, const std::optional<at::Tensor>& seed_tensor,
                                               const std::optional<at::Tensor>& offset_tensor) {
  check_weights(weights, k, replacement);
  TORCH_CHECK(row_ids.dim() == 1 && row_ids.size(0) == weights.size(0) &&
                  row_ids.scalar_type() == at::kLong,
              "multinomial: row_ids must be int64 [B] with B = ", weights.size(0));
  const at::Tensor ids = row_ids.contiguous();
  const int64_t* rows = ids.data_ptr<int64_t>();
  const uint64_t s = counter(seed, seed_tensor), o = counter(offset, offset_tensor);
  return run(weights, k, replacement, [=](int64_t r, int64_t d) {
    return draw_uniform(s, o, static_cast<uint64_t>(rows[r]), d);
  });
}

std::tuple<at::Tensor, at::Tensor> multinomial_with_uniforms(const at::Tensor& weights,
                                                             const at::Tensor& uniforms,
                                                             bool replacement) {
  TORCH_CHECK(uniforms.dim() == 2 && uniforms.size(0) == weights.size(0) &&
                  uniforms.scalar_type() == at::kDouble,
              "multinomial: uniforms must be float64 [B, k] with B = ", weights.size(0), ", got ",
              uniforms.scalar_type(), " ", uniforms.sizes());
  const int64_t k = uniforms.size(1);
  check_weights(weights, k, replacement);
  const at::Tensor u = uniforms.contiguous();
  const double* up = u.data_ptr<double>();
  return run(weights, k, replacement, [=](int64_t r, int64_t d) { return up[r * k + d]; });
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_IMPL(ddpd, CPU, m) {
  m.impl("multinomial", &ddpd::cpu::multinomial);
  m.impl("multinomial_with_uniforms", &ddpd::cpu::multinomial_with_uniforms);
}
