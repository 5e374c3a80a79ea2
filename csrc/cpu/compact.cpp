// CPU kernels of ddpd::compact_fixed and ddpd::scatter_back (the ops
// compact_fixed_kernel and scatter_back_kernel): the
// rows of a batch whose `active` flag is set are packed to the front (finished
// sequences leave the batch) and later written back to their rows. Rows of any
// dtype and trailing shape are moved as raw bytes. Consecutive rows that stay
// consecutive are copied as one block (runs), and the copies (and zero padding) of
// all tensors share one parallel region, split by bytes.
#include <ATen/Parallel.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "../compact.h"

namespace ddpd {
namespace cpu {
namespace {

// The bytes to write are split into blocks; a thread takes at least kGrainBlocks of
// them, so a small compaction runs on the calling thread without a parallel region.
constexpr int64_t kBlockBytes = 1 << 12;
constexpr int64_t kGrainBlocks = 16;

// Rows [packed, packed + rows) of the packed side are rows [batch, batch + rows)
// of the batch side.
struct Run {
  int64_t packed, batch, rows;
};

// Runs of index[0, count): maximal stretches where index grows by one. Negative
// entries (the padding of compact_fixed) belong to no run.
std::vector<Run> runs_of(const int64_t* index, int64_t count) {
  std::vector<Run> runs;
  for (int64_t r = 0; r < count; ++r) {
    if (index[r] < 0) continue;
    if (!runs.empty() && runs.back().packed + runs.back().rows == r &&
        runs.back().batch + runs.back().rows == index[r]) {
      ++runs.back().rows;
    } else {
      runs.push_back({r, index[r], 1});
    }
  }
  return runs;
}

// `bytes` bytes to write at `to`: a copy of `from`, or zeros where from is null.
struct Piece {
  const char* from;
  char* to;
  int64_t bytes;
};

// The pieces of every run of one (source, destination) pair of `bytes`-byte rows.
// to_batch: the batch side is the destination (scatter_back), else the source.
void add_runs(std::vector<Piece>& pieces, const std::vector<Run>& runs, const void* src, void* dst,
              int64_t bytes, bool to_batch) {
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  for (const Run& run : runs) {
    const int64_t f = (to_batch ? run.packed : run.batch) * bytes;
    const int64_t t = (to_batch ? run.batch : run.packed) * bytes;
    pieces.push_back({from + f, to + t, run.rows * bytes});
  }
}

// Writes all pieces in one parallel region. The threads get equal shares of the
// total bytes, not of the pieces: the rows of the tensors differ in size (tokens,
// logits, one time per row), so equal numbers of pieces would leave threads idle.
void write_pieces(const std::vector<Piece>& pieces) {
  std::vector<int64_t> start(pieces.size() + 1, 0);
  for (size_t p = 0; p < pieces.size(); ++p) start[p + 1] = start[p] + pieces[p].bytes;
  const int64_t total = start.back();
  const int64_t blocks = (total + kBlockBytes - 1) / kBlockBytes;
  at::parallel_for(0, blocks, kGrainBlocks, [&](int64_t first, int64_t last) {
    const int64_t lo = first * kBlockBytes, hi = std::min(last * kBlockBytes, total);
    size_t p = std::upper_bound(start.begin(), start.end(), lo) - start.begin() - 1;
    for (; p < pieces.size() && start[p] < hi; ++p) {
      const int64_t skip = std::max(lo, start[p]) - start[p];
      const int64_t bytes = std::min(hi, start[p + 1]) - start[p] - skip;
      if (bytes <= 0) continue;
      if (pieces[p].from == nullptr) {
        std::memset(pieces[p].to + skip, 0, bytes);
      } else {
        std::memcpy(pieces[p].to + skip, pieces[p].from + skip, bytes);
      }
    }
  });
}

// Number of set flags of a contiguous bool tensor.
int64_t count_active(const at::Tensor& flags) {
  const bool* a = flags.data_ptr<bool>();
  return std::count(a, a + flags.size(0), true);
}

// Writes the row numbers of the first `count` active rows to index.
void fill_active_rows(const at::Tensor& flags, int64_t count, int64_t* index) {
  const bool* a = flags.data_ptr<bool>();
  for (int64_t r = 0, i = 0; i < count; ++r) {
    if (a[r]) index[i++] = r;
  }
}

// at::empty without the trip through the dispatcher: this kernel only ever makes
// dense CPU tensors, and the dispatcher costs about as much as copying a short row.
at::Tensor empty_rows(const at::Tensor& like, int64_t rows) {
  std::vector<int64_t> sizes = like.sizes().vec();
  sizes[0] = rows;
  return at::detail::empty_cpu(sizes, like.scalar_type());
}

// Packed copies of every tensor: out_rows rows, the rows of index[0, count) first,
// zeros after them.
std::vector<at::Tensor> gather(at::TensorList tensors, const int64_t* index, int64_t count, int64_t out_rows) {
  const std::vector<Run> runs = runs_of(index, count);
  std::vector<at::Tensor> sources, packed;
  std::vector<Piece> pieces;
  sources.reserve(tensors.size());
  packed.reserve(tensors.size());
  pieces.reserve(tensors.size() * (runs.size() + 1));
  for (const at::Tensor& t : tensors) {
    sources.push_back(t.contiguous());
    packed.push_back(empty_rows(t, out_rows));
    const int64_t bytes = row_bytes(t);
    add_runs(pieces, runs, sources.back().data_ptr(), packed.back().data_ptr(), bytes, false);
    if (out_rows > count) {
      pieces.push_back({nullptr, static_cast<char*>(packed.back().data_ptr()) + count * bytes,
                        (out_rows - count) * bytes});
    }
  }
  write_pieces(pieces);
  return packed;
}

std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor> compact_fixed(const at::Tensor& active,
                                                                          int64_t capacity,
                                                                          at::TensorList tensors) {
  check_compact_args(active, tensors);
  TORCH_CHECK(capacity >= 0, "compact_fixed: capacity must be >= 0, got ", capacity);
  const at::Tensor flags = active.contiguous();
  const int64_t total = count_active(flags);
  const int64_t count = std::min(total, capacity);
  at::Tensor index = at::detail::empty_cpu({capacity}, at::kLong);
  int64_t* ip = index.data_ptr<int64_t>();
  fill_active_rows(flags, count, ip);
  std::fill(ip + count, ip + capacity, int64_t{-1});
  at::Tensor active_count = at::detail::empty_cpu({}, at::kLong);
  *active_count.data_ptr<int64_t>() = total;
  return {gather(tensors, ip, count, capacity), index, active_count};
}

at::Tensor& scatter_back(const at::Tensor& index, const at::Tensor& packed, at::Tensor& out) {
  check_scatter_back_args(index, packed, out);
  const at::Tensor idx = index.contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  const std::vector<Run> runs = runs_of(ip, idx.size(0));
  for (const Run& run : runs) {
    TORCH_CHECK(run.batch + run.rows <= out.size(0), "scatter_back: index[", run.packed + run.rows - 1, "] = ",
                run.batch + run.rows - 1, " is out of range for out with ", out.size(0), " rows");
  }
  at::Tensor dense = out.is_contiguous() ? out : out.contiguous();
  const at::Tensor src = scatter_source(packed, dense);
  std::vector<Piece> pieces;
  pieces.reserve(runs.size());
  add_runs(pieces, runs, src.data_ptr(), dense.data_ptr(), row_bytes(src), true);
  write_pieces(pieces);
  if (!dense.is_same(out)) out.copy_(dense);
  return out;
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_FRAGMENT(ddpd, m) {
  // The kernels behind the custom ops ddpd::compact_fixed and ddpd::scatter_back
  // (ddpd/ops/compact.py): pack the active rows into a fixed capacity, and write packed
  // rows back.
  m.def("compact_fixed_kernel(Tensor active, int capacity, Tensor[] tensors) -> (Tensor[], Tensor, Tensor)");
  m.def("scatter_back_kernel(Tensor index, Tensor packed, Tensor(a!) out) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(ddpd, CPU, m) {
  m.impl("compact_fixed_kernel", &ddpd::cpu::compact_fixed);
  m.impl("scatter_back_kernel", &ddpd::cpu::scatter_back);
}
