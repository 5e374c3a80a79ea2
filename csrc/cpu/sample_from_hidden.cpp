// CPU path of ddpd.ops.sample_from_hidden: one token per row of
// softmax((hidden @ weight^T + bias) / temperature), the output head fused with
// the two-level Gumbel-max of sample_tiles.h so the [N, V] logits never exist.
//
// The vocabulary is cut into splits of whole chunks of kChunkTiles tiles, one
// split per thread. A thread walks its chunks: a BLAS matmul gives the chunk's
// logits [N, chunk] in a small buffer, each row offers the chunk's tiles to the
// split's tile race and keeps the logits of its current winning tile. The split
// winners are then merged in vocabulary order (the race is associative) and the
// token is drawn inside the kept winning tile. Memory per split:
// N x (chunk + kTile) floats; one parallel region per call.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "sample_tiles.h"

namespace ddpd {
namespace cpu {
namespace {

constexpr int64_t kChunkTiles = 16;
constexpr int64_t kChunk = kChunkTiles * kTile;

struct HeadArgs {
  at::Tensor hidden;  // float32 [N, H]
  const at::Tensor& weight;
  const std::optional<at::Tensor>& bias;
  float temperature;
  at::IntArrayRef exclude_ids;
  const int64_t* exclude_row;
  const float* noise;
  int64_t noise_stride;
  uint64_t seed, offset;
  const int64_t* row_ids;

  RowUniforms uniforms(int64_t r) const {
    return RowUniforms{noise ? noise + r * noise_stride : nullptr, seed, offset,
                       static_cast<uint64_t>(row_ids ? row_ids[r] : r)};
  }
};

// The tile race of every row over the chunks [first_chunk, end_chunk); each
// row's winning tile logits go to kept [N, kTile].
void race_split(const HeadArgs& a, int64_t first_chunk, int64_t end_chunk, std::vector<TileRace>& races,
                float* kept) {
  const int64_t rows = a.hidden.size(0), vocab = a.weight.size(0);
  at::Tensor buf = at::empty({rows, std::min(kChunk, vocab)}, a.hidden.options());
  std::array<float, kTile> tile;
  for (int64_t c = first_chunk; c < end_chunk; ++c) {
    const int64_t first = c * kChunk, width = std::min(kChunk, vocab - first);
    at::Tensor logits = buf.narrow(1, 0, width);
    const at::Tensor w = a.weight.narrow(0, first, width).to(at::kFloat);
    if (a.bias) {
      at::addmm_out(logits, a.bias->narrow(0, first, width).to(at::kFloat), a.hidden, w.t());
    } else {
      at::mm_out(logits, a.hidden, w.t());
    }
    const float* chunk = logits.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const RowUniforms u = a.uniforms(r);
      const Exclusions excl{a.exclude_ids, a.exclude_row ? a.exclude_row[r] : -1};
      for (int64_t start = first; start < first + width; start += kTile) {
        const int64_t n = std::min(kTile, vocab - start);
        load_tile(chunk + r * logits.stride(0) + (start - first), start, n, a.temperature, excl, tile.data());
        if (races[r].offer(tile_lse(tile.data(), n), start / kTile, u(vocab + start / kTile))) {
          std::copy(tile.begin(), tile.begin() + n, kept + r * kTile);
        }
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor> sample_from_hidden_cpu(
    const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double temperature,
    at::IntArrayRef exclude_ids, const std::optional<at::Tensor>& exclude_per_row,
    const std::optional<at::Tensor>& noise, int64_t seed, int64_t offset, const std::optional<at::Tensor>& row_ids) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "hidden [N, H] and weight [V, H] must share H");
  const HeadArgs a{hidden.to(at::kFloat).contiguous(),
                   weight,
                   bias,
                   static_cast<float>(temperature),
                   exclude_ids,
                   exclude_per_row ? exclude_per_row->data_ptr<int64_t>() : nullptr,
                   noise ? noise->data_ptr<float>() : nullptr,
                   noise ? noise->size(1) : 0,
                   static_cast<uint64_t>(seed),
                   static_cast<uint64_t>(offset),
                   row_ids ? row_ids->data_ptr<int64_t>() : nullptr};
  const int64_t rows = hidden.size(0), vocab = weight.size(0);
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(chunks, at::get_num_threads()));
  std::vector<std::vector<TileRace>> races(splits, std::vector<TileRace>(rows));
  std::vector<float> kept(splits * rows * kTile);
  at::parallel_for(0, splits, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      race_split(a, s * chunks / splits, (s + 1) * chunks / splits, races[s], kept.data() + s * rows * kTile);
    }
  });

  at::Tensor tokens = at::empty({rows}, hidden.options().dtype(at::kLong));
  at::Tensor valid = at::empty({rows}, hidden.options().dtype(at::kBool));
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t winner = 0;  // splits hold increasing tiles: strict > keeps the lowest on ties
      for (int64_t s = 1; s < splits; ++s) {
        if (races[s][r].key > races[winner][r].key) winner = s;
      }
      const TileRace& race = races[winner][r];
      const int64_t start = race.tile * kTile, n = std::min(kTile, vocab - start);
      float* tile = kept.data() + (winner * rows + r) * kTile;
      if (!race.valid()) std::fill(tile, tile + n, kNegInf);  // no tile was ever kept
      tokens.data_ptr<int64_t>()[r] = draw_in_tile(tile, start, n, a.uniforms(r));
      valid.data_ptr<bool>()[r] = race.valid();
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
