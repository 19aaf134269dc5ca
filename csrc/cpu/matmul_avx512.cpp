// x86-64 kernels for AVX-512 machines (F, BW, VL, DQ, VNNI, VBMI, BITALG; compiled with those flags on top of
// AVX2's and used only when the CPU has them). The AVX2 kernels with their integer products done by VNNI:
// vpdpbusd sums four byte products into each int32 lane and vpdpwssd multiplies-and-adds pairs of int16 into
// int32, in one instruction where AVX2 takes two or three. The lanes hold the same integers as AVX2's (no sum
// here can saturate AVX2's int16 steps: |w| <= 128 with |x| <= 127, or |w| <= 64 with x + 128), and every
// float operation is AVX2's, so the results are AVX2's bit for bit (tests/test_matmul.py checks it).
#include <type_traits>

#include "cpu/simd_avx2.h"

namespace regolith::cpu {
namespace {

// 7-bit sign indices (one per byte) -> sign bytes: bit 7 is the parity of the other seven, as ggml's
// ksigns_iq2xs table holds. Each bit of the result is one code's sign.
inline __m256i parity_signs(__m256i s7) {
    const __m256i parity = _mm256_and_si256(_mm256_popcnt_epi8(s7), _mm256_set1_epi8(1));
    return _mm256_or_si256(s7, _mm256_slli_epi16(parity, 7));  // parity is 0 or 1: stays in its byte
}

// The lattice-codebook types, 64 codes per step. prep(b) reads a block's 32 sign bytes (and whatever else
// it needs) at once; grid(b, p, c) gives codes 64c .. 64c + 63 as unsigned grid bytes, whose signs are the
// bits of p.neg[c]; scales(b, ds) the int16 sub-scales (IntScales<TYPE>, in the low lanes) and the block's
// float factor.
struct GridPrep {
    uint64_t neg[4];
    uint64_t idx[4];  // IQ2_XXS: each step's eight grid indices
};

inline void store_signs(__m256i signs, GridPrep& p) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.neg), signs);
}

// Sub-scales 2s + 1 of 4-bit fields s, low nibble first (IntScales of IQ2_XS and IQ3_S): the bytes' 16
// nibbles as int16 in the low 256 bits.
inline __m512i odd_nibble_scales(__m128i bytes) {
    const __m128i nib = _mm_set1_epi8(0x0f);
    const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(bytes, nib), _mm_and_si128(_mm_srli_epi16(bytes, 4), nib));
    const __m256i w = _mm256_cvtepu8_epi16(s);
    return _mm512_castsi256_si512(_mm256_add_epi16(_mm256_add_epi16(w, w), _mm256_set1_epi16(1)));
}

struct Iq2xsGrid {
    using Block = block_iq2_xs;
    static constexpr uint32_t TYPE = RG_TYPE_IQ2_XS;
    // 32 16-bit entries: a 9-bit grid index and a 7-bit sign index
    static GridPrep prep(const Block& b) {
        GridPrep p;
        const __m512i v = _mm512_loadu_si512(b.qs);
        store_signs(parity_signs(_mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 9))), p);
        return p;
    }
    static __m512i grid(const Block& b, const GridPrep&, int c) {
        const __m512i v = _mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 8 * c)));
        return _mm512_i64gather_epi64(_mm512_and_si512(v, _mm512_set1_epi64(511)),
                                      reinterpret_cast<const long long*>(rg_iq2xs_grid), 8);
    }
    static __m512i scales(const Block& b, float& ds) {
        ds = half_scale(b.d) * 0.125f;
        return odd_nibble_scales(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)));
    }
};

