// W floats, doubles or integers in one GCC/Clang vector value, and the lane-wise functions
// that the CPU kernels' vector loops share: the compiler maps the operations onto the SIMD
// width of the function that inlines them (the baseline's, or AVX2's and AVX-512's in the
// paths of vector_math.cpp). The lanes never interact, so a function computes the same bits
// in each lane at any W.
#pragma once

#include <cstdint>
#include <cstring>

#define DDPD_INLINE __attribute__((always_inline)) inline

namespace ddpd {
namespace cpu {

template <int W>
struct Lanes {
  typedef float f32 __attribute__((vector_size(4 * W)));
  typedef double f64 __attribute__((vector_size(8 * W)));
  typedef int32_t i32 __attribute__((vector_size(4 * W)));
  typedef int64_t i64 __attribute__((vector_size(8 * W)));
};

template <int W>
DDPD_INLINE typename Lanes<W>::f32 load_lanes(const float* x) {
  typename Lanes<W>::f32 v;
  std::memcpy(&v, x, sizeof(v));
  return v;
}

// exp(y) lane-wise for y <= 0 (y = -inf allowed), within 2 ulp, in float; values below
// exp(-87) flush to 0, which cannot move a log-sum-exp whose largest term is 1.
template <int W>
DDPD_INLINE typename Lanes<W>::f32 exp_nonpositive(typename Lanes<W>::f32 y) {
  using f32 = typename Lanes<W>::f32;
  using i32 = typename Lanes<W>::i32;
  const f32 low = f32{} - 100.0f;  // y = -inf would give NaN below: clamp first
  y = y > low ? y : low;
  const i32 n = __builtin_convertvector(y * 1.44269504088896341f - 0.5f, i32);  // round, y <= 0
  const f32 nf = __builtin_convertvector(n, f32);
  // ln 2 split in a short high part (nf * hi is exact) and the rest.
  const f32 r = y - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
  // Taylor series of exp(r), |r| <= ln2 / 2, Horner form (truncation error < 1e-8).
  f32 p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const f32 scale = reinterpret_cast<f32>((n + 127) << 23);
  return n > -126 ? p * scale : f32{};
}

// Lane-wise (v - m) / t for v <= m: exactly 0 where v == m (+inf == +inf too, not NaN),
// -inf where v is -inf (shift in sample_categorical.h, for a scalar maximum m).
template <int W>
DDPD_INLINE typename Lanes<W>::f32 shift_lanes(typename Lanes<W>::f32 v, float m, float t) {
  using f32 = typename Lanes<W>::f32;
  const f32 zero = {}, neg_inf = zero - __builtin_inff();
  // NaN at inf - inf is replaced just below. At t = 1 the division, exact there and the
  // dearest operation of the loops that call this, is left out (loop-invariant: -O3 unswitches).
  f32 y = t == 1.0f ? v - m : (v - m) / t;
  y = v == m ? zero : y;
  return v == neg_inf ? neg_inf : y;
}

}  // namespace cpu
}  // namespace ddpd
