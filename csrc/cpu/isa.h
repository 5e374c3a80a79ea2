// The vector instruction sets the CPU kernels have paths for (uniforms.cpp,
// vector_math.cpp), and which of them this CPU has. Every path computes the same bits:
// the same IEEE operations in each lane, without fused multiply-adds.
#pragma once

#include <c10/util/string_view.h>

#include <optional>

namespace ddpd {
namespace cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

// The path named `name` ("scalar", "avx2", "avx512"; "best": the widest this CPU has), or
// nullopt where this CPU lacks it or the name is none of these.
std::optional<Isa> isa_named(c10::string_view name);

// The widest path this CPU has, found at the first call.
Isa best_isa();

// ValueError unless this CPU has the path `name`; the path otherwise (for the test ops
// that run one path by name).
Isa require_isa(c10::string_view name);

}  // namespace cpu
}  // namespace ddpd
