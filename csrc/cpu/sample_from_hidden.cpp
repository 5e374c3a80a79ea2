// CPU path of ddpd.ops.sample_from_hidden: one token per row of
// softmax((hidden @ weight^T + bias) / temperature), the output head fused with
// the two-level Gumbel-max of sample_categorical.h so the [N, V] logits never exist.
// (With top-k / top-p / min-p the Python op computes the logits and draws with
// sample_categorical instead: a threshold needs the whole row.)
//
// The vocabulary is cut into splits of whole chunks of kChunkTiles tiles, one
// split per thread. A thread walks its chunks: a BLAS matmul gives the chunk's
// logits [N, chunk] in a small buffer, and each row keeps its tile statistics (the
// maximum and s_t, with the second largest value and a_t when a confidence needs
// them). The race then picks each row's tile (it needs the row maximum, known only
// at the end); the rows that won the same tile get their logits of that tile
// computed again in one matmul and draw their token there. That matmul may round a
// logit differently from the chunk's (another shape, another BLAS kernel), so the
// outputs that compare the token's logit with the rest (log-probability, confidence)
// take the winning tile's statistics from the same recomputed logits: a last-bit
// difference divided by a small temperature would otherwise give a log-probability
// far from the truth, even above 0. Where h . w overflows float32 the two products can
// disagree more: one gives an infinity, the other NaN (its partial sums reach +inf and
// -inf), read as -inf; a row whose recomputed tile holds no drawable logit is returned
// invalid rather than with a token the race never saw.
// A vocabulary of one tile (V <= 256) keeps the logits of its one chunk and draws from
// them: nothing is computed again.
// Memory: N x chunk floats per split and N x n_tiles tile statistics.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "stream.h"
#include "sample_categorical.h"

namespace ddpd {
namespace cpu {
namespace {

constexpr int64_t kChunkTiles = 16;
constexpr int64_t kChunk = kChunkTiles * kTile;

struct HeadArgs {
  at::Tensor hidden;  // float32 [N, H]
  const at::Tensor& weight;
  const std::optional<at::Tensor>& bias;
  float temperature;  // < 0: greedy
  const float* temperature_row;
  DrawInputs in;

  float given_temperature(int64_t r) const { return temperature_row ? temperature_row[r] : temperature; }
};

// float32 logits [len(h), width] of the tokens [first, first + width): h @ w^T + b.
void head_logits(const HeadArgs& a, int64_t first, int64_t width, const at::Tensor& h, at::Tensor& out) {
  const at::Tensor w = a.weight.narrow(0, first, width).to(at::kFloat);
  if (a.bias) {
    at::addmm_out(out, a.bias->narrow(0, first, width).to(at::kFloat), h, w.t());
  } else {
    at::mm_out(out, h, w.t());
  }
}

// Tile statistics of every row for the tiles of the chunks [first_chunk, end_chunk),
// into stats [N, n_tiles]; the chunk's logits go to `kept` where given ([N, V], a
// vocabulary of one chunk), else to a buffer of the split's own.
void stats_split(const HeadArgs& a, int64_t first_chunk, int64_t end_chunk, TileStats* stats,
                 at::Tensor* kept = nullptr) {
  const int64_t rows = a.hidden.size(0), vocab = a.weight.size(0), tiles = n_tiles(vocab);
  at::Tensor buf = kept ? *kept : at::empty({rows, std::min(kChunk, vocab)}, a.hidden.options());
  std::array<float, kTile> tile;
  for (int64_t c = first_chunk; c < end_chunk; ++c) {
    const int64_t first = c * kChunk, width = std::min(kChunk, vocab - first);
    at::Tensor logits = buf.narrow(1, 0, width);
    head_logits(a, first, width, a.hidden, logits);
    const float* chunk = logits.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const RowMask mask = a.in.mask(r, vocab);
      const float t = effective_temperature(a.given_temperature(r));
      for (int64_t start = first; start < first + width; start += kTile) {
        const int64_t n = std::min(kTile, vocab - start), i = start / kTile;
        load_tile(chunk + r * logits.stride(0) + (start - first), start, n, mask, tile.data());
        stats[r * tiles + i] = drawn_tile_stats(tile.data(), n, t, tiles, a.in);
      }
    }
  }
}

struct Outputs {
  int64_t* tokens;
  bool* valid;
  float* token_logit;  // the drawn token's logit, for the log-probability and confidence
  TileStats* stats;    // [N, n_tiles]: the winning tile's replaced when those outputs are asked for
};

// The token draw of the rows whose winning tile is `t`: their logits of that tile
// are computed again (one matmul for the group) and raced. A vocabulary of one tile
// passes the statistics' logits of every row instead (`single`, [N, V]): nothing to
// compute again, and the statistics already come from the logits drawn from.
void draw_group(const HeadArgs& a, int64_t t, const std::vector<int64_t>& group, const Outputs& out,
                const at::Tensor* single = nullptr) {
  const int64_t vocab = a.weight.size(0), tiles = n_tiles(vocab), start = t * kTile, n = std::min(kTile, vocab - start);
  at::Tensor logits;
  if (single) {
    logits = *single;
  } else {
    const at::Tensor index = at::tensor(group, a.hidden.options().dtype(at::kLong));
    logits = at::empty({static_cast<int64_t>(group.size()), n}, a.hidden.options());
    head_logits(a, start, n, a.hidden.index_select(0, index), logits);
  }
  std::array<float, kTile> tile;
  for (size_t i = 0; i < group.size(); ++i) {
    const int64_t r = group[i];
    const float given = a.given_temperature(r);
    load_tile(logits.data_ptr<float>() + (single ? r : static_cast<int64_t>(i)) * n, start, n, a.in.mask(r, vocab),
              tile.data());
    const float temp = effective_temperature(given);
    out.tokens[r] = draw_in_tile(tile.data(), start, n, temp, is_greedy(given), a.in.uniforms(r));
    out.token_logit[r] = tile[out.tokens[r] - start];
    if (out.token_logit[r] == kNegInf) out.valid[r] = false;  // an overflow the recompute lost
    if (!single && (a.in.logprob || a.in.confidence)) {
      out.stats[r * tiles + t] = tile_stats(tile.data(), n, temp, a.in.confidence == 2, a.in.confidence == 3);
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_from_hidden_cpu(
    const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias, double temperature,
    const std::optional<at::Tensor>& temperature_t, const std::optional<at::Tensor>& exclude_ids,
    const std::optional<at::Tensor>& exclude_per_row, const std::optional<at::Tensor>& allowed,
    const std::optional<at::Tensor>& noise, int64_t seed, int64_t offset, const std::optional<at::Tensor>& row_ids,
    const std::optional<at::Tensor>& seed_tensor, const std::optional<at::Tensor>& offset_tensor, bool logprob,
    int64_t confidence) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "hidden [N, H] and weight [V, H] must share H");
  const int64_t rows = hidden.size(0), vocab = weight.size(0), tiles = n_tiles(vocab);
  const HeadArgs a{hidden.to(at::kFloat).contiguous(),
                   weight,
                   bias,
                   static_cast<float>(temperature),
                   optional_ptr<float>(temperature_t),
                   draw_inputs(vocab, exclude_ids, exclude_per_row, allowed, noise, seed, offset, row_ids, seed_tensor,
                               offset_tensor, logprob, confidence)};
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(chunks, at::get_num_threads()));
  std::vector<TileStats> stats(rows * tiles);
  at::Tensor single;  // a vocabulary of one tile: its logits, kept for the draw
  if (tiles == 1) {
    single = at::empty({rows, vocab}, a.hidden.options());
    stats_split(a, 0, 1, stats.data(), &single);
  } else {
    at::parallel_for(0, splits, 1, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        stats_split(a, s * chunks / splits, (s + 1) * chunks / splits, stats.data());
      }
    });
  }

