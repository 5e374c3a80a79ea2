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

// 16 rows in 16 lanes, for runs shorter than a vector, which a run a row would leave mostly
// idle (many rows of a few columns): a lane's row word c1 and key; the offset words c2, c3
// are every lane's, and so is the column word c0 of a call.
struct RowLanes {
  alignas(64) uint32_t c1[16], k0[16], k1[16];
  uint32_t c2, c3;
};

float to_uniform(uint32_t w) { return (static_cast<float>(w >> 8) + 0.5f) * (1.0f / 16777216.0f); }

template <bool kWords>
void put(uint32_t w, void* out, int64_t i) {
  if (kWords) {
    static_cast<uint32_t*>(out)[i] = w;
  } else {
    static_cast<float*>(out)[i] = to_uniform(w);
  }
}

// out: float uniforms, or where kWords the uint32 words.
template <bool kWords>
void scalar_run(const RowStream& s, uint64_t first, int64_t n, void* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t column = static_cast<uint32_t>(first + static_cast<uint64_t>(i));
    put<kWords>(philox4x32(column, s.c1, s.c2, s.c3, s.k0, s.k1).w0, out, i);
  }
}

// out[j]: lane j's value at column c0, for the 16 lanes.
template <bool kWords>
void scalar_lanes(const RowLanes& l, uint32_t c0, void* out) {
  for (int j = 0; j < 16; ++j) put<kWords>(philox4x32(c0, l.c1[j], l.c2, l.c3, l.k0[j], l.k1[j]).w0, out, j);
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

// The first words of 8 lanes' counters (c0, c1, c2, c3) under their keys (k0, k1).
__attribute__((target("avx2"))) inline __m256i avx2_words(__m256i c0, __m256i c1, __m256i c2, __m256i c3, __m256i k0,
                                                          __m256i k1) {
  const __m256i ma = _mm256_set1_epi32(static_cast<int>(kMulA)), mb = _mm256_set1_epi32(static_cast<int>(kMulB));
  const __m256i w0 = _mm256_set1_epi32(static_cast<int>(kWeyl0)), w1 = _mm256_set1_epi32(static_cast<int>(kWeyl1));
  for (int r = 0; r < 10; ++r) {
    __m256i hi_b, lo_b, hi_a, lo_a;
    mulhilo8(c2, mb, &hi_b, &lo_b);
    mulhilo8(c0, ma, &hi_a, &lo_a);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi_b, c1), k0);
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi_a, c3), k1);
    c1 = lo_b;
    c3 = lo_a;
    k0 = _mm256_add_epi32(k0, w0);
    k1 = _mm256_add_epi32(k1, w1);
  }
  return c0;
}

// The first `count` of 8 lanes' words, or their uniforms, to out.
template <bool kWords>
__attribute__((target("avx2"))) inline void avx2_store(__m256i words, int64_t count, void* out) {
  const __m256 u = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(words, 8)), _mm256_set1_ps(0.5f)),
                                 _mm256_set1_ps(1.0f / 16777216.0f));
  const __m256i lanes = kWords ? words : _mm256_castps_si256(u);  // 32-bit lanes either way
  if (count >= 8) {
    _mm256_storeu_si256(static_cast<__m256i*>(out), lanes);
  } else {
    uint32_t rest[8];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rest), lanes);
    std::memcpy(out, rest, 4 * static_cast<size_t>(count));
  }
}

__attribute__((target("avx2"))) inline __m256i set8(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }

__attribute__((target("avx2"))) inline __m256i load8(const uint32_t* v) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
}

template <bool kWords>
__attribute__((target("avx2"))) void avx2_run(const RowStream& s, uint64_t first, int64_t n, void* out) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i c0 = _mm256_add_epi32(set8(static_cast<uint32_t>(first + i)), lanes);
    const __m256i w = avx2_words(c0, set8(s.c1), set8(s.c2), set8(s.c3), set8(s.k0), set8(s.k1));
    avx2_store<kWords>(w, n - i, static_cast<char*>(out) + 4 * i);
  }
}

template <bool kWords>
__attribute__((target("avx2"))) void avx2_lanes(const RowLanes& l, uint32_t c0, void* out) {
  for (int j = 0; j < 16; j += 8) {
    const __m256i w = avx2_words(set8(c0), load8(l.c1 + j), set8(l.c2), set8(l.c3), load8(l.k0 + j), load8(l.k1 + j));
    avx2_store<kWords>(w, 8, static_cast<char*>(out) + 4 * j);
  }
}

