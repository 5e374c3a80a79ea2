// CPU path of ddpd.ops.sample_categorical: one token per row of logits [N, V]
// (uniforms: column j for token j, column V + t for tile t) by the two-level exact
// Gumbel-max of sample_categorical.h (relative to the tile and row maxima), with the
// sampling controls: per-row temperature (greedy rows race without noise), exclusions
// and an allowed mask, and the truncation threshold of top-k / top-p / min-p, found
// without sorting (truncation_threshold). Without truncation one pass over the logits
// keeps a few floats per tile, plus the winning tile again; with it the row is first
// copied (masked, as float32) and its threshold found. No probabilities are written.
// The log-probability of the drawn token and its confidence come from the same tile
// statistics. Rows run in parallel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <tuple>
#include <vector>

#include "stream.h"
#include "sample_categorical.h"

namespace ddpd {
namespace cpu {
namespace {

struct CategoricalArgs {
  Controls controls;
  DrawInputs in;
};

struct Outputs {
  int64_t* tokens;
  bool* valid;
  float* logprob;
  float* confidence;
};

// One row, read from `row` (the logits, or their masked float32 copy when truncating).
template <typename scalar_t>
void draw_row(const scalar_t* row, int64_t vocab, const RowMask& mask, float t, bool greedy, const RowUniforms& u,
              const CategoricalArgs& a, std::vector<TileStats>& stats, float* buf, int64_t r, const Outputs& out) {
  const int64_t tiles = n_tiles(vocab);
  for (int64_t i = 0; i < tiles; ++i) {
    const int64_t start = i * kTile, n = std::min(kTile, vocab - start);
    load_tile(row + start, start, n, mask, buf);
    stats[i] = drawn_tile_stats(buf, n, t, tiles, a.in);
  }
  float row_max;
  const int64_t winner = race(stats.data(), tiles, vocab, t, greedy, u, &row_max);
  const int64_t start = winner * kTile, n = std::min(kTile, vocab - start);
  if (tiles > 1) load_tile(row + start, start, n, mask, buf);  // a single tile is still in buf
  const bool ok = row_max > kNegInf;
  out.valid[r] = ok;
  out.tokens[r] = ok ? draw_in_tile(buf, start, n, t, greedy, u) : 0;
  if (!a.in.logprob && a.in.confidence == 0) return;
  const RowStats rs = row_stats(stats.data(), tiles, row_max, t, a.in.confidence == 2, a.in.confidence == 3);
  const float token_logit = ok ? buf[out.tokens[r] - start] : kNegInf;
  if (a.in.logprob) out.logprob[r] = ok ? shift(token_logit, row_max, t) - rs.log_z : kNegInf;
  if (a.in.confidence) out.confidence[r] = confidence(a.in.confidence, token_logit, row_max, t, rs);
}

template <typename scalar_t>
void sample_rows(const at::Tensor& logits, const CategoricalArgs& a, const Outputs& out) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const scalar_t* x = logits.data_ptr<scalar_t>();
  const bool truncates = a.controls.truncates();
  const int64_t grain = std::max<int64_t>(1, 32768 / vocab);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::array<float, kTile> buf;
    std::vector<TileStats> stats(n_tiles(vocab));
    std::vector<float> copy(truncates ? vocab : 0);
    ThresholdScratch scratch;
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* row = x + r * vocab;
      RowMask mask = a.in.mask(r, vocab);
      const float given = a.controls.t(r);
      const bool greedy = is_greedy(given);
      const float t = effective_temperature(given);
      if (!truncates) {
        draw_row(row, vocab, mask, t, greedy, a.in.uniforms(r), a, stats, buf.data(), r, out);
        continue;
      }
      for (int64_t start = 0; start < vocab; start += kTile) {
        load_tile(row + start, start, std::min(kTile, vocab - start), mask, buf.data());
        std::copy(buf.begin(), buf.begin() + std::min(kTile, vocab - start), copy.begin() + start);
      }
      mask.tau = truncation_threshold(copy.data(), vocab, t, a.controls.k(r), a.controls.p(r),
                                      a.controls.min_p(r), scratch);
      draw_row(copy.data(), vocab, mask, t, greedy, a.in.uniforms(r), a, stats, buf.data(), r, out);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_categorical_cpu(
    const at::Tensor& logits, double temperature, const std::optional<at::Tensor>& temperature_t,
    const std::optional<at::Tensor>& exclude_ids, const std::optional<at::Tensor>& exclude_per_row,
    const std::optional<at::Tensor>& allowed, int64_t top_k, const std::optional<at::Tensor>& top_k_t, double top_p,
    const std::optional<at::Tensor>& top_p_t, double log_min_p, const std::optional<at::Tensor>& log_min_p_t,
    const std::optional<at::Tensor>& noise, int64_t seed, int64_t offset, const std::optional<at::Tensor>& row_ids,
    const std::optional<at::Tensor>& seed_tensor, const std::optional<at::Tensor>& offset_tensor, bool logprob,
    int64_t confidence) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "logits must be a contiguous [N, V] tensor");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const Controls controls{static_cast<float>(temperature), optional_ptr<float>(temperature_t), top_k,
                          optional_ptr<int64_t>(top_k_t), static_cast<float>(top_p), optional_ptr<float>(top_p_t),
                          static_cast<float>(log_min_p), optional_ptr<float>(log_min_p_t)};
  const CategoricalArgs a{controls, draw_inputs(vocab, exclude_ids, exclude_per_row, allowed, noise, seed, offset,
                                                 row_ids, seed_tensor, offset_tensor, logprob, confidence)};
  const auto opts = logits.options();
  at::Tensor tokens = at::empty({rows}, opts.dtype(at::kLong));
  at::Tensor valid = at::empty({rows}, opts.dtype(at::kBool));
  at::Tensor lp = at::empty({logprob ? rows : 0}, opts.dtype(at::kFloat));
  at::Tensor conf = at::empty({confidence ? rows : 0}, opts.dtype(at::kFloat));
  const Outputs out{tokens.data_ptr<int64_t>(), valid.data_ptr<bool>(), lp.data_ptr<float>(), conf.data_ptr<float>()};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "sample_categorical_cpu",
                                  [&] { sample_rows<scalar_t>(logits, a, out); });
  return {tokens, valid, lp, conf};
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  m.def(
      "sample_categorical_cpu(Tensor logits, float temperature, Tensor? temperature_t, Tensor? exclude_ids, "
      "Tensor? exclude_per_row, Tensor? allowed, int top_k, Tensor? top_k_t, float top_p, Tensor? top_p_t, "
      "float log_min_p, Tensor? log_min_p_t, Tensor? noise, int seed, int offset, Tensor? row_ids, "
      "Tensor? seed_tensor, Tensor? offset_tensor, bool logprob, int confidence) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) { m.impl("sample_categorical_cpu", &ddpd::cpu::sample_categorical_cpu); }
