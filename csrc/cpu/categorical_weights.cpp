// CPU kernel of ddpd::categorical_from_weights: one inverse-CDF draw per row of
// non-negative weights with a given uniform (law: csrc/chunked_cdf.h).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>

#include "cdf_rows.h"

namespace ddpd {
namespace cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> categorical_from_weights(const at::Tensor& weights,
                                                            const at::Tensor& uniforms) {
  TORCH_CHECK(weights.dim() == 2 && weights.size(1) > 0,
              "categorical_from_weights: weights must be [B, N] with N > 0, got ", weights.sizes());
  TORCH_CHECK(uniforms.dim() == 1 && uniforms.size(0) == weights.size(0),
              "categorical_from_weights: uniforms must be [B] with B = ", weights.size(0), ", got ",
              uniforms.sizes());
  TORCH_CHECK(uniforms.scalar_type() == at::kDouble,
              "categorical_from_weights: uniforms must be float64, got ", uniforms.scalar_type());
  const at::Tensor w = weights.contiguous(), u = uniforms.contiguous();
  const int64_t rows = w.size(0), n = w.size(1);
  at::Tensor index = at::empty({rows}, w.options().dtype(at::kLong));
  at::Tensor valid = at::empty({rows}, w.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "ddpd::categorical_from_weights", [&] {
    const double* up = u.data_ptr<double>();
    sample_rows(w.data_ptr<scalar_t>(), rows, n, 1, true,
                [up](int64_t r, int64_t) { return up[r]; }, index.data_ptr<int64_t>(),
                valid.data_ptr<bool>());
  });
  return {index, valid};
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_IMPL(ddpd, CPU, m) {
  m.impl("categorical_from_weights", &ddpd::cpu::categorical_from_weights);
}
