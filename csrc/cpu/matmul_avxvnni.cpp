// x86-64 kernels for AVX-VNNI machines without AVX-512 (Intel client cores since Alder Lake; compiled with
// -mavxvnni on top of AVX2's flags and used only when the CPU has it): AVX2's kernels with the float-scale
// types' byte products done by vpdpbusd, which sums four byte products into each int32 lane where AVX2 takes
// vpmaddubsw and vpmaddwd. The lanes hold AVX2's integers (its int16 pair sums cannot saturate: |w| <= 128,
// |x| <= 127) and the float steps are AVX2's, so the results are AVX2's bit for bit (tests/test_matmul.py).
#include "cpu/simd_avx2.h"

namespace regolith::cpu {
namespace {

struct VexDpbusd {
    static __m256i dpbusd(__m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s); }
};
using SimdAvxVnni = SimdAvx2Vnni<VexDpbusd>;

}  // namespace

const KernelTable& kernels_avxvnni() {
    static const KernelTable table = make_kernel_table<SimdAvxVnni>();
    return table;
}

}  // namespace regolith::cpu
