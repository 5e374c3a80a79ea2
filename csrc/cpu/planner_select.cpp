// CPU paths of ddpd.ops.planner_select and ddpd.ops.planner_select_mask.
//
// Per row of planner logits [B, D], in one pass: p^d = sigmoid(l^d), sum_d p^d
// (the planner's time estimate), stop = all p^d < eps, and k positions without
// replacement by Gumbel-top-k on the log-weights (log sigmoid(l) for option A, l / tau
// for the softmax of option C, relative to the row's largest), uniform d at column d of
// `offset`.
// The fused variant also draws the mask of prop:draw_with_maskD from the same
// probabilities (uniform d at column d of the mask's own offset). Rows run in parallel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "stream.h"
#include "planner_select.h"

namespace ddpd {
namespace cpu {
namespace {

struct SelectArgs {
  int64_t k;
  bool softmax;
  float tau, eps;
  const float* noise;
  const float* mask_noise;
  uint64_t seed, offset, mask_offset;
  const int64_t* row_ids;
};

struct MaskOut {
  const int64_t* x = nullptr;  // null: no mask is drawn
  int64_t mask_id = 0;
  int64_t* masked = nullptr;
  bool* z = nullptr;
  int64_t* count = nullptr;
};

template <typename scalar_t>
void select_rows(const at::Tensor& logits, const SelectArgs& a, int64_t* positions, float* sum_p, bool* stop,
                 const MaskOut& mask) {
  const int64_t rows = logits.size(0), length = logits.size(1);
  const scalar_t* logits_ptr = logits.data_ptr<scalar_t>();
  const int64_t grain = std::max<int64_t>(1, 16384 / length);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> l(length), p(length), base(length), gumbel(length), keys(length);
    std::vector<int64_t> order;
    std::vector<char> forced(length), taken;
    for (int64_t r = begin; r < end; ++r) {
      const uint64_t row_id = static_cast<uint64_t>(a.row_ids ? a.row_ids[r] : r);
      const RowUniforms u{a.noise ? a.noise + r * length : nullptr, a.seed, a.offset, row_id};
      planner_logits(logits_ptr + r * length, length, l.data());
      planner_probabilities(l.data(), length, p.data());
      selection_bases(l.data(), length, a.softmax, base.data());
      double total = 0.0;
      float largest = 0.0f, top = kPlannerNegInf;
      for (int64_t d = 0; d < length; ++d) {
        total += p[d];
        largest = std::max(largest, p[d]);
        top = std::max(top, base[d]);
      }
      sum_p[r] = static_cast<float>(total);
      stop[r] = largest < a.eps;
      int64_t* chosen = positions + r * a.k;
      const float tau = a.softmax ? a.tau : 1.0f;
      if (a.k == 1) {  // the Gumbel-max: gumbel_top_k's keys and choice, in one vector pass
        chosen[0] = gumbel_race_row(base.data(), length, top, tau, &u, 0).index;
      } else {
        for_each_gumbel(u, 0, length, [&](int64_t d, float g) { gumbel[d] = g; });
        gumbel_top_k(base, gumbel, top, tau, a.k, keys, order, taken, chosen);
      }
      if (mask.x) {
        std::fill(forced.begin(), forced.end(), 0);
        // A pick of weight 0 (logit -inf or NaN: chosen only when fewer than k positions
        // have weight) is not denoised, so it is not forced into the mask.
        for (int64_t i = 0; i < a.k; ++i) forced[chosen[i]] = base[chosen[i]] != kPlannerNegInf;
        const RowUniforms mask_u{a.mask_noise ? a.mask_noise + r * length : nullptr, a.seed, a.mask_offset,
                                 row_id};
        mask.count[r] = draw_mask(p.data(), mask_u, forced, mask.x + r * length, mask.mask_id,
                                  length, mask.masked + r * length, mask.z + r * length);
      }
    }
  });
}

// The stream of a call: seed, offset and the mask's offset (ints, or one-element
// tensors holding them).
struct Counters {
  int64_t seed, offset, mask_offset;
  const std::optional<at::Tensor>& seed_tensor;
  const std::optional<at::Tensor>& offset_tensor;
  const std::optional<at::Tensor>& mask_offset_tensor;
};

SelectArgs select_args(int64_t k, bool softmax, double tau, double eps, const std::optional<at::Tensor>& noise,
                       const std::optional<at::Tensor>& mask_noise, const Counters& c,
                       const std::optional<at::Tensor>& row_ids) {
  return {k,
          softmax,
          static_cast<float>(tau),
          static_cast<float>(eps),
          optional_ptr<float>(noise),
          optional_ptr<float>(mask_noise),
          counter(c.seed, c.seed_tensor),
          counter(c.offset, c.offset_tensor),
          counter(c.mask_offset, c.mask_offset_tensor),
          optional_ptr<int64_t>(row_ids)};
}

void run(const at::Tensor& logits, const SelectArgs& a, at::Tensor& positions, at::Tensor& sum_p, at::Tensor& stop,
         const MaskOut& mask) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "logits must be a contiguous [B, D] tensor");
  TORCH_CHECK(a.k >= 1 && a.k <= logits.size(1), "k must be in [1, D]");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "planner_select_cpu", [&] {
    select_rows<scalar_t>(logits, a, positions.data_ptr<int64_t>(), sum_p.data_ptr<float>(),
                          stop.data_ptr<bool>(), mask);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> planner_select_cpu(
    const at::Tensor& logits, int64_t k, bool softmax, double tau, double eps,
    const std::optional<at::Tensor>& noise, int64_t seed, int64_t offset, const std::optional<at::Tensor>& row_ids,
    const std::optional<at::Tensor>& seed_tensor, const std::optional<at::Tensor>& offset_tensor) {
  const auto opts = logits.options();
  at::Tensor positions = at::empty({logits.size(0), k}, opts.dtype(at::kLong));
  at::Tensor sum_p = at::empty({logits.size(0)}, opts.dtype(at::kFloat));
  at::Tensor stop = at::empty({logits.size(0)}, opts.dtype(at::kBool));
  check_noise(noise);
  const Counters c{seed, offset, 0, seed_tensor, offset_tensor, std::nullopt};
  run(logits, select_args(k, softmax, tau, eps, noise, std::nullopt, c, row_ids), positions, sum_p, stop, MaskOut{});
  return {positions, sum_p, stop};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> planner_select_mask_cpu(
    const at::Tensor& logits, const at::Tensor& x, int64_t mask_id, int64_t k, bool softmax, double tau, double eps,
    const std::optional<at::Tensor>& noise, const std::optional<at::Tensor>& mask_noise, int64_t seed,
    int64_t offset, int64_t mask_offset, const std::optional<at::Tensor>& row_ids,
    const std::optional<at::Tensor>& seed_tensor, const std::optional<at::Tensor>& offset_tensor,
    const std::optional<at::Tensor>& mask_offset_tensor) {
  TORCH_CHECK(x.sizes() == logits.sizes() && x.is_contiguous() && x.scalar_type() == at::kLong,
              "x must be a contiguous Long tensor shaped like logits");
  const auto opts = logits.options();
  const int64_t rows = logits.size(0);
  at::Tensor positions = at::empty({rows, k}, opts.dtype(at::kLong));
  at::Tensor sum_p = at::empty({rows}, opts.dtype(at::kFloat));
  at::Tensor stop = at::empty({rows}, opts.dtype(at::kBool));
  at::Tensor masked = at::empty_like(x);
  at::Tensor z = at::empty(x.sizes(), opts.dtype(at::kBool));
  at::Tensor count = at::empty({rows}, opts.dtype(at::kLong));
  const MaskOut mask{x.data_ptr<int64_t>(), mask_id, masked.data_ptr<int64_t>(), z.data_ptr<bool>(),
                     count.data_ptr<int64_t>()};
  check_noise(noise);
  check_noise(mask_noise, "mask_noise");
  const Counters c{seed, offset, mask_offset, seed_tensor, offset_tensor, mask_offset_tensor};
  run(logits, select_args(k, softmax, tau, eps, noise, mask_noise, c, row_ids), positions, sum_p, stop, mask);
  return {positions, sum_p, stop, masked, z, count};
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def(
      "planner_select_cpu(Tensor logits, int k, bool softmax, float tau, float eps, Tensor? noise, int seed, "
      "int offset, Tensor? row_ids, Tensor? seed_tensor, Tensor? offset_tensor) -> (Tensor, Tensor, Tensor)");
  m.def(
      "planner_select_mask_cpu(Tensor logits, Tensor x, int mask_id, int k, bool softmax, float tau, float eps, "
      "Tensor? noise, Tensor? mask_noise, int seed, int offset, int mask_offset, Tensor? row_ids, "
      "Tensor? seed_tensor, Tensor? offset_tensor, Tensor? mask_offset_tensor) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) {
  m.impl("planner_select_cpu", &ddpd::cpu::planner_select_cpu);
  m.impl("planner_select_mask_cpu", &ddpd::cpu::planner_select_mask_cpu);
}
