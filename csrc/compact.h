// Argument checks and row sizes shared by the CPU and CUDA kernels of
// ddpd::compact_fixed and ddpd::scatter_back, so both devices refuse
// the same inputs with the same messages.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace ddpd {

// Bytes of one row (everything after the first dimension) of t.
inline int64_t row_bytes(const at::Tensor& t) {
  int64_t elements = 1;
  for (int64_t d = 1; d < t.dim(); ++d) elements *= t.size(d);
  return elements * static_cast<int64_t>(t.element_size());
}

inline void check_compact_args(const at::Tensor& active, at::TensorList tensors) {
  TORCH_CHECK(active.dim() == 1 && active.scalar_type() == at::kBool,
              "compact_fixed: active must be a 1-D bool tensor, got ", active.scalar_type(), " ",
              active.sizes());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.layout() == at::kStrided && t.dim() >= 1 && t.size(0) == active.size(0) &&
                    t.device() == active.device(),
                "compact_fixed: tensors[", i, "] must be a dense tensor on ", active.device(), " with ",
                active.size(0), " rows, got ", t.sizes(), " on ", t.device());
  }
}

inline void check_scatter_back_args(const at::Tensor& index, const at::Tensor& packed, const at::Tensor& out) {
  TORCH_CHECK(index.dim() == 1 && index.scalar_type() == at::kLong,
              "scatter_back: index must be a 1-D int64 tensor, got ", index.scalar_type(), " ",
              index.sizes());
  TORCH_CHECK(packed.dim() >= 1 && packed.size(0) == index.size(0) &&
                  packed.scalar_type() == out.scalar_type() && out.dim() == packed.dim() &&
                  packed.sizes().slice(1) == out.sizes().slice(1),
              "scatter_back: packed must be [", index.size(0), ", *out.shape[1:]] of dtype ",
              out.scalar_type(), ", got ", packed.scalar_type(), " ", packed.sizes());
}

}  // namespace ddpd
