// Counter-based uniforms shared by every ddpd op (ddpd/ops/rng.py, kernels/rng.py
// are its torch and Triton twins): Philox4x32-10 with key
// (seed_lo, seed_hi) and counter (column, row_lo, offset_lo, offset_hi); the first
// output word w gives u = ((w >> 8) + 0.5) * 2^-24 in float32, in (0, 1] (float32
// rounds the top value to 1.0; consumers that take log(1 - u) clamp first).
// Bit-identical to ddpd/ops/rng.py and kernels/rng.py, so every path can be
// compared with the torch reference token for token. Host and device code.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DDPD_HD __host__ __device__ __forceinline__
#else
#define DDPD_HD inline
#endif

namespace ddpd {

DDPD_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

struct PhiloxBlock {
  uint32_t w0, w1, w2, w3;
};

// Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1).
DDPD_HD PhiloxBlock philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t hi_b, lo_b, hi_a, lo_a;
    philox_mulhilo(0xCD9E8D57u, c2, &hi_b, &lo_b);
    philox_mulhilo(0xD2511F53u, c0, &hi_a, &lo_a);
    const uint32_t n0 = hi_b ^ c1 ^ k0, n2 = hi_a ^ c3 ^ k1;
    c0 = n0; c1 = lo_b; c2 = n2; c3 = lo_a;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// The key of row `row`'s stream. Row ids are 64-bit: below 2^32 the key is the seed;
// a row with a high word row_hi != 0 draws under the key of the first two words of
// Philox(counter (row_hi, ~0, ~0, ~0), key seed), so rows r and r + 2^32 are
// independent and no row below 2^32 changes (ddpd/ops/rng.py says the same).
DDPD_HD void philox_row_key(uint64_t seed, uint64_t row, uint32_t* k0, uint32_t* k1) {
  *k0 = static_cast<uint32_t>(seed);
  *k1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t row_hi = static_cast<uint32_t>(row >> 32);
  if (row_hi != 0) {
    const PhiloxBlock key = philox4x32(row_hi, ~0u, ~0u, ~0u, *k0, *k1);
    *k0 = key.w0;
    *k1 = key.w1;
  }
}

// The first output word for (seed, offset, row, col), the only word ddpd uses: counter
// (col, row_lo, offset_lo, offset_hi) under the row's key.
DDPD_HD uint32_t philox_word(uint64_t seed, uint64_t offset, uint64_t row, uint64_t col) {
  uint32_t k0, k1;
  philox_row_key(seed, row, &k0, &k1);
  return philox4x32(static_cast<uint32_t>(col), static_cast<uint32_t>(row), static_cast<uint32_t>(offset),
                    static_cast<uint32_t>(offset >> 32), k0, k1)
      .w0;
}

DDPD_HD float philox_uniform(uint64_t seed, uint64_t offset, uint64_t row, uint64_t col) {
  const uint32_t w = philox_word(seed, offset, row, col);
  return (static_cast<float>(w >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace ddpd