// GCC 12 warns that its own AVX-512 intrinsics read an uninitialised vector (the
// _mm512_undefined_epi32() they pass as the unused merge source).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The same on 16 lanes held in the low halves of 64-bit lanes (_mm512_mul_epu32 reads only
// those), two vectors of 8: the products need no blending, and the high halves the
// rounds leave in the lanes are never read.
struct Vec16 {
  __m512i v[2];
};

__attribute__((target("avx512f"))) inline Vec16 set16(uint32_t x) {
  return {{_mm512_set1_epi64(x), _mm512_set1_epi64(x)}};
}

__attribute__((target("avx512f"))) inline __m512i avx512_words(Vec16 c0, Vec16 c1, uint32_t c2s, uint32_t c3s, Vec16 k0,
                                                               Vec16 k1) {
  const __m512i ma = _mm512_set1_epi64(kMulA), mb = _mm512_set1_epi64(kMulB);
  const __m512i w0 = _mm512_set1_epi64(kWeyl0), w1 = _mm512_set1_epi64(kWeyl1);
  Vec16 c2 = set16(c2s), c3 = set16(c3s);
  for (int r = 0; r < 10; ++r) {
    for (int v = 0; v < 2; ++v) {
      const __m512i pb = _mm512_mul_epu32(c2.v[v], mb), pa = _mm512_mul_epu32(c0.v[v], ma);
      c0.v[v] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pb, 32), c1.v[v], k0.v[v], 0x96);  // a ^ b ^ c
      c2.v[v] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pa, 32), c3.v[v], k1.v[v], 0x96);
      c1.v[v] = pb;
      c3.v[v] = pa;
      k0.v[v] = _mm512_add_epi64(k0.v[v], w0);  // carries go to the high halves, never read
      k1.v[v] = _mm512_add_epi64(k1.v[v], w1);
    }
  }
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(c0.v[0])), _mm512_cvtepi64_epi32(c0.v[1]), 1);
}

template <bool kWords>
__attribute__((target("avx512f"))) inline void avx512_store(__m512i words, int64_t count, void* out) {
  const __m512 u = _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(words, 8)), _mm512_set1_ps(0.5f)),
                                 _mm512_set1_ps(1.0f / 16777216.0f));
  const __m512i lanes = kWords ? words : _mm512_castps_si512(u);  // 32-bit lanes either way
  if (count >= 16) {
    _mm512_storeu_si512(out, lanes);
  } else {
    _mm512_mask_storeu_epi32(out, static_cast<__mmask16>((1u << count) - 1u), lanes);
  }
}

// 16 aligned words, each in the low half of a 64-bit lane.
__attribute__((target("avx512f"))) inline Vec16 load16(const uint32_t* v) {
  return {{_mm512_cvtepu32_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(v))),
           _mm512_cvtepu32_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(v + 8)))}};
}

template <bool kWords>
__attribute__((target("avx512f"))) void avx512_run(const RowStream& s, uint64_t first, int64_t n, void* out) {
  const __m512i lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 16) {
    const uint32_t column = static_cast<uint32_t>(first + i);
    const Vec16 c0{{_mm512_add_epi64(_mm512_set1_epi64(column), lanes),
                    _mm512_add_epi64(_mm512_set1_epi64(column + 8u), lanes)}};
    const __m512i w = avx512_words(c0, set16(s.c1), s.c2, s.c3, set16(s.k0), set16(s.k1));
    avx512_store<kWords>(w, n - i, static_cast<char*>(out) + 4 * i);
  }
}

template <bool kWords>
__attribute__((target("avx512f"))) void avx512_lanes(const RowLanes& l, uint32_t c0, void* out) {
  avx512_store<kWords>(avx512_words(set16(c0), load16(l.c1), l.c2, l.c3, load16(l.k0), load16(l.k1)), 16, out);
}
#endif

using Run = void (*)(const RowStream&, uint64_t, int64_t, void*);
using LanesRun = void (*)(const RowLanes&, uint32_t, void*);

struct Path {
  Run run;         // a run of one row's columns
  LanesRun lanes;  // one column of 16 rows
  int64_t width;   // lanes of a vector: runs shorter than this go a row a lane
};

