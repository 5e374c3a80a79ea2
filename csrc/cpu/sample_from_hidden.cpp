// CPU path of ddpd.ops.sample_from_hidden: one token per row of
// softmax((hidden @ weight^T + bias) / temperature), the output head fused with
// the two-level Gumbel-max of sample_tiles.h so the [N, V] logits never exist.
//
// The vocabulary is walked in chunks of kChunkTiles tiles: a BLAS matmul gives
// the chunk's logits [N, chunk] in a small buffer, each row offers the chunk's
// tiles to its tile race and keeps the logits of its current winning tile; the
// token is then drawn inside the kept tile. Memory: N x (chunk + kTile) floats.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>

#include "sample_tiles.h"

namespace ddpd {
namespace cpu {
namespace {

constexpr int64_t kChunkTiles = 16;

std::tuple<at::Tensor, at::Tensor> sample_from_hidden_cpu(
    const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double temperature,
    at::IntArrayRef exclude_ids, const std::optional<at::Tensor>& exclude_per_row,
    const std::optional<at::Tensor>& noise, int64_t seed, int64_t offset, const std::optional<at::Tensor>& row_ids) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "hidden [N, H] and weight [V, H] must share H");
  const int64_t rows = hidden.size(0), vocab = weight.size(0);
  const int64_t chunk = kChunkTiles * kTile;
  const at::Tensor h = hidden.to(at::kFloat);
  at::Tensor buf = at::empty({rows, std::min(chunk, vocab)}, h.options());
  at::Tensor kept = at::empty({rows, kTile}, h.options());  // logits of each row's winning tile
  std::vector<TileRace> races(rows);
  const float* noise_ptr = noise ? noise->data_ptr<float>() : nullptr;
  const int64_t noise_stride = noise ? noise->size(1) : 0;
  const int64_t* excl_row = exclude_per_row ? exclude_per_row->data_ptr<int64_t>() : nullptr;
  const int64_t* ids = row_ids ? row_ids->data_ptr<int64_t>() : nullptr;
  const float temp = static_cast<float>(temperature);
  const auto uniforms = [&](int64_t r) {
    return RowUniforms{noise_ptr ? noise_ptr + r * noise_stride : nullptr, static_cast<uint64_t>(seed),
                       static_cast<uint64_t>(offset), static_cast<uint64_t>(ids ? ids[r] : r)};
  };

  for (int64_t first = 0; first < vocab; first += chunk) {
    const int64_t width = std::min(chunk, vocab - first);
    at::Tensor logits = buf.narrow(1, 0, width);
    const at::Tensor w = weight.narrow(0, first, width).to(at::kFloat);
    if (bias) {
      at::addmm_out(logits, bias->narrow(0, first, width).to(at::kFloat), h, w.t());
    } else {
      at::mm_out(logits, h, w.t());
    }
    const float* chunk_ptr = logits.data_ptr<float>();
    const int64_t chunk_stride = logits.stride(0);
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      std::array<float, kTile> tile_buf;
      for (int64_t r = begin; r < end; ++r) {
        const RowUniforms u = uniforms(r);
        const Exclusions excl{exclude_ids, excl_row ? excl_row[r] : -1};
        for (int64_t start = first; start < first + width; start += kTile) {
          const int64_t n = std::min(kTile, vocab - start);
          load_tile(chunk_ptr + r * chunk_stride + (start - first), start, n, temp, excl, tile_buf.data());
          if (races[r].offer(tile_lse(tile_buf.data(), n), start / kTile, u(vocab + start / kTile))) {
            std::copy(tile_buf.begin(), tile_buf.begin() + n, kept.data_ptr<float>() + r * kTile);
          }
        }
      }
    });
  }

  at::Tensor tokens = at::empty({rows}, hidden.options().dtype(at::kLong));
  at::Tensor valid = at::empty({rows}, hidden.options().dtype(at::kBool));
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t start = races[r].tile * kTile, n = std::min(kTile, vocab - start);
      float* tile = kept.data_ptr<float>() + r * kTile;
      if (!races[r].valid()) std::fill(tile, tile + n, kNegInf);  // no tile was ever kept
      tokens.data_ptr<int64_t>()[r] = draw_in_tile(tile, start, n, uniforms(r));
      valid.data_ptr<bool>()[r] = races[r].valid();
    }
  });
  return {tokens, valid};
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def(
      "sample_from_hidden_cpu(Tensor hidden, Tensor weight, Tensor? bias, float temperature, int[] exclude_ids, "
      "Tensor? exclude_per_row, Tensor? noise, int seed, int offset, Tensor? row_ids) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("sample_from_hidden_cpu", &ddpd::cpu::sample_from_hidden_cpu); }
