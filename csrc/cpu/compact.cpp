// CPU kernels of ddpd::compact, ddpd::compact_fixed and ddpd::scatter_back: the
// rows of a batch whose `active` flag is set are packed to the front (finished
// sequences leave the batch) and later written back to their rows. Rows of any
// dtype and trailing shape are moved as raw bytes, one memcpy per row.
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

int64_t row_bytes(const at::Tensor& t) {
  int64_t elements = 1;
  for (int64_t d = 1; d < t.dim(); ++d) elements *= t.size(d);
  return elements * static_cast<int64_t>(t.element_size());
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

// out[r] = src[index[r]] for r < count, zero for count <= r < out_rows.
at::Tensor gather_rows(const at::Tensor& t, const int64_t* index, int64_t count, int64_t out_rows) {
  const at::Tensor src = t.contiguous();
  std::vector<int64_t> sizes = src.sizes().vec();
  sizes[0] = out_rows;
  at::Tensor out = at::empty(sizes, src.options());
  const int64_t bytes = row_bytes(src);
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(bytes, 1));
  at::parallel_for(0, out_rows, grain, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      if (r < count) {
        std::memcpy(to + r * bytes, from + index[r] * bytes, bytes);
      } else {
        std::memset(to + r * bytes, 0, bytes);
      }
    }
  });
  return out;
}

std::tuple<std::vector<at::Tensor>, at::Tensor> compact(const at::Tensor& active,
                                                        at::TensorList tensors) {
  check_rows(active, tensors);
  const std::vector<int64_t> rows = active_rows(active);
  const int64_t count = static_cast<int64_t>(rows.size());
  at::Tensor index = at::empty({count}, active.options().dtype(at::kLong));
  std::copy(rows.begin(), rows.end(), index.data_ptr<int64_t>());
  std::vector<at::Tensor> packed;
  for (const at::Tensor& t : tensors) packed.push_back(gather_rows(t, rows.data(), count, count));
  return {packed, index};
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
  std::vector<at::Tensor> packed;
  for (const at::Tensor& t : tensors) packed.push_back(gather_rows(t, rows.data(), count, capacity));
  at::Tensor active_count = at::empty({}, active.options().dtype(at::kLong));
  *active_count.data_ptr<int64_t>() = total;
  return {packed, index, active_count};
}

void scatter_into(const at::Tensor& index, const at::Tensor& packed, at::Tensor& out) {
  const at::Tensor idx = index.contiguous(), src = packed.contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  const int64_t bytes = row_bytes(src), rows = src.size(0), out_rows = out.size(0);
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(ip[r] < out_rows, "scatter_back: index[", r, "] = ", ip[r],
                " is out of range for out with ", out_rows, " rows");
  }
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(bytes, 1));
  at::parallel_for(0, rows, grain, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      if (ip[r] >= 0) std::memcpy(to + ip[r] * bytes, from + r * bytes, bytes);
    }
  });
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
  if (out.is_contiguous()) {
    scatter_into(index, packed, out);
  } else {
    at::Tensor dense = out.contiguous();
    scatter_into(index, packed, dense);
    out.copy_(dense);
  }
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