struct Iq2xxsGrid {
    using Block = block_iq2_xxs;
    static constexpr uint32_t TYPE = RG_TYPE_IQ2_XXS;
    // eight 32-code groups of 8 bytes (a little-endian 64-bit word): four 8-bit grid indices in bits 0-31,
    // then four 7-bit sign indices from bit 32 and the 4-bit scale in bits 60-63
    static GridPrep prep(const Block& b) {
        GridPrep p;
        const __m512i v = _mm512_loadu_si512(b.qs);
        // per word: bytes 0-3 the sign fields (bits 32, 39, 46, 53 on), bytes 4-7 the grid indices
        const __m512i fields = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x18100800352e2720ll), v);
        // the words' first four bytes, then their last four, each in word order
        const __m512i order = _mm512_set_epi8(
            63, 62, 61, 60, 55, 54, 53, 52, 47, 46, 45, 44, 39, 38, 37, 36, 31, 30, 29, 28, 23, 22, 21, 20, 15, 14, 13, 12,
            7, 6, 5, 4, 59, 58, 57, 56, 51, 50, 49, 48, 43, 42, 41, 40, 35, 34, 33, 32, 27, 26, 25, 24, 19, 18, 17, 16, 11,
            10, 9, 8, 3, 2, 1, 0);
        const __m512i packed = _mm512_permutexvar_epi8(order, fields);
        store_signs(parity_signs(_mm256_and_si256(_mm512_castsi512_si256(packed), _mm256_set1_epi8(0x7f))), p);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.idx), _mm512_extracti64x4_epi64(packed, 1));
        return p;
    }
    static __m512i grid(const Block&, const GridPrep& p, int c) {
        const __m512i idx = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(int64_t(p.idx[c])));
        return _mm512_i64gather_epi64(idx, reinterpret_cast<const long long*>(rg_iq2xxs_grid), 8);
    }
    // each group's 4-bit scale is the top of its 64-bit word
    static __m512i scales(const Block& b, float& ds) {
        const __m512i groups = _mm512_srli_epi64(_mm512_loadu_si512(b.qs), 60);
        const __m128i w = _mm512_cvtepi64_epi16(groups);
        ds = half_scale(b.d) * 0.125f;
        return _mm512_castsi128_si512(_mm_add_epi16(_mm_add_epi16(w, w), _mm_set1_epi16(1)));
    }
};

struct Iq3sGrid {
    using Block = block_iq3_s;
    static constexpr uint32_t TYPE = RG_TYPE_IQ3_S;
    // one sign bit per code, in code order
    static GridPrep prep(const Block& b) {
        GridPrep p;
        store_signs(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.signs)), p);
        return p;
    }
    // sixteen 9-bit grid indices of 4 codes: 8 low bits in qs, the high bit in qh
    static __m512i grid(const Block& b, const GridPrep&, int c) {
        const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * c)));
        const __mmask16 high = _cvtu32_mask16(uint32_t(b.qh[2 * c]) | uint32_t(b.qh[2 * c + 1]) << 8);
        const __m512i idx = _mm512_mask_or_epi32(lo, high, lo, _mm512_set1_epi32(256));
        return _mm512_i32gather_epi32(idx, reinterpret_cast<const int*>(rg_iq3s_grid), 4);
    }
    static __m512i scales(const Block& b, float& ds) {
        uint32_t bytes;
        __builtin_memcpy(&bytes, b.scales, 4);
        ds = half_scale(b.d);
        return odd_nibble_scales(_mm_cvtsi32_si128(int32_t(bytes)));
    }
};

// The same codes as the register decoders of codes_avx2.h, for the prefill panels: each step's grid bytes
// with their signs applied.
template <class Grid>
struct GridCodes : Avx2Codes<Grid::TYPE> {
    static void codes(const typename Grid::Block& b, __m256i* q) {
        const GridPrep p = Grid::prep(b);
        for (int c = 0; c < 4; ++c) {
            const __m512i g = Grid::grid(b, p, c);
            const __m512i v = _mm512_mask_sub_epi8(g, _cvtu64_mask64(p.neg[c]), _mm512_setzero_si512(), g);
            q[2 * c] = _mm512_castsi512_si256(v);
            q[2 * c + 1] = _mm512_extracti64x4_epi64(v, 1);
        }
    }
};

