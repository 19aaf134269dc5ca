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

// IQ2_XS products of at most kMaxTok tokens (decode, speculative verification), 64 codes per step: the
// signs go onto the activations (a masked negation) rather than the weights, so the unsigned grid bytes
// meet them in one vpmaddubsw and one vpmaddwd with the sub-scales per zmm. Each int32 lane holds what
// SimdAvx2's does for the same four codes; the two 64-code steps of a half block are added and folded to
// AVX2's eight lanes before the float step (AVX2's FusedKernel, to the bit). Prefill takes QuantKernel.
struct Iq2xsKernel {
    using Q = QuantKernel<SimdAvx512, BlockDecoder<RG_TYPE_IQ2_XS>>;

    // 16 sub-scales 2 * s + 1 (IntScales<IQ2_XS>) as int16, and the block's float factor
    static __m256i scales(const block_iq2_xs& b, float& ds) {
        const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales));
        const __m128i nib = _mm_set1_epi8(0x0f);
        const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
        const __m256i w = _mm256_cvtepu8_epi16(s);
        ds = half_scale(b.d) * 0.125f;
        return _mm256_add_epi16(_mm256_add_epi16(w, w), _mm256_set1_epi16(1));
    }

    template <int NT>
    static void dot_row(const MatmulArgs& a, int64_t r, float* out) {
        const int64_t cols = a.cols, nb = cols / 256;
        const auto* blocks = reinterpret_cast<const block_iq2_xs*>(a.w + r * a.row_bytes);
        const auto* grid = reinterpret_cast<const long long*>(rg_iq2xs_grid);
        // int16 lane i of a 64-code step takes the sub-scale of its 16-code group: i / 8
        const __m512i group = _mm512_srli_epi16(
            _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10,
                             9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            3);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_weights(blocks + b);
            float ds;
            const __m512i sc = _mm512_castsi256_si512(scales(blocks[b], ds));
            for (int h = 0; h < 2; ++h) {
                __m512i ia[NT];
                for (int t = 0; t < NT; ++t) ia[t] = _mm512_setzero_si512();
                for (int c = 2 * h; c < 2 * h + 2; ++c) {
                    const __m512i v = _mm512_cvtepu16_epi64(
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].qs + 8 * c)));
                    const __m512i g = _mm512_i64gather_epi64(_mm512_and_si512(v, _mm512_set1_epi64(511)), grid, 8);
                    const __m512i s7 = _mm512_srli_epi64(v, 9);
                    const __m512i parity = _mm512_and_si512(_mm512_popcnt_epi64(s7), _mm512_set1_epi64(1));
                    const __m512i sign = _mm512_or_si512(s7, _mm512_slli_epi64(parity, 7));
                    const __mmask64 neg = _cvtu64_mask64(uint64_t(_mm_cvtsi128_si64(_mm512_cvtepi64_epi8(sign))));
                    const __m512i scale =
                        _mm512_permutexvar_epi16(_mm512_add_epi16(group, _mm512_set1_epi16(int16_t(4 * c))), sc);
                    for (int t = 0; t < NT; ++t) {
                        const __m512i x = _mm512_loadu_si512(a.xq + t * cols + b * 256 + 64 * c);
                        const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                        ia[t] = _mm512_add_epi32(ia[t], _mm512_madd_epi16(_mm512_maddubs_epi16(g, xs), scale));
                    }
                }
                for (int t = 0; t < NT; ++t) {
                    const __m256i ia8 =
                        _mm256_add_epi32(_mm512_castsi512_si256(ia[t]), _mm512_extracti64x4_epi64(ia[t], 1));
                    SimdAvx2::iflush(ia8, ds * a.xd[t * (cols / 128) + 2 * b + h], acc[t]);
                }
            }
        }
        for (int t = 0; t < NT; ++t) out[t] = SimdAvx2::hsum(acc[t]);
    }

    static void rows(const MatmulArgs& a, int64_t r0, int64_t r1, const Scratch& s) {
        if (a.ntok > kMaxTok) return Q::rows(a, r0, r1, s);
        float out[kMaxTok];
        for (int64_t r = r0; r < r1; ++r) {
            switch (a.ntok) {
                case 1: dot_row<1>(a, r, out); break;
                case 2: dot_row<2>(a, r, out); break;
                case 3: dot_row<3>(a, r, out); break;
                case 4: dot_row<4>(a, r, out); break;
                case 5: dot_row<5>(a, r, out); break;
                case 6: dot_row<6>(a, r, out); break;
                case 7: dot_row<7>(a, r, out); break;
                default: dot_row<8>(a, r, out); break;
            }
            for (int64_t t = 0; t < a.ntok; ++t) a.y[t * a.rows + r] = out[t];
        }
    }
};

}  // namespace

const KernelTable& kernels_avx512() {
    static const KernelTable table = [] {
        KernelTable t = make_kernel_table<SimdAvx512>();
        t.by_type[RG_TYPE_IQ2_XS] = &Iq2xsKernel::rows;
        return t;
    }();
    return table;
}

}  // namespace regolith::cpu
