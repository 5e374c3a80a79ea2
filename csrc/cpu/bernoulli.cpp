// CPU kernel of ddpd.ops.bernoulli: z = min(u, largest float32 below 1) < p per element,
// u the counter-based uniform of (seed, offset, row id, column) (csrc/rng.h, computed a
// run of columns at a time: uniforms.h) or of explicit noise. The comparison runs in
// double for double p, in float otherwise (16-bit p is exact in float), as in the torch
// reference and the Triton kernel. Rows run in parallel.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <type_traits>

#include "stream.h"
#include "uniforms.h"

namespace ddpd {
namespace cpu {
namespace {

at::Tensor bernoulli_cpu(const at::Tensor& p, const std::optional<at::Tensor>& noise, int64_t seed, int64_t offset,
                         const std::optional<at::Tensor>& row_ids, const std::optional<at::Tensor>& seed_tensor,
                         const std::optional<at::Tensor>& offset_tensor) {
  TORCH_CHECK(p.dim() == 2 && p.is_contiguous(), "bernoulli: p must be a contiguous [N, D] tensor");
  check_noise(noise);
  const int64_t rows = p.size(0), width = p.size(1);
  at::Tensor z = at::empty({rows, width}, p.options().dtype(at::kBool));
  const float* noise_ptr = optional_ptr<float>(noise);
  const int64_t* ids = optional_ptr<int64_t>(row_ids);
  const uint64_t s = counter(seed, seed_tensor), o = counter(offset, offset_tensor);
  bool* out = z.data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, p.scalar_type(), "bernoulli_cpu", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* pp = p.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const RowUniforms u{noise_ptr ? noise_ptr + r * width : nullptr, s, o,
                            static_cast<uint64_t>(ids ? ids[r] : r)};
        for_each_uniform(u, 0, width, [&](int64_t d, float ud) {
          ud = ud < kBelowOne ? ud : kBelowOne;
          out[r * width + d] = static_cast<acc_t>(ud) < static_cast<acc_t>(pp[r * width + d]);
        });
      }
    });
  });
  return z;
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def(
      "bernoulli_cpu(Tensor p, Tensor? noise, int seed, int offset, Tensor? row_ids, Tensor? seed_tensor, "
      "Tensor? offset_tensor) -> Tensor");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("bernoulli_cpu", &ddpd::cpu::bernoulli_cpu); }
