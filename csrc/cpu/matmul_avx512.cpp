// x86-64 kernels for AVX-512 machines (F, BW, VL, DQ, VNNI, VBMI; compiled with those flags on top of AVX2's
// and used only when the CPU has them). The AVX2 kernels with their integer products done by VNNI: vpdpbusd
// sums four byte products into each int32 lane and vpdpwssd multiplies-and-adds pairs of int16 into int32,
// in one instruction where AVX2 takes two or three. The lanes hold the same integers as AVX2's (no sum here
// can saturate AVX2's int16 steps: |w| <= 128 with |x| <= 127, or |w| <= 64 with x + 128), and every float
// operation is AVX2's, so the results are AVX2's bit for bit (tests/test_matmul.py checks it).
#include <type_traits>

#include "cpu/simd_avx2.h"

namespace regolith::cpu {
namespace {

// IQ2_XS, 64 codes (two 32-code chunks) per step: the eight 9-bit grid indices gathered at once, and the
// eight 7-bit sign indices turned into sign bytes in registers (bit 7 is the parity of the other seven, as
// ggml's ksigns_iq2xs table holds), applied through a 64-bit mask register.
struct Avx512Iq2xs : Avx2Codes<RG_TYPE_IQ2_XS> {
    static void codes(const block_iq2_xs& b, __m256i* q) {
        const auto* grid = reinterpret_cast<const long long*>(rg_iq2xs_grid);
        for (int i = 0; i < 4; ++i) {
            const __m512i v = _mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 8 * i)));
            const __m512i g = _mm512_i64gather_epi64(_mm512_and_si512(v, _mm512_set1_epi64(511)), grid, 8);
            const __m512i s7 = _mm512_srli_epi64(v, 9);
            const __m512i parity = _mm512_and_si512(_mm512_popcnt_epi64(s7), _mm512_set1_epi64(1));
            const __m512i sign = _mm512_or_si512(s7, _mm512_slli_epi64(parity, 7));
            const __mmask64 neg = _cvtu64_mask64(uint64_t(_mm_cvtsi128_si64(_mm512_cvtepi64_epi8(sign))));
            const __m512i c = _mm512_mask_sub_epi8(g, neg, _mm512_setzero_si512(), g);
            q[2 * i] = _mm512_castsi512_si256(c);
            q[2 * i + 1] = _mm512_extracti64x4_epi64(c, 1);
        }
    }
};

struct SimdAvx512 : SimdAvx2 {
    template <uint32_t TYPE>
    using Codes = std::conditional_t<TYPE == RG_TYPE_IQ2_XS, Avx512Iq2xs, Avx2Codes<TYPE>>;
    template <bool SPLIT>
    static void dot32(const W& w, const int8_t* x, float s_lo, float s_hi, Acc& acc) {
        dot32x<SPLIT>(w, load_x(x), s_lo, s_hi, acc);
    }
    template <bool SPLIT>
    static void dot32x(const W& w, const X& xv, float s_lo, float s_hi, Acc& acc) {
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w.abs, _mm256_sign_epi8(xv, w.w));
        const __m256 scale = SPLIT ? _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s_lo)), _mm_set1_ps(s_hi), 1)
                                   : _mm256_set1_ps(s_lo);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc);
    }
};

}  // namespace

const KernelTable& kernels_avx512() {
    static const KernelTable table = make_kernel_table<SimdAvx512>();
    return table;
}

}  // namespace regolith::cpu