// Q5_0 with the two-row decode products' form (matmul_impl.h's simd_has_codes2): two rows' blocks decoded in
// one zmm, row a's 32 codes in the low half. The high bits go straight into a mask register (qh bit j is
// code j's), so a block takes a third of the instructions of codes_avx2.h's, whose codes these are.
struct Q50Codes : Avx2Codes<RG_TYPE_Q5_0> {
    static __m512i codes2(const block_q5_0& a, const block_q5_0& b) {
        const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.qs));
        const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
        // quarters a.qs, a.qs, b.qs, b.qs; the second of each pair shifted right by 4: low nibbles are codes
        // 0-15 of a row, high nibbles 16-31
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(qa, qa)), _mm256_set_m128i(qb, qb), 1);
        const long long four = 0x0004000400040004ll;  // a shift of 4 in each 16-bit element
        const __m512i shift = _mm512_set_epi64(four, four, 0, 0, four, four, 0, 0);
        const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(v, shift), _mm512_set1_epi8(0x0f));
        const __mmask64 high = _cvtu64_mask64(uint64_t(load_u32(a.qh)) | uint64_t(load_u32(b.qh)) << 32);
        // a clear high bit makes the code nibble - 16: 0xF0 | nibble as int8
        return _mm512_mask_blend_epi8(high, _mm512_or_si512(nib, _mm512_set1_epi8(char(0xf0))), nib);
    }
};

template <uint32_t TYPE>
using Avx512Codes = std::conditional_t<
    TYPE == RG_TYPE_IQ2_XS, GridCodes<Iq2xsGrid>,
    std::conditional_t<
        TYPE == RG_TYPE_IQ2_XXS, GridCodes<Iq2xxsGrid>,
        std::conditional_t<TYPE == RG_TYPE_IQ3_S, GridCodes<Iq3sGrid>,
                           std::conditional_t<TYPE == RG_TYPE_Q5_0, Q50Codes, Avx2Codes<TYPE>>>>>;

