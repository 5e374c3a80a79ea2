// vector_math.h's functions. One algorithm, written once on vector types of W lanes
// (lanes.h) and compiled three times: W = 16 with AVX-512, W = 8 with AVX2, W = 4 for any
// x86-64 or aarch64 CPU. The lanes never interact, so each lane computes the same bits at any W.
//
// log x: x = 2^k m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(f), f = (m - 1) / (m + 1),
// |f| <= 0.172, by its series to f^15 (the next term is below 3e-14 of the sum).
// exp x: k = round(x / ln 2), r = x - k ln 2 in [-0.35, 0.35], exp r by its Taylor series
// to r^13 (the next term below 5e-18), times 2^k; x first clamped to [-200, 200], where the
// float result is already 0 or inf.
#include "vector_math.h"

#include "lanes.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstring>

// The lane functions pass vectors by value; they are always inlined, so no call passes them
// through the ABI that GCC warns about for vectors wider than the baseline's.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ddpd {
namespace cpu {
namespace {

constexpr double kLn2 = 0.69314718055994530942;

template <int W>
DDPD_INLINE typename Lanes<W>::f32 log_lanes(typename Lanes<W>::f32 x) {
  using f32 = typename Lanes<W>::f32;
  using f64 = typename Lanes<W>::f64;
  using i32 = typename Lanes<W>::i32;
  const i32 subnormal = reinterpret_cast<i32>(x) < 0x00800000;  // x > 0: scaled by 2^23 first
  x = subnormal ? x * 8388608.0f : x;
  const i32 bits = reinterpret_cast<i32>(x);
  const i32 k = (bits - 0x3f3504f3) >> 23;  // 0x3f3504f3: sqrt(1/2); arithmetic shift
  const f64 m = __builtin_convertvector(reinterpret_cast<f32>(bits - (k << 23)), f64);
  const f64 f = (m - 1.0) / (m + 1.0), s = f * f;
  f64 p = s * (1.0 / 15) + 1.0 / 13;
  p = p * s + 1.0 / 11;
  p = p * s + 1.0 / 9;
  p = p * s + 1.0 / 7;
  p = p * s + 1.0 / 5;
  p = p * s + 1.0 / 3;
  p = p * s + 1.0;
  const f64 log_x = __builtin_convertvector(k + (subnormal & -23), f64) * kLn2 + 2.0 * f * p;
  const f32 inf = f32{} + __builtin_inff();
  return x == inf ? inf : __builtin_convertvector(log_x, f32);
}

template <int W>
DDPD_INLINE typename Lanes<W>::f32 exp_lanes(typename Lanes<W>::f32 x) {
  using f32 = typename Lanes<W>::f32;
  using f64 = typename Lanes<W>::f64;
  using i64 = typename Lanes<W>::i64;
  // Clamped in float: compared after the conversion, GCC compiled the clamp lane by lane.
  const f32 low = f32{} - 200.0f, high = f32{} + 200.0f;
  x = x < low ? low : x;
  x = x > high ? high : x;
  const f64 xd = __builtin_convertvector(x, f64);
  const f64 round = f64{} + 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const f64 k = (xd * 1.4426950408889634 + round) - round;
  const f64 r = xd - k * kLn2;
  f64 p = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^k: k + 2^52 + 1023 holds k + 1023 in its low bits (|k| <= 289), shifted to the exponent
  const i64 biased = reinterpret_cast<i64>(k + 4503599627371519.0);
  return __builtin_convertvector(p * reinterpret_cast<f64>(biased << 52), f32);
}

template <int W, VectorFn F>
DDPD_INLINE typename Lanes<W>::f32 apply_lanes(typename Lanes<W>::f32 x) {
  using f32 = typename Lanes<W>::f32;
  const f32 zero = {}, one = zero + 1.0f;
  if constexpr (F == VectorFn::kLog) {
    return log_lanes<W>(x);
  } else if constexpr (F == VectorFn::kExp) {
    return exp_lanes<W>(x);
  } else if constexpr (F == VectorFn::kGumbel) {
    const f32 below_one = zero + kBelowOne;
    return -log_lanes<W>(-log_lanes<W>(x < below_one ? x : below_one));
  } else if constexpr (F == VectorFn::kSigmoid) {
    return one / (one + exp_lanes<W>(-x));
  } else {
    const f32 abs = x < zero ? -x : x;
    return (x < zero ? x : zero) - log_lanes<W>(one + exp_lanes<W>(-abs));
  }
}

template <int W, VectorFn F>
DDPD_INLINE void apply_run(const float* x, int64_t n, float* out) {
  using f32 = typename Lanes<W>::f32;
  f32 v;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    std::memcpy(&v, x + i, sizeof(v));
    v = apply_lanes<W, F>(v);
    std::memcpy(out + i, &v, sizeof(v));
  }
  if (i == n) return;
  float lanes[W];
  for (int64_t j = 0; j < W; ++j) lanes[j] = i + j < n ? x[i + j] : 1.0f;  // 1: in every domain
  std::memcpy(&v, lanes, sizeof(v));
  v = apply_lanes<W, F>(v);
  std::memcpy(lanes, &v, sizeof(v));
  for (int64_t j = 0; i + j < n; ++j) out[i + j] = lanes[j];
}

template <int W>
DDPD_INLINE void apply(VectorFn fn, const float* x, int64_t n, float* out) {
  switch (fn) {
    case VectorFn::kLog: return apply_run<W, VectorFn::kLog>(x, n, out);
    case VectorFn::kExp: return apply_run<W, VectorFn::kExp>(x, n, out);
    case VectorFn::kGumbel: return apply_run<W, VectorFn::kGumbel>(x, n, out);
    case VectorFn::kSigmoid: return apply_run<W, VectorFn::kSigmoid>(x, n, out);
    case VectorFn::kLogSigmoid: return apply_run<W, VectorFn::kLogSigmoid>(x, n, out);
  }
}

// tile_exp_sums at width W: kSumLanes lane sums whatever W, so that every path adds the
// same values in the same order (W = 4 and 8 hold them in 4 and 2 vectors).
template <int W>
DDPD_INLINE TileSums exp_sums(const float* x, int64_t n, float m, float t, bool entropy) {
  using f32 = typename Lanes<W>::f32;
  constexpr int kVectors = kSumLanes / W;
  const f32 zero = {};
  f32 sum[kVectors], ent[kVectors];
  for (int v = 0; v < kVectors; ++v) sum[v] = ent[v] = zero;
  for (int64_t j = 0; j < n; j += kSumLanes) {
    for (int v = 0; v < kVectors; ++v) {
      const f32 y = shift_lanes<W>(load_lanes<W>(x + j + v * W), m, t);
      const f32 e = exp_nonpositive<W>(y);
      sum[v] += e;
      if (entropy) ent[v] += e > zero ? e * y : zero;  // 0 * -inf would be NaN
    }
  }
  TileSums s{0.0f, 0.0f};
  for (int v = 0; v < kVectors; ++v) {
    for (int l = 0; l < W; ++l) {
      s.sum += sum[v][l];
      s.ent += ent[v][l];
    }
  }
  return s;
}

// gumbel_race at width W: each lane keeps the first best key of the columns it sees (j = l
// mod W, in order), then the lanes' best keys meet, the lowest column winning a tie.
template <int W>
DDPD_INLINE RaceWinner race(const float* x, const float* u, int64_t n, float m, float t) {
  using f32 = typename Lanes<W>::f32;
  using i32 = typename Lanes<W>::i32;
  const f32 neg_inf = f32{} - __builtin_inff();
  i32 lane;
  for (int l = 0; l < W; ++l) lane[l] = l;
  f32 best = neg_inf;
  i32 at = i32{};
  for (int64_t j = 0; j < n; j += W) {
    f32 xv, uv;
    if (j + W <= n) {
      xv = load_lanes<W>(x + j);
      if (u) uv = load_lanes<W>(u + j);
    } else {  // the tail: -inf keys, which never win, beyond n
      for (int l = 0; l < W; ++l) {
        xv[l] = j + l < n ? x[j + l] : -__builtin_inff();
        uv[l] = j + l < n && u ? u[j + l] : 0.5f;
      }
    }
    f32 key = shift_lanes<W>(xv, m, t);
    if (u) key = key > neg_inf ? key + apply_lanes<W, VectorFn::kGumbel>(uv) : key;
    const i32 better = key > best;
    best = better ? key : best;
    at = better ? lane + static_cast<int32_t>(j) : at;
  }
  RaceWinner w{0, -__builtin_inff()};
  for (int l = 0; l < W; ++l) {
    if (best[l] > w.key || (best[l] == w.key && best[l] > -__builtin_inff() && at[l] < w.index)) {
      w = {at[l], best[l]};
    }
  }
  return w;
}

void apply_scalar(VectorFn fn, const float* x, int64_t n, float* out) { apply<4>(fn, x, n, out); }
RaceWinner race_scalar(const float* x, const float* u, int64_t n, float m, float t) { return race<4>(x, u, n, m, t); }
TileSums exp_sums_scalar(const float* x, int64_t n, float m, float t, bool entropy) {
  return exp_sums<4>(x, n, m, t, entropy);
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) void apply_avx2(VectorFn fn, const float* x, int64_t n, float* out) {
  apply<8>(fn, x, n, out);
}

__attribute__((target("avx2"))) TileSums exp_sums_avx2(const float* x, int64_t n, float m, float t, bool entropy) {
  return exp_sums<8>(x, n, m, t, entropy);
}

__attribute__((target("avx2"))) RaceWinner race_avx2(const float* x, const float* u, int64_t n, float m, float t) {
  return race<8>(x, u, n, m, t);
}

__attribute__((target("avx512f"))) RaceWinner race_avx512(const float* x, const float* u, int64_t n, float m,
                                                           float t) {
  return race<16>(x, u, n, m, t);
}

__attribute__((target("avx512f"))) void apply_avx512(VectorFn fn, const float* x, int64_t n, float* out) {
  apply<16>(fn, x, n, out);
}

__attribute__((target("avx512f"))) TileSums exp_sums_avx512(const float* x, int64_t n, float m, float t,
                                                            bool entropy) {
  return exp_sums<16>(x, n, m, t, entropy);
}
#endif

// ddpd::vector_math_cpu: fn ("log", "exp", "gumbel", "sigmoid", "log_sigmoid") of each
// value of x (float32) by the path `isa`; or fn "tile_sums": tile_exp_sums of each row of x
// [rows, n] (n a multiple of kSumLanes) at its maximum and temperature t, as [rows, 2] (sum,
// entropy sum); or fn "gumbel_race" ("race": without noise): gumbel_race of each row of x
// [rows, 2, n] (logits, uniforms) at its maximum and t, as [rows, 2] (index, key). For the
// tests that hold every path this CPU has to each other and to float64 torch.
at::Tensor vector_math_cpu(const at::Tensor& x, c10::string_view fn, c10::string_view isa, double t) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32");
  const Isa path = require_isa(isa);
  const at::Tensor in = x.contiguous();
  if (fn == "tile_sums") {
    TORCH_CHECK(in.dim() == 2 && in.size(1) % kSumLanes == 0, "tile_sums: x must be [rows, n], n a multiple of ",
                kSumLanes);
    at::Tensor out = at::empty({in.size(0), 2}, in.options());
    for (int64_t r = 0; r < in.size(0); ++r) {
      const float* row = in.data_ptr<float>() + r * in.size(1);
      float m = -__builtin_inff();
      for (int64_t j = 0; j < in.size(1); ++j) m = row[j] > m ? row[j] : m;
      const TileSums s = tile_exp_sums(row, in.size(1), m, static_cast<float>(t), true, path);
      out.data_ptr<float>()[2 * r] = s.sum;
      out.data_ptr<float>()[2 * r + 1] = s.ent;
    }
    return out;
  }
  if (fn == "gumbel_race" || fn == "race") {
    TORCH_CHECK(in.dim() == 3 && in.size(1) == 2, fn, ": x must be [rows, 2, n] (logits, uniforms)");
    at::Tensor out = at::empty({in.size(0), 2}, in.options());
    const int64_t n = in.size(2);
    for (int64_t r = 0; r < in.size(0); ++r) {
      const float* row = in.data_ptr<float>() + r * 2 * n;
      float m = -__builtin_inff();
      for (int64_t j = 0; j < n; ++j) m = row[j] > m ? row[j] : m;
      const RaceWinner w = gumbel_race(row, fn == "race" ? nullptr : row + n, n, m, static_cast<float>(t), path);
      out.data_ptr<float>()[2 * r] = static_cast<float>(w.index);
      out.data_ptr<float>()[2 * r + 1] = w.key;
    }
    return out;
  }
  VectorFn f;
  if (fn == "log") f = VectorFn::kLog;
  else if (fn == "exp") f = VectorFn::kExp;
  else if (fn == "gumbel") f = VectorFn::kGumbel;
  else if (fn == "sigmoid") f = VectorFn::kSigmoid;
  else if (fn == "log_sigmoid") f = VectorFn::kLogSigmoid;
  else TORCH_CHECK_VALUE(false, "fn must be log, exp, gumbel, sigmoid, log_sigmoid, tile_sums, gumbel_race or race, got ",
                         fn);
  at::Tensor out = at::empty_like(in);
  vector_math(f, in.data_ptr<float>(), in.numel(), out.data_ptr<float>(), path);
  return out;
}

}  // namespace

TileSums tile_exp_sums(const float* x, int64_t n, float m, float t, bool entropy, Isa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx512: return exp_sums_avx512(x, n, m, t, entropy);
    case Isa::kAvx2: return exp_sums_avx2(x, n, m, t, entropy);
#endif
    default: return exp_sums_scalar(x, n, m, t, entropy);
  }
}

RaceWinner gumbel_race(const float* x, const float* u, int64_t n, float m, float t, Isa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx512: return race_avx512(x, u, n, m, t);
    case Isa::kAvx2: return race_avx2(x, u, n, m, t);
#endif
    default: return race_scalar(x, u, n, m, t);
  }
}

void vector_math(VectorFn fn, const float* x, int64_t n, float* out, Isa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx512: return apply_avx512(fn, x, n, out);
    case Isa::kAvx2: return apply_avx2(fn, x, n, out);
#endif
    default: return apply_scalar(fn, x, n, out);
  }
}

}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) { m.def("vector_math_cpu(Tensor x, str fn, str isa, float t=1.0) -> Tensor"); }

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("vector_math_cpu", &ddpd::cpu::vector_math_cpu); }
