// The seed and offset of a counter-based stream as the CPU kernels receive them: an
// int64 holding the uint64 bits, or a one-element int64 tensor that holds them (a
// tensor seed or offset, read here at call time, so a caller may advance it in place).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace ddpd {
namespace cpu {

inline uint64_t counter(int64_t value, const std::optional<at::Tensor>& tensor) {
  return static_cast<uint64_t>(tensor ? *tensor->data_ptr<int64_t>() : value);
}

}  // namespace cpu
}  // namespace ddpd