struct EvexDpbusd {
    static __m256i dpbusd(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
};

struct SimdAvx512 : SimdAvx2Vnni<EvexDpbusd> {
    template <uint32_t TYPE>
    using Codes = Avx512Codes<TYPE>;
    // The prefill tile's two rows in one zmm: row a in the low 256 bits, row b in the high. The activations
    // come in the offset form (x + 128, unsigned) and the weights' codes as they are (signed) into vpdpbusd,
    // whose int32 sums start from minus the offset's share, -128 * (w . 1) per lane, made once per chunk for
    // every token: dot32x's int32 lanes without a sign fix-up per token. The scales (s * d) and the
    // multiply-add are dot32x's per lane.
    using Acc2 = __m512;
    struct W2 {
        __m512i w, base;
    };
    static Acc2 zero2() { return _mm512_setzero_ps(); }
    static Acc lo(Acc2 a) { return _mm512_castps512_ps256(a); }
    static Acc hi(Acc2 a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }
    static W2 make_w2(__m256i a, __m256i b) { return make_w2(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)); }
    static W2 make_w2(__m512i w) {
        const __m512i share = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), w);
        return {w, _mm512_sub_epi32(_mm512_setzero_si512(), share)};
    }
    static W2 load_w2(const int8_t* wa, const int8_t* wb) {
        return make_w2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wa)),
                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb)));
    }
    // lanes 0-3: sa_lo, 4-7: sa_hi, 8-11: sb_lo, 12-15: sb_hi
    static Acc2 scales2(float sa_lo, float sa_hi, float sb_lo, float sb_hi) {
        return _mm512_setr_ps(sa_lo, sa_lo, sa_lo, sa_lo, sa_hi, sa_hi, sa_hi, sa_hi, sb_lo, sb_lo, sb_lo, sb_lo, sb_hi,
                              sb_hi, sb_hi, sb_hi);
    }
    static void dot32x2(const W2& w, const uint8_t* xu, Acc2 ws, float d, Acc2& acc) {
        const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xu)));
        const __m512i s = _mm512_dpbusd_epi32(w.base, xv, w.w);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ws, _mm512_set1_ps(d)), acc);
    }
    // The integer-scale products of two rows, row a in the low 256 bits: SimdAvx2's vpmaddubsw / vpmaddwd
    // steps on both rows' codes at once, the signed codes' signs applied to the activations by a mask.
    using IAcc2 = __m512i;
    using IScale2 = __m512i;  // int16: 8 x sa_lo, 8 x sa_hi, 8 x sb_lo, 8 x sb_hi
    struct IW2 {
        __m512i w, abs;
        __mmask64 neg;
    };
    static IAcc2 izero2() { return _mm512_setzero_si512(); }
    static IW2 load_iw2(const int8_t* wa, const int8_t* wb) {
        return make_iw2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wa)),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb)));
    }
    static IScale2 iscale2(int16_t sa_lo, int16_t sa_hi, int16_t sb_lo, int16_t sb_hi) {
        const __m512i s = _mm512_set_epi64(sb_hi, sb_hi, sb_lo, sb_lo, sa_hi, sa_hi, sa_lo, sa_lo);
        // each 128-bit lane holds one value twice, in the low words of its two 64-bit halves: copy that word
        // to all eight
        return _mm512_shuffle_epi8(s, _mm512_set1_epi64(0x0100010001000100ll));
    }
    template <bool UNSIGNED>
    static void idot32x2(const IW2& w, const int8_t* x, const IScale2& s, IAcc2& acc) {
        const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
        const __m512i p = UNSIGNED ? _mm512_maddubs_epi16(w.w, xv)
                                   : _mm512_maddubs_epi16(w.abs, _mm512_mask_sub_epi8(xv, w.neg, _mm512_setzero_si512(), xv));
        acc = _mm512_dpwssd_epi32(acc, p, s);
    }
    static void idot32_offset2(const IW2& w, const uint8_t* xu, const IScale2& s, IAcc2& acc) {
        const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xu)));
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(xv, w.w), s);
    }
    static void ioffset2(const IW2& w, const IScale2& s, IAcc2& acc) {
        const __m512i p = _mm512_maddubs_epi16(_mm512_set1_epi8(char(0x80)), w.w);
        acc = _mm512_sub_epi32(acc, _mm512_madd_epi16(p, s));
    }
    // Decode's chunk pairs (matmul_impl.h's simd_has_chunk_pairs): one row's chunks k and k + 1 in the low and
    // high 256 bits, on 64 consecutive activations, summed as idot32x2's products are.
    static IW2 make_iw2(__m256i a, __m256i b) {
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        return {w, _mm512_abs_epi8(w), _mm512_movepi8_mask(w)};
    }
    template <bool UNSIGNED>
    static void idot64(const IW2& w, const int8_t* x, const IScale2& s, IAcc2& acc) {
        const __m512i xv = _mm512_loadu_si512(x);
        const __m512i p = UNSIGNED ? _mm512_maddubs_epi16(w.w, xv)
                                   : _mm512_maddubs_epi16(w.abs, _mm512_mask_sub_epi8(xv, w.neg, _mm512_setzero_si512(), xv));
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
    }
    static IAcc ifold(const IAcc2& ia) {
        return _mm256_add_epi32(_mm512_castsi512_si256(ia), _mm512_extracti64x4_epi64(ia, 1));
    }
    static void iflush2(const IAcc2& ia, float scale_a, float scale_b, Acc2& acc) {
        const __m512 sc = _mm512_insertf32x8(_mm512_set1_ps(scale_a), _mm256_set1_ps(scale_b), 1);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), sc, acc);
    }
};

