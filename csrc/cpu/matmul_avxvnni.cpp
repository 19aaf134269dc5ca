// x86-64 kernels for AVX-VNNI machines without AVX-512 (Intel client cores since Alder Lake; compiled with
// -mavxvnni on top of AVX2's flags and used only when the CPU has it): AVX2's kernels with the float-scale
// types' byte products done by vpdpbusd, which sums four byte products into each int32 lane where AVX2 takes
// vpmaddubsw and vpmaddwd. The lanes hold AVX2's integers (its int16 pair sums cannot saturate: |w| <= 128,
// |x| <= 127) and the float steps are AVX2's, so the results are AVX2's bit for bit (tests/test_matmul.py).
#include "cpu/simd_avx2.h"

namespace regolith::cpu {
namespace {

struct SimdAvxVnni : SimdAvx2 {
    template <bool SPLIT>
    static void dot32(const W& w, const int8_t* x, float s_lo, float s_hi, Acc& acc) {
        dot32x<SPLIT>(w, load_x(x), s_lo, s_hi, acc);
    }
    template <bool SPLIT>
    static void dot32x(const W& w, const X& xv, float s_lo, float s_hi, Acc& acc) {
        const __m256i s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w.abs, _mm256_sign_epi8(xv, w.w));
        const __m256 scale = SPLIT ? _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s_lo)), _mm_set1_ps(s_hi), 1)
                                   : _mm256_set1_ps(s_lo);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc);
    }
};

}  // namespace

const KernelTable& kernels_avxvnni() {
    static const KernelTable table = make_kernel_table<SimdAvxVnni>();
    return table;
}

}  // namespace regolith::cpu
