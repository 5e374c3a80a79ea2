// Schemas of the torch.ops.ddpd operators defined by ddpd._C. Kernels register
// per device with TORCH_LIBRARY_IMPL (csrc/cpu/*.cpp, csrc/cuda/*.cpp); ops that
// live in other files declare their schemas with TORCH_LIBRARY_FRAGMENT(ddpd, m).
// Python wrappers with validation and a torch reference: ddpd/ops/*.py.
#include <torch/library.h>

#include <vector>

#include "multinomial_launch.h"

namespace {

// The CUDA multinomial's launch configuration for a device of `multiprocessors`
// SMs, computed by the code the CUDA launcher runs (any build can report it):
// [inline_sums, splits, sum_blocks, draw_blocks, draw_threads, shared_state].
std::vector<int64_t> multinomial_launch_config(int64_t rows, int64_t n, bool replacement, int64_t multiprocessors) {
  const ddpd::MultinomialLaunch c = ddpd::multinomial_launch(rows, n, replacement, multiprocessors);
  return {c.inline_sums, c.splits, c.sum_blocks, c.draw_blocks, c.draw_threads, c.shared_state};
}

}  // namespace

TORCH_LIBRARY(ddpd, m) {
  // ddpd/ops/categorical_weights.py: one inverse-CDF draw per row -> (index, valid).
  m.def("categorical_from_weights(Tensor weights, Tensor uniforms) -> (Tensor, Tensor)");
  // ddpd/ops/multinomial.py: k draws per row from counter-based Philox streams
  // (seed and offset are uint64 carried in int64, or one-element int64 tensors on the
  // device of weights that hold them) or from given uniforms.
  m.def(
      "multinomial(Tensor weights, int k, bool replacement, int seed, int offset, "
      "Tensor row_ids, Tensor? seed_tensor=None, Tensor? offset_tensor=None) -> (Tensor, Tensor)");
  m.def("multinomial_with_uniforms(Tensor weights, Tensor uniforms, bool replacement) -> (Tensor, Tensor)");
  m.def("multinomial_launch(int rows, int n, bool replacement, int multiprocessors) -> int[]",
        &multinomial_launch_config);
  // ddpd/ops/compact.py: pack the active rows, and write packed rows back.
  m.def("compact(Tensor active, Tensor[] tensors) -> (Tensor[], Tensor)");
  m.def("compact_fixed(Tensor active, int capacity, Tensor[] tensors) -> (Tensor[], Tensor, Tensor)");
  m.def("scatter_back(Tensor index, Tensor packed, Tensor(a!) out) -> Tensor(a!)");
}