// Rows [r0, r1) of a product of at most kMaxTok tokens, each by K::dot_row<ntok>(a, r, out).
template <class K>
void decode_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
    float out[kMaxTok];
    for (int64_t r = r0; r < r1; ++r) {
        switch (a.ntok) {
            case 1: K::template dot_row<1>(a, r, out); break;
            case 2: K::template dot_row<2>(a, r, out); break;
            case 3: K::template dot_row<3>(a, r, out); break;
            case 4: K::template dot_row<4>(a, r, out); break;
            case 5: K::template dot_row<5>(a, r, out); break;
            case 6: K::template dot_row<6>(a, r, out); break;
            case 7: K::template dot_row<7>(a, r, out); break;
            default: K::template dot_row<8>(a, r, out); break;
        }
        for (int64_t t = 0; t < a.ntok; ++t) a.y[t * a.rows + r] = out[t];
    }
}

// Codebook-type products of at most kMaxTok tokens (decode, speculative verification), 64 codes per step:
// the signs go onto the activations (a masked negation) rather than the weights, so the unsigned grid
// bytes meet them in one vpmaddubsw and one vpmaddwd with the sub-scales. Each int32 lane holds what
// SimdAvx2's does for the same four codes; a half block's two steps are added and folded to AVX2's eight
// lanes before the float step (AVX2's FusedKernel, to the bit). Prefill takes QuantKernel.
template <class Grid>
struct GridKernel {
    using Self = GridKernel;
    using Q = QuantKernel<SimdAvx512, BlockDecoder<Grid::TYPE>>;
    static constexpr int G = BlockDecoder<Grid::TYPE>::G;
    static_assert(BlockDecoder<Grid::TYPE>::QK == 256 && Q::AB == 128, "256-code blocks in 128-code halves");

    template <int NT>
    static void dot_row(const MatmulArgs& a, int64_t r, float* out) {
        const int64_t cols = a.cols, nb = cols / 256;
        const auto* blocks = reinterpret_cast<const typename Grid::Block*>(a.w + r * a.row_bytes);
        // int16 lane i of step c covers codes 64c + 2i, 64c + 2i + 1: scale group (64c + 2i) / G
        const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                                              13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        const __m512i group = _mm512_srli_epi16(lane, G == 16 ? 3 : 4);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_weights(blocks + b);
            float ds;
            const __m512i sc = Grid::scales(blocks[b], ds);
            const GridPrep p = Grid::prep(blocks[b]);
            for (int h = 0; h < 2; ++h) {
                __m512i ia[NT];
                for (int t = 0; t < NT; ++t) ia[t] = _mm512_setzero_si512();
                for (int c = 2 * h; c < 2 * h + 2; ++c) {
                    const __m512i g = Grid::grid(blocks[b], p, c);
                    const __mmask64 neg = _cvtu64_mask64(p.neg[c]);
                    const __m512i first = _mm512_set1_epi16(int16_t(64 * c / G));
                    const __m512i scale = _mm512_permutexvar_epi16(_mm512_add_epi16(group, first), sc);
                    for (int t = 0; t < NT; ++t) {
                        const __m512i x = _mm512_loadu_si512(a.xq + t * cols + b * 256 + 64 * c);
                        const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                        ia[t] = _mm512_add_epi32(ia[t], _mm512_madd_epi16(_mm512_maddubs_epi16(g, xs), scale));
                    }
                }
                for (int t = 0; t < NT; ++t) {
                    SimdAvx2::iflush(SimdAvx512::ifold(ia[t]), ds * a.xd[t * (cols / 128) + 2 * b + h], acc[t]);
                }
            }
        }
        for (int t = 0; t < NT; ++t) out[t] = SimdAvx2::hsum(acc[t]);
    }

    static void rows(const MatmulArgs& a, int64_t r0, int64_t r1, const Scratch& s) {
        if (a.ntok > kMaxTok) return Q::rows(a, r0, r1, s);
        decode_rows<Self>(a, r0, r1);
    }
};

