// CPU path of ddpd.ops.planner_mask: the mask of prop:draw_with_maskD,
// z^d ~ Bernoulli(sigmoid(l^d)) (z^d = min(u^d, kBelowOne) < p^d, uniform d at column d) with
// the given positions always masked; the masked sequence holds mask_id where
// z = 1 and x elsewhere. Rows run in parallel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "stream.h"
#include "planner_select.h"

namespace ddpd {
namespace cpu {
namespace {

template <typename scalar_t>
void mask_rows(const at::Tensor& logits, const at::Tensor& x, const std::optional<at::Tensor>& positions,
               int64_t mask_id, const float* noise, uint64_t seed, uint64_t offset, const int64_t* row_ids,
               at::Tensor& masked, at::Tensor& z, at::Tensor& count) {
  const int64_t rows = logits.size(0), length = logits.size(1);
  const int64_t k = positions ? positions->size(1) : 0;
  const int64_t* chosen = optional_ptr<int64_t>(positions);
  const scalar_t* logits_ptr = logits.data_ptr<scalar_t>();
  const int64_t grain = std::max<int64_t>(1, 16384 / length);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> l(length), p(length);
    std::vector<char> forced(length);
    for (int64_t r = begin; r < end; ++r) {
      planner_logits(logits_ptr + r * length, length, l.data());
      planner_probabilities(l.data(), length, p.data());
      std::fill(forced.begin(), forced.end(), 0);
      for (int64_t i = 0; i < k; ++i) forced[chosen[r * k + i]] = 1;
      const RowUniforms u{noise ? noise + r * length : nullptr, seed, offset,
                              static_cast<uint64_t>(row_ids ? row_ids[r] : r)};
      count.data_ptr<int64_t>()[r] =
          draw_mask(p.data(), u, forced, x.data_ptr<int64_t>() + r * length, mask_id, length,
                    masked.data_ptr<int64_t>() + r * length, z.data_ptr<bool>() + r * length);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> planner_mask_cpu(
    const at::Tensor& logits, const at::Tensor& x, const std::optional<at::Tensor>& positions, int64_t mask_id,
    const std::optional<at::Tensor>& noise, int64_t seed, int64_t offset, const std::optional<at::Tensor>& row_ids,
    const std::optional<at::Tensor>& seed_tensor, const std::optional<at::Tensor>& offset_tensor) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "logits must be a contiguous [B, D] tensor");
  TORCH_CHECK(x.sizes() == logits.sizes() && x.is_contiguous() && x.scalar_type() == at::kLong,
              "x must be a contiguous Long tensor shaped like logits");
  if (positions) {  // one pass over B x k integers: the op's range check
    const int64_t* chosen = positions->data_ptr<int64_t>();
    for (int64_t i = 0; i < positions->numel(); ++i) {
      TORCH_CHECK_VALUE(chosen[i] >= 0 && chosen[i] < logits.size(1), "positions must be in [0, ", logits.size(1),
                        "), got ", chosen[i]);
    }
  }
  check_noise(noise);
  at::Tensor masked = at::empty_like(x);
  at::Tensor z = at::empty(x.sizes(), x.options().dtype(at::kBool));
  at::Tensor count = at::empty({x.size(0)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "planner_mask_cpu", [&] {
    mask_rows<scalar_t>(logits, x, positions, mask_id, optional_ptr<float>(noise),
                        counter(seed, seed_tensor), counter(offset, offset_tensor),
                        optional_ptr<int64_t>(row_ids), masked, z, count);
  });
  return {masked, z, count};
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def(
      "planner_mask_cpu(Tensor logits, Tensor x, Tensor? positions, int mask_id, Tensor? noise, int seed, "
      "int offset, Tensor? row_ids, Tensor? seed_tensor, Tensor? offset_tensor) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("planner_mask_cpu", &ddpd::cpu::planner_mask_cpu); }
