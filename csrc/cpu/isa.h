// Instruction-set selection for the CPU kernels. The portable scalar kernels are always compiled; the
// host's SIMD kernels (AVX2+FMA+F16C, AVX-VNNI and AVX-512 with VNNI and VBMI on x86-64, NEON with and
// without the dot-product extension on arm64) are compiled when the target has them and used when the
// running CPU supports them. REGOLITH_ISA=scalar|avx2|avxvnni|avx512|neon|neondot overrides at start-up.
#pragma once

#include <string_view>
#include <vector>

namespace regolith::cpu {

enum class Isa { Scalar, Avx2, AvxVnni, Avx512, Neon, NeonDot };  // each better than the one before

std::string_view isa_name(Isa isa);
std::vector<Isa> available_isas();  // compiled in and supported by this CPU, best last
Isa active_isa();
void set_active_isa(Isa isa);  // throws regolith::Error if not available
Isa isa_from_name(std::string_view name);  // throws regolith::Error for unknown names

}  // namespace regolith::cpu