template <bool kWords>
Path path_for(Isa isa) {
  switch (isa) {
#if DDPD_X86
    case Isa::kAvx512: return {avx512_run<kWords>, avx512_lanes<kWords>, 16};
    case Isa::kAvx2: return {avx2_run<kWords>, avx2_lanes<kWords>, 8};
#endif
    default: return {scalar_run<kWords>, scalar_lanes<kWords>, 1};
  }
}

// Every row's columns [first, first + n) to out [rows, n] (4-byte values), 16 rows at a time,
// a column at a time (n at most 16).
void rows_across(const Path& path, uint64_t seed, uint64_t offset, const int64_t* ids, int64_t rows, uint64_t first,
                 int64_t n, char* out) {
  RowLanes l{};
  l.c2 = static_cast<uint32_t>(offset);
  l.c3 = static_cast<uint32_t>(offset >> 32);
  alignas(64) uint32_t block[16][16];  // [column][lane]
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t m = std::min<int64_t>(16, rows - r0);
    for (int64_t i = 0; i < m; ++i) {
      const RowStream s = row_stream(seed, offset, static_cast<uint64_t>(ids[r0 + i]));
      l.c1[i] = s.c1;
      l.k0[i] = s.k0;
      l.k1[i] = s.k1;
    }
    for (int64_t c = 0; c < n; ++c) path.lanes(l, static_cast<uint32_t>(first + static_cast<uint64_t>(c)), block[c]);
    uint32_t* dst = reinterpret_cast<uint32_t*>(out) + r0 * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < n; ++c) dst[i * n + c] = block[c][i];
    }
  }
}

// ddpd::philox_uniforms_cpu: columns [first, first + n) of each row's stream [rows, n] by the
// path `isa` (isa.h): the float32 uniforms, or where words the first words (as int64), for
// the tests that hold every path this CPU has to the torch reference (ddpd.ops.rng).
at::Tensor philox_uniforms_cpu(int64_t seed, int64_t offset, const at::Tensor& row_ids, int64_t first, int64_t n,
                               c10::string_view isa, bool words) {
  TORCH_CHECK(row_ids.dim() == 1 && row_ids.scalar_type() == at::kLong, "row_ids must be a 1-d int64 tensor");
  TORCH_CHECK_VALUE(first >= 0 && n >= 0 && first + n <= (int64_t{1} << 32), "columns must lie in [0, 2**32)");
  const Isa named = require_isa(isa);
  const Path path = words ? path_for<true>(named) : path_for<false>(named);
  const at::Tensor ids = row_ids.contiguous();
  at::Tensor out = at::empty({ids.size(0), n}, ids.options().dtype(words ? at::kInt : at::kFloat));
  const int64_t* id = ids.data_ptr<int64_t>();
  char* dst = static_cast<char*>(out.data_ptr());
  // a vector a row takes a call a row; 16 rows across the lanes, a call a column of 16 rows
  if (n < path.width && n < ids.size(0)) {
    rows_across(path, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset), id, ids.size(0),
              static_cast<uint64_t>(first), n, dst);
  } else {
    for (int64_t r = 0; r < ids.size(0); ++r) {
      path.run(row_stream(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset), static_cast<uint64_t>(id[r])),
               static_cast<uint64_t>(first), n, dst + 4 * r * n);
    }
  }
  return words ? out.to(at::kLong).bitwise_and(0xFFFFFFFFll) : out;
}

}  // namespace

void philox_uniforms(uint64_t seed, uint64_t offset, uint64_t row, uint64_t first, int64_t n, float* out) {
  static const Run run = path_for<false>(best_isa()).run;
  if (n > 0) run(row_stream(seed, offset, row), first, n, out);
}

void philox_words(uint64_t seed, uint64_t offset, uint64_t row, uint64_t first, int64_t n, uint32_t* out) {
  static const Run run = path_for<true>(best_isa()).run;
  if (n > 0) run(row_stream(seed, offset, row), first, n, out);
}

}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def("philox_uniforms_cpu(int seed, int offset, Tensor row_ids, int first, int n, str isa, bool words=False) -> "
        "Tensor");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("philox_uniforms_cpu", &ddpd::cpu::philox_uniforms_cpu); }
