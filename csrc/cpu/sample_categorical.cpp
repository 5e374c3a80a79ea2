// CPU path of ddpd.ops.sample_categorical: one token per row of logits [N, V]
// (uniforms: column j for token j, column V + t for tile t) by the two-level exact
// Gumbel-max of sample_categorical.h (relative to the tile and row maxima), with the
// sampling controls: per-row temperature (greedy rows race without noise), exclusions
// and an allowed mask, and the truncation threshold of top-k / top-p / min-p, found
// without sorting the vocabulary (truncation_threshold). Without truncation one pass over
// the logits keeps a few floats per tile, plus the winning tile again; with it the row is
// first copied (masked, as float32; its maximum, allowed count and tile maxima found on the
// way) and its threshold found, and the draw skips the tiles below the threshold. No
// probabilities are written.
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
// tile_maxima (null, or the maximum of each tile of the copy): a tile below the row's
// threshold is skipped, all -inf (past top-k's or top-p's threshold, most of a row).
template <typename scalar_t>
void draw_row(const scalar_t* row, int64_t vocab, const RowMask& mask, float t, bool greedy, const RowUniforms& u,
              const CategoricalArgs& a, std::vector<TileStats>& stats, float* buf, int64_t r, const Outputs& out,
              const float* tile_maxima = nullptr) {
  const int64_t tiles = n_tiles(vocab);
  for (int64_t i = 0; i < tiles; ++i) {
    if (tile_maxima && tile_maxima[i] < mask.tau) {
      stats[i] = TileStats{};
      continue;
    }
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
    std::vector<float> copy(truncates ? vocab : 0), tile_maxima(truncates ? n_tiles(vocab) : 0);
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
      RowExtent extent;  // found while copying: no pass over the copy for it
      for (int64_t start = 0; start < vocab; start += kTile) {
        const int64_t n = std::min(kTile, vocab - start);
        load_tile(row + start, start, n, mask, buf.data());
        const RowExtent tile = row_extent(buf.data(), n);
        tile_maxima[start / kTile] = tile.max;
        extent.max = tile.max > extent.max ? tile.max : extent.max;
        extent.allowed += tile.allowed;
        std::copy(buf.begin(), buf.begin() + n, copy.begin() + start);
      }
      mask.tau = truncation_threshold(copy.data(), vocab, extent, t, a.controls.k(r), a.controls.p(r),
                                      a.controls.min_p(r), scratch);
      draw_row(copy.data(), vocab, mask, t, greedy, a.in.uniforms(r), a, stats, buf.data(), r, out,
               tile_maxima.data());
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

// The truncation threshold of each row of masked float32 logits x [N, V] (-inf where not
// allowed) under per-row temperatures t (effective: greedy rows at 1), top_k, top_p and
// log_min_p: a test op, which holds each search of truncation_threshold (short, middling
// and long rows) to the reference's tau.
at::Tensor truncation_threshold_cpu(const at::Tensor& x, const at::Tensor& t, const at::Tensor& top_k,
                                    const at::Tensor& top_p, const at::Tensor& log_min_p) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat,
              "x must be a contiguous float32 [N, V] tensor");
  const int64_t rows = x.size(0), vocab = x.size(1);
  const auto check = [rows](const at::Tensor& c, at::ScalarType dtype, const char* name) {
    TORCH_CHECK(c.dim() == 1 && c.size(0) == rows && c.is_contiguous() && c.scalar_type() == dtype, name,
                " must be a contiguous [N] tensor of ", dtype);
  };
  check(t, at::kFloat, "t");
  check(top_k, at::kLong, "top_k");
  check(top_p, at::kFloat, "top_p");
  check(log_min_p, at::kFloat, "log_min_p");
  at::Tensor tau = at::empty({rows}, x.options());
  ThresholdScratch scratch;
  for (int64_t r = 0; r < rows; ++r) {
    tau.data_ptr<float>()[r] =
        truncation_threshold(x.data_ptr<float>() + r * vocab, vocab, t.data_ptr<float>()[r],
                             top_k.data_ptr<int64_t>()[r], top_p.data_ptr<float>()[r],
                             log_min_p.data_ptr<float>()[r], scratch);
  }
  return tau;
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
  m.def("truncation_threshold_cpu(Tensor x, Tensor t, Tensor top_k, Tensor top_p, Tensor log_min_p) -> Tensor");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) {
  m.impl("sample_categorical_cpu", &ddpd::cpu::sample_categorical_cpu);
  m.impl("truncation_threshold_cpu", &ddpd::cpu::truncation_threshold_cpu);
}
