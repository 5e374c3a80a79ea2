// The randomness arguments of the CPU kernels: the seed and offset of a counter-based
// stream as they arrive (an int64 holding the uint64 bits, or a one-element int64
// tensor that holds them: a tensor seed or offset, read here at call time, so a caller
// may advance it in place), and the check of explicit uniforms.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>

namespace ddpd {
namespace cpu {

// The data of an optional tensor argument, or null.
template <typename T>
const T* optional_ptr(const std::optional<at::Tensor>& t) {
  return t ? t->data_ptr<T>() : nullptr;
}

inline uint64_t counter(int64_t value, const std::optional<at::Tensor>& tensor) {
  return static_cast<uint64_t>(tensor ? *tensor->data_ptr<int64_t>() : value);
}

// ValueError unless explicit noise [rows, width] holds uniforms in (0, 1] (0 would give
// a Gumbel variable of -inf, NaN no order at all): one pass, the error names the first
// bad value.
inline void check_noise(const std::optional<at::Tensor>& noise, const char* name = "noise") {
  if (!noise) return;
  const float* u = noise->data_ptr<float>();
  const int64_t n = noise->numel();
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= u[i] > 0.0f && u[i] <= 1.0f;  // false for NaN
  if (ok) return;
  const int64_t width = noise->dim() > 1 ? noise->size(1) : 1;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(u[i] > 0.0f && u[i] <= 1.0f, name, " values must be uniforms in (0, 1], got ", u[i],
                      " at row ", i / width, ", column ", i % width);
  }
}

}  // namespace cpu
}  // namespace ddpd
