// Argument checks and row sizes shared by the CPU and CUDA kernels of
// ddpd::compact_fixed and ddpd::scatter_back, so both devices refuse
// the same inputs with the same messages.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace ddpd {

// Whether the elements of a and b may share bytes: their byte ranges [lowest address,
// highest address + element size) intersect. Conservative, and it needs no shared
// storage, so it also catches two storages over the same memory (from_numpy views).
inline bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto span = [](const at::Tensor& t, uintptr_t& low, uintptr_t& high) {
    int64_t last = 0;  // offset in elements of the highest element (strides are >= 0)
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    low = reinterpret_cast<uintptr_t>(t.const_data_ptr());
    high = low + static_cast<uintptr_t>((last + 1) * t.element_size());
  };
  uintptr_t a_low, a_high, b_low, b_high;
  span(a, a_low, a_high);
  span(b, b_low, b_high);
  return a_low < b_high && b_low < a_high;
}

// packed as the scatter_back kernels read it: dense, and a copy of its own where it
// shares bytes with `dense_out`, because the kernels write rows in parallel and must
// not read a row already overwritten.
inline at::Tensor scatter_source(const at::Tensor& packed, const at::Tensor& dense_out) {
  at::Tensor src = packed.contiguous();
  return may_overlap(src, dense_out) ? src.clone() : src;
}

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
  // the dispatcher picks the CUDA kernel if any of the three is on the GPU: a host index
  // would be read by the device
  TORCH_CHECK(index.device() == out.device() && packed.device() == out.device(),
              "scatter_back: index and packed must be on ", out.device(), " like out, got ", index.device(),
              " and ", packed.device());
}

}  // namespace ddpd
