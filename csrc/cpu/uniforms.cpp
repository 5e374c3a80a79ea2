// philox_uniforms and philox_words (uniforms.h): the Philox4x32-10 of csrc/rng.h for a run
// of columns of one row, 16 or 8 columns at once where the CPU has AVX-512 or AVX2 (isa.h),
// else one at a time; the float32 uniforms of the columns, or (kWords) their first words.
// Only a lane's counter word c0 (its column) differs, so the lanes start from one counter
// and one key. A lane's 32 x 32-bit product is the same 64-bit product in a vector as in
// scalar code, and its uniform the same float32 operations (an exact conversion, one
// addition, one exact multiplication): the same bits as philox_word and philox_uniform,
// column for column (tests/ops/test_op_rng.py compares them).
#include "uniforms.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <cstring>

#include "../rng.h"
#include "isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DDPD_X86 1
#else
#define DDPD_X86 0
#endif

namespace ddpd {
namespace cpu {
namespace {

constexpr uint32_t kMulA = 0xD2511F53u, kMulB = 0xCD9E8D57u, kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

// The row's counter words after the column, and its key.
struct RowStream {
  uint32_t c1, c2, c3, k0, k1;
};

RowStream row_stream(uint64_t seed, uint64_t offset, uint64_t row) {
  RowStream s{static_cast<uint32_t>(row), static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), 0, 0};
  philox_row_key(seed, row, &s.k0, &s.k1);
  return s;
}

float to_uniform(uint32_t w) { return (static_cast<float>(w >> 8) + 0.5f) * (1.0f / 16777216.0f); }

// out: float uniforms, or where kWords the uint32 words.
template <bool kWords>
void scalar_run(const RowStream& s, uint64_t first, int64_t n, void* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t column = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
    const uint32_t w = philox4x32(column, s.c1, s.c2, s.c3, s.k0, s.k1).w0;
    if (kWords) {
      static_cast<uint32_t*>(out)[i] = w;
    } else {
      static_cast<float*>(out)[i] = to_uniform(w);
    }
  }
}

#if DDPD_X86
// Philox rounds on 8 lanes: _mm256_mul_epu32 multiplies the even 32-bit lanes into 64-bit
// products, so the odd lanes go through it shifted down, and the products' halves are
// blended back into lane order.
__attribute__((target("avx2"))) inline void mulhilo8(__m256i x, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(x, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

template <bool kWords>
__attribute__((target("avx2"))) void avx2_run(const RowStream& s, uint64_t first, int64_t n, void* out) {
  const __m256i ma = _mm256_set1_epi32(static_cast<int>(kMulA)), mb = _mm256_set1_epi32(static_cast<int>(kMulB));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 half = _mm256_set1_ps(0.5f), scale = _mm256_set1_ps(1.0f / 16777216.0f);
  for (int64_t i = 0; i < n; i += 8) {
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first + i))), lanes);
    __m256i c1 = _mm256_set1_epi32(static_cast<int>(s.c1)), c2 = _mm256_set1_epi32(static_cast<int>(s.c2));
    __m256i c3 = _mm256_set1_epi32(static_cast<int>(s.c3));
    uint32_t k0 = s.k0, k1 = s.k1;
    for (int r = 0; r < 10; ++r) {
      __m256i hi_b, lo_b, hi_a, lo_a;
      mulhilo8(c2, mb, &hi_b, &lo_b);
      mulhilo8(c0, ma, &hi_a, &lo_a);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi_b, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi_a, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c1 = lo_b;
      c3 = lo_a;
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const __m256 u = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 8)), half), scale);
    const __m256i lanes_out = kWords ? c0 : _mm256_castps_si256(u);  // 32-bit lanes either way
    char* at = static_cast<char*>(out) + 4 * i;
    if (n - i >= 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), lanes_out);
    } else {
      uint32_t rest[8];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rest), lanes_out);
      std::memcpy(at, rest, 4 * static_cast<size_t>(n - i));
    }
  }
}

