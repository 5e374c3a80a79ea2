// CPU path of ddpd.ops.sample_categorical: one token per row of logits [N, V]
// (uniforms: column j for token j, column V + t for tile t)
// by the two-level exact Gumbel-max of sample_categorical.h (relative to the tile and
// row maxima), one pass over the logits keeping two floats per tile, plus the
// winning tile again; no probabilities written. Rows run in parallel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <tuple>
#include <vector>

#include "counters.h"
#include "sample_categorical.h"

namespace ddpd {
namespace cpu {
namespace {

template <typename scalar_t>
void sample_rows(const at::Tensor& logits, double temperature, at::IntArrayRef exclude_ids,
                 const std::optional<at::Tensor>& exclude_per_row, const std::optional<at::Tensor>& noise,
                 uint64_t seed, uint64_t offset, const std::optional<at::Tensor>& row_ids,
                 at::Tensor& tokens, at::Tensor& valid) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const scalar_t* x = logits.data_ptr<scalar_t>();
  const float* noise_ptr = noise ? noise->data_ptr<float>() : nullptr;
  const int64_t noise_stride = noise ? noise->size(1) : 0;
  const int64_t* excl_row = exclude_per_row ? exclude_per_row->data_ptr<int64_t>() : nullptr;
  const int64_t* ids = row_ids ? row_ids->data_ptr<int64_t>() : nullptr;
  int64_t* out = tokens.data_ptr<int64_t>();
  bool* ok = valid.data_ptr<bool>();
  const float temp = static_cast<float>(temperature);
  const int64_t tiles = n_tiles(vocab);
  const int64_t grain = std::max<int64_t>(1, 32768 / vocab);

  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::array<float, kTile> buf;
    std::vector<TileStats> stats(tiles);
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* row = x + r * vocab;
      const RowUniforms u{noise_ptr ? noise_ptr + r * noise_stride : nullptr, seed, offset,
                          static_cast<uint64_t>(ids ? ids[r] : r)};
      const Exclusions excl{exclude_ids, excl_row ? excl_row[r] : -1};
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t start = t * kTile, n = std::min(kTile, vocab - start);
        load_tile(row + start, start, n, excl, buf.data());
        // One tile always wins: it needs no tile uniform.
        stats[t] = tiles == 1 ? TileStats{tile_max(buf.data(), n), 0.0f}
                              : tile_stats(buf.data(), n, temp, u(vocab + t));
      }
      float row_max;
      const int64_t winner = race(stats.data(), tiles, temp, &row_max);
      const int64_t start = winner * kTile, n = std::min(kTile, vocab - start);
      load_tile(row + start, start, n, excl, buf.data());
      ok[r] = row_max > kNegInf;
      out[r] = ok[r] ? draw_in_tile(buf.data(), start, n, temp, u) : 0;
    }
  });
}

std::tuple<at::Tensor, at::Tensor> sample_categorical_cpu(
    const at::Tensor& logits, double temperature, at::IntArrayRef exclude_ids,
    const std::optional<at::Tensor>& exclude_per_row, const std::optional<at::Tensor>& noise, int64_t seed,
    int64_t offset, const std::optional<at::Tensor>& row_ids, const std::optional<at::Tensor>& seed_tensor,
    const std::optional<at::Tensor>& offset_tensor) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "logits must be a contiguous [N, V] tensor");
  check_exclude_per_row(exclude_per_row, logits.size(1));
  at::Tensor tokens = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  at::Tensor valid = at::empty({logits.size(0)}, logits.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "sample_categorical_cpu", [&] {
    sample_rows<scalar_t>(logits, temperature, exclude_ids, exclude_per_row, noise, counter(seed, seed_tensor),
                          counter(offset, offset_tensor), row_ids, tokens, valid);
  });
  return {tokens, valid};
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def(
      "sample_categorical_cpu(Tensor logits, float temperature, int[] exclude_ids, Tensor? exclude_per_row, "
      "Tensor? noise, int seed, int offset, Tensor? row_ids, Tensor? seed_tensor, Tensor? offset_tensor) "
      "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("sample_categorical_cpu", &ddpd::cpu::sample_categorical_cpu); }