// Q2_0 products of at most kMaxTok tokens, a whole 64-code block per step: vpmultishiftqb picks every
// code's 2 bits out of the block's 16 bytes. The codes c - 1 enter vpdpbusd as magnitudes with their signs
// on the activations; the two 32-code halves' lanes then take dot32x's float steps, in order.
struct Q20Kernel {
    using Self = Q20Kernel;
    using Q = QuantKernel<SimdAvx512, BlockDecoder<RG_TYPE_Q2_0>>;
    static_assert(BlockDecoder<RG_TYPE_Q2_0>::QK == 64 && Q::AB == 32, "64-code blocks, 32-code activation blocks");

    // code e (0..3) sits at bits 2e of the 16 bytes: byte j of 64-bit lane L is code 8L + j, bits
    // 16 (L % 4) + 2j of the block's 64-bit word L / 4
    static __m512i codes(const block_q2_0& b) {
        const __m512i words = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 0, 0, 0, 1, 1, 1, 1),
                                                       _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs))));
        const __m512i at = _mm512_setr_epi64(0x0e0c0a0806040200ll, 0x1e1c1a1816141210ll, 0x2e2c2a2826242220ll,
                                             0x3e3c3a3836343230ll, 0x0e0c0a0806040200ll, 0x1e1c1a1816141210ll,
                                             0x2e2c2a2826242220ll, 0x3e3c3a3836343230ll);
        return _mm512_and_si512(_mm512_multishift_epi64_epi8(at, words), _mm512_set1_epi8(3));
    }

    template <int NT>
    static void dot_row(const MatmulArgs& a, int64_t r, float* out) {
        const int64_t cols = a.cols, nb = cols / 64;
        const auto* blocks = reinterpret_cast<const block_q2_0*>(a.w + r * a.row_bytes);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_weights(blocks + b);
            const float ds = half_scale(blocks[b].d);
            const __m512i c = codes(blocks[b]);
            const __m512i mag = _mm512_abs_epi8(_mm512_sub_epi8(c, _mm512_set1_epi8(1)));
            const __mmask64 neg = _mm512_testn_epi8_mask(c, c);  // c == 0: the value -1
            for (int t = 0; t < NT; ++t) {
                const __m512i x = _mm512_loadu_si512(a.xq + t * cols + 64 * b);
                const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), mag,
                                                      _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x));
                const __m512 f = _mm512_cvtepi32_ps(s);
                const float* xd = a.xd + t * (cols / 32) + 2 * b;
                acc[t] = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm256_set1_ps(ds * xd[0]), acc[t]);
                acc[t] = _mm256_fmadd_ps(SimdAvx512::hi(f), _mm256_set1_ps(ds * xd[1]), acc[t]);
            }
        }
        for (int t = 0; t < NT; ++t) out[t] = SimdAvx2::hsum(acc[t]);
    }

    static void rows(const MatmulArgs& a, int64_t r0, int64_t r1, const Scratch& s) {
        if (a.ntok > kMaxTok) return Q::rows(a, r0, r1, s);
        decode_rows<Self>(a, r0, r1);
    }
};

}  // namespace

const KernelTable& kernels_avx512() {
    static const KernelTable table = [] {
        KernelTable t = make_kernel_table<SimdAvx512>();
        t.by_type[RG_TYPE_IQ2_XS] = &GridKernel<Iq2xsGrid>::rows;
        t.by_type[RG_TYPE_IQ2_XXS] = &GridKernel<Iq2xxsGrid>::rows;
        t.by_type[RG_TYPE_IQ3_S] = &GridKernel<Iq3sGrid>::rows;
        t.by_type[RG_TYPE_Q2_0] = &Q20Kernel::rows;
        return t;
    }();
    return table;
}

}  // namespace regolith::cpu