// GCC 12 warns that its own AVX-512 intrinsics read an uninitialised vector (the
// _mm512_undefined_epi32() they pass as the unused merge source).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The same on 16 lanes held in the low halves of 64-bit lanes (_mm512_mul_epu32 reads only
// those), two vectors of 8: the products need no blending, and the high halves the
// rounds leave in the lanes are never read.
template <bool kWords>
__attribute__((target("avx512f"))) void avx512_run(const RowStream& s, uint64_t first, int64_t n, void* out) {
  const __m512i ma = _mm512_set1_epi64(kMulA), mb = _mm512_set1_epi64(kMulB);
  const __m512i lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  const __m512 half = _mm512_set1_ps(0.5f), scale = _mm512_set1_ps(1.0f / 16777216.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const uint32_t column = static_cast<uint32_t>(first + i);
    __m512i c0[2] = {_mm512_add_epi64(_mm512_set1_epi64(column), lanes),
                     _mm512_add_epi64(_mm512_set1_epi64(column + 8u), lanes)};
    __m512i c1[2], c2[2], c3[2];
    for (int v = 0; v < 2; ++v) {
      c1[v] = _mm512_set1_epi64(s.c1);
      c2[v] = _mm512_set1_epi64(s.c2);
      c3[v] = _mm512_set1_epi64(s.c3);
    }
    uint32_t k0 = s.k0, k1 = s.k1;
    for (int r = 0; r < 10; ++r) {
      const __m512i key0 = _mm512_set1_epi64(k0), key1 = _mm512_set1_epi64(k1);
      for (int v = 0; v < 2; ++v) {
        const __m512i pb = _mm512_mul_epu32(c2[v], mb), pa = _mm512_mul_epu32(c0[v], ma);
        c0[v] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pb, 32), c1[v], key0, 0x96);  // a ^ b ^ c
        c2[v] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pa, 32), c3[v], key1, 0x96);
        c1[v] = pb;
        c3[v] = pa;
      }
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const __m512i words = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(c0[0])),
                                             _mm512_cvtepi64_epi32(c0[1]), 1);
    const __m512 u = _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(words, 8)), half), scale);
    const __m512i lanes_out = kWords ? words : _mm512_castps_si512(u);  // 32-bit lanes either way
    char* at = static_cast<char*>(out) + 4 * i;
    if (n - i >= 16) {
      _mm512_storeu_si512(at, lanes_out);
    } else {
      _mm512_mask_storeu_epi32(at, static_cast<__mmask16>((1u << (n - i)) - 1u), lanes_out);
    }
  }
}
#endif

using Run = void (*)(const RowStream&, uint64_t, int64_t, void*);

template <bool kWords>
Run run_for(Isa isa) {
  switch (isa) {
#if DDPD_X86
    case Isa::kAvx512: return avx512_run<kWords>;
    case Isa::kAvx2: return avx2_run<kWords>;
#endif
    default: return scalar_run<kWords>;
  }
}

// ddpd::philox_uniforms_cpu: columns [first, first + n) of each row's stream [rows, n] by the
// path `isa` (isa.h): the float32 uniforms, or where words the first words (as int64), for
// the tests that hold every path this CPU has to the torch reference (ddpd.ops.rng).
at::Tensor philox_uniforms_cpu(int64_t seed, int64_t offset, const at::Tensor& row_ids, int64_t first, int64_t n,
                               c10::string_view isa, bool words) {
  TORCH_CHECK(row_ids.dim() == 1 && row_ids.scalar_type() == at::kLong, "row_ids must be a 1-d int64 tensor");
  TORCH_CHECK_VALUE(first >= 0 && n >= 0 && first + n <= (int64_t{1} << 32), "columns must lie in [0, 2**32)");
  const Isa path = require_isa(isa);
  const Run run = words ? run_for<true>(path) : run_for<false>(path);
  const at::Tensor ids = row_ids.contiguous();
  at::Tensor out = at::empty({ids.size(0), n}, ids.options().dtype(words ? at::kInt : at::kFloat));
  for (int64_t r = 0; r < ids.size(0); ++r) {
    run(row_stream(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                   static_cast<uint64_t>(ids.data_ptr<int64_t>()[r])),
        static_cast<uint64_t>(first), n, static_cast<char*>(out.data_ptr()) + 4 * r * n);
  }
  return words ? out.to(at::kLong).bitwise_and(0xFFFFFFFFll) : out;
}

}  // namespace

void philox_uniforms(uint64_t seed, uint64_t offset, uint64_t row, uint64_t first, int64_t n, float* out) {
  static const Run run = run_for<false>(best_isa());
  if (n > 0) run(row_stream(seed, offset, row), first, n, out);
}

void philox_words(uint64_t seed, uint64_t offset, uint64_t row, uint64_t first, int64_t n, uint32_t* out) {
  static const Run run = run_for<true>(best_isa());
  if (n > 0) run(row_stream(seed, offset, row), first, n, out);
}

}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def("philox_uniforms_cpu(int seed, int offset, Tensor row_ids, int first, int n, str isa, bool words=False) -> "
        "Tensor");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("philox_uniforms_cpu", &ddpd::cpu::philox_uniforms_cpu); }
