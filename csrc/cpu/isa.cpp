#include "isa.h"

#include <c10/util/Exception.h>

namespace ddpd {
namespace cpu {

std::optional<Isa> isa_named(c10::string_view name) {
  bool avx2 = false, avx512 = false;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  avx2 = __builtin_cpu_supports("avx2");
  avx512 = __builtin_cpu_supports("avx512f");
#endif
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return avx2 ? std::optional<Isa>(Isa::kAvx2) : std::nullopt;
  if (name == "avx512") return avx512 ? std::optional<Isa>(Isa::kAvx512) : std::nullopt;
  if (name == "best") return avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kScalar;
  return std::nullopt;
}

Isa best_isa() {
  static const Isa best = *isa_named("best");
  return best;
}

Isa require_isa(c10::string_view name) {
  const std::optional<Isa> isa = isa_named(name);
  TORCH_CHECK_VALUE(isa.has_value(), "no path '", name, "' on this CPU (scalar, avx2, avx512 or best)");
  return *isa;
}

}  // namespace cpu
}  // namespace ddpd
