// CPU kernels of ddpd::compact, ddpd::compact_fixed and ddpd::scatter_back: the
// rows of a batch whose `active` flag is set are packed to the front (finished
// sequences leave the batch) and later written back to their rows. Rows of any
// dtype and trailing shape are moved as raw bytes. Consecutive rows that stay
// consecutive are copied as one block (runs), and the copies of all tensors share
// one parallel region.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

namespace ddpd {
namespace cpu {
namespace {

constexpr int64_t kTaskBytes = 1 << 16;  // work of one parallel task, at most

int64_t row_bytes(const at::Tensor& t) {
  int64_t elements = 1;
  for (int64_t d = 1; d < t.dim(); ++d) elements *= t.size(d);
  return elements * static_cast<int64_t>(t.element_size());
}

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

// One block copy: `rows` rows of `bytes` bytes from `from` to `to`.
struct Copy {
  const char* from;
  char* to;
  int64_t rows, bytes;
};

// Cuts every run of every (source, destination) pair into copies of at most
// kTaskBytes and runs them all in one parallel region. to_batch: the batch side
// is the destination (scatter_back), else the source (compact).
void copy_runs(const std::vector<Run>& runs, const std::vector<std::pair<const at::Tensor*, at::Tensor*>>& pairs,
               bool to_batch) {
  std::vector<Copy> copies;
  for (const auto& [src, dst] : pairs) {
    const int64_t bytes = row_bytes(*src);
    if (bytes == 0) continue;
    const char* from = static_cast<const char*>(src->data_ptr());
    char* to = static_cast<char*>(dst->data_ptr());
    const int64_t step = std::max<int64_t>(1, kTaskBytes / bytes);
    for (const Run& run : runs) {
      for (int64_t r = 0; r < run.rows; r += step) {
        const int64_t rows = std::min(step, run.rows - r);
        const int64_t packed = run.packed + r, batch = run.batch + r;
        copies.push_back(to_batch ? Copy{from + packed * bytes, to + batch * bytes, rows, bytes}
                                  : Copy{from + batch * bytes, to + packed * bytes, rows, bytes});
      }
    }
  }
  at::parallel_for(0, static_cast<int64_t>(copies.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      std::memcpy(copies[c].to, copies[c].from, copies[c].rows * copies[c].bytes);
    }
  });
}

void check_rows(const at::Tensor& active, at::TensorList tensors) {
  TORCH_CHECK(active.dim() == 1 && active.scalar_type() == at::kBool,
              "compact: active must be a 1-D bool tensor, got ", active.scalar_type(), " ",
              active.sizes());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.layout() == at::kStrided && t.dim() >= 1 && t.size(0) == active.size(0) &&
                    t.device() == active.device(),
                "compact: tensors[", i, "] must be a dense tensor on ", active.device(),
                " with ", active.size(0), " rows, got ", t.sizes(), " on ", t.device());
  }
}

// Row numbers of the active rows, in order.
std::vector<int64_t> active_rows(const at::Tensor& active) {
  const at::Tensor flags = active.contiguous();
  const bool* a = flags.data_ptr<bool>();
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < flags.size(0); ++r) {
    if (a[r]) rows.push_back(r);
  }
  return rows;
}

// Packed copies (out_rows rows, zero past the first `count`) of every tensor.
std::vector<at::Tensor> gather(at::TensorList tensors, const std::vector<int64_t>& rows, int64_t count,
                               int64_t out_rows) {
  std::vector<at::Tensor> sources, packed;
  for (const at::Tensor& t : tensors) {
    sources.push_back(t.contiguous());
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes[0] = out_rows;
    packed.push_back(at::empty(sizes, t.options().memory_format(at::MemoryFormat::Contiguous)));
    const int64_t bytes = row_bytes(t);
    std::memset(static_cast<char*>(packed.back().data_ptr()) + count * bytes, 0, (out_rows - count) * bytes);
  }
  std::vector<std::pair<const at::Tensor*, at::Tensor*>> pairs;
  for (size_t i = 0; i < sources.size(); ++i) pairs.emplace_back(&sources[i], &packed[i]);
  copy_runs(runs_of(rows.data(), count), pairs, false);
  return packed;
}

std::tuple<std::vector<at::Tensor>, at::Tensor> compact(const at::Tensor& active,
                                                        at::TensorList tensors) {
  check_rows(active, tensors);
  const std::vector<int64_t> rows = active_rows(active);
  const int64_t count = static_cast<int64_t>(rows.size());
  at::Tensor index = at::empty({count}, active.options().dtype(at::kLong));
  std::copy(rows.begin(), rows.end(), index.data_ptr<int64_t>());
  return {gather(tensors, rows, count, count), index};
}

std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor> compact_fixed(const at::Tensor& active,
                                                                          int64_t capacity,
                                                                          at::TensorList tensors) {
  check_rows(active, tensors);
  TORCH_CHECK(capacity >= 0, "compact_fixed: capacity must be >= 0, got ", capacity);
  const std::vector<int64_t> rows = active_rows(active);
  const int64_t total = static_cast<int64_t>(rows.size());
  const int64_t count = std::min(total, capacity);
  at::Tensor index = at::empty({capacity}, active.options().dtype(at::kLong));
  int64_t* ip = index.data_ptr<int64_t>();
  std::copy(rows.begin(), rows.begin() + count, ip);
  std::fill(ip + count, ip + capacity, int64_t{-1});
  at::Tensor active_count = at::empty({}, active.options().dtype(at::kLong));
  *active_count.data_ptr<int64_t>() = total;
  return {gather(tensors, rows, count, capacity), index, active_count};
}

at::Tensor& scatter_back(const at::Tensor& index, const at::Tensor& packed, at::Tensor& out) {
  TORCH_CHECK(index.dim() == 1 && index.scalar_type() == at::kLong,
              "scatter_back: index must be a 1-D int64 tensor, got ", index.scalar_type(), " ",
              index.sizes());
  TORCH_CHECK(packed.dim() >= 1 && packed.size(0) == index.size(0) &&
                  packed.scalar_type() == out.scalar_type() && out.dim() == packed.dim() &&
                  packed.sizes().slice(1) == out.sizes().slice(1),
              "scatter_back: packed must be [", index.size(0), ", *out.shape[1:]] of dtype ",
              out.scalar_type(), ", got ", packed.scalar_type(), " ", packed.sizes());
  const at::Tensor idx = index.contiguous(), src = packed.contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  const std::vector<Run> runs = runs_of(ip, idx.size(0));
  for (const Run& run : runs) {
    TORCH_CHECK(run.batch + run.rows <= out.size(0), "scatter_back: index[", run.packed + run.rows - 1, "] = ",
                run.batch + run.rows - 1, " is out of range for out with ", out.size(0), " rows");
  }
  at::Tensor dense = out.is_contiguous() ? out : out.contiguous();
  copy_runs(runs, {{&src, &dense}}, true);
  if (!dense.is_same(out)) out.copy_(dense);
  return out;
}

}  // namespace
}  // namespace cpu
}  // namespace ddpd

TORCH_LIBRARY_IMPL(ddpd, CPU, m) {
  m.impl("compact", &ddpd::cpu::compact);
  m.impl("compact_fixed", &ddpd::cpu::compact_fixed);
  m.impl("scatter_back", &ddpd::cpu::scatter_back);
}