  const auto opts = hidden.options();
  at::Tensor tokens = at::zeros({rows}, opts.dtype(at::kLong));
  at::Tensor valid = at::empty({rows}, opts.dtype(at::kBool));
  std::vector<float> row_max(rows), token_logit(rows, kNegInf);
  std::vector<std::vector<int64_t>> groups(tiles);  // the rows each tile won
  for (int64_t r = 0; r < rows; ++r) {
    const float given = a.given_temperature(r);
    const int64_t winner = race(stats.data() + r * tiles, tiles, vocab, effective_temperature(given),
                                is_greedy(given), a.in.uniforms(r), &row_max[r]);
    valid.data_ptr<bool>()[r] = row_max[r] > kNegInf;
    if (row_max[r] > kNegInf) groups[winner].push_back(r);  // an invalid row keeps token 0
  }
  std::vector<int64_t> won;
  for (int64_t t = 0; t < tiles; ++t) {
    if (!groups[t].empty()) won.push_back(t);
  }
  const Outputs out{tokens.data_ptr<int64_t>(), valid.data_ptr<bool>(), token_logit.data(), stats.data()};
  at::parallel_for(0, static_cast<int64_t>(won.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) draw_group(a, won[i], groups[won[i]], out, tiles == 1 ? &single : nullptr);
  });

  at::Tensor lp = at::empty({logprob ? rows : 0}, opts.dtype(at::kFloat));
  at::Tensor conf = at::empty({confidence ? rows : 0}, opts.dtype(at::kFloat));
  for (int64_t r = 0; r < rows && (logprob || confidence); ++r) {
    const float t = effective_temperature(a.given_temperature(r));
    const TileStats* row = stats.data() + r * tiles;
    float m = kNegInf;  // the row maximum again, the winning tile's recomputed
    for (int64_t i = 0; i < tiles; ++i) m = std::max(m, row[i].max);
    if (!valid.data_ptr<bool>()[r]) m = kNegInf;  // nothing drawn: the outputs of an invalid row
    const RowStats rs = row_stats(row, tiles, m, t, confidence == 2, confidence == 3);
    if (logprob) lp.data_ptr<float>()[r] = m > kNegInf ? shift(token_logit[r], m, t) - rs.log_z : kNegInf;
    if (confidence) {
      conf.data_ptr<float>()[r] = ddpd::cpu::confidence(static_cast<int>(confidence), token_logit[r], m, t, rs);
    }
  }
  return {tokens, valid, lp, conf};
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def(
      "sample_from_hidden_cpu(Tensor hidden, Tensor weight, Tensor? bias, float temperature, Tensor? temperature_t, "
      "Tensor? exclude_ids, Tensor? exclude_per_row, Tensor? allowed, Tensor? noise, int seed, int offset, "
      "Tensor? row_ids, Tensor? seed_tensor, Tensor? offset_tensor, bool logprob, int confidence) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("sample_from_hidden_cpu", &ddpd::cpu::sample_from_hidden_cpu); }
