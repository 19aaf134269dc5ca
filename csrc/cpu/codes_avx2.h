// AVX2 block decoding straight into registers for the hottest weight types, used by the fused decode
// kernel (ntok <= 8) in matmul_impl.h. Each Avx2Codes<TYPE> yields exactly the int8 codes of
// BlockDecoder<TYPE> (the tests compare the two paths) and the block's scales:
//
//   static void codes(const Block& b, __m256i* q);                 // QK / 32 vectors of 32 codes
//   static float scales(const Block& b, int16_t* isc, float* bias);
//       INT types (IntScales): fills isc[NG] (and bias[NG] for affine types), returns dsuper;
//       others (one scale per block): returns that scale (and fills bias[0] for affine types).
//
// Only included by matmul_avx2.cpp (compiled with -mavx2).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/block_decode.h"
#include "core/block_int_scales.h"

namespace regolith::cpu {
namespace {

template <uint32_t TYPE>
struct Avx2Codes;

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
// An f16 block scale in one F16C instruction (the same value as fp16_to_fp32 for every finite input).
inline float half_scale(uint16_t h) { return _cvtsh_ss(h); }
using decode_detail::load_u16;
using decode_detail::load_u32;
using decode_detail::load_u64;

// Four 8-code grid rows and their sign masks (0xFF bytes negate) -> 32 signed codes.
inline __m256i signed_grid(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint64_t m0, uint64_t m1,
                           uint64_t m2, uint64_t m3) {
    const __m256i g = _mm256_setr_epi64x(int64_t(g0), int64_t(g1), int64_t(g2), int64_t(g3));
    const __m256i m = _mm256_setr_epi64x(int64_t(m0), int64_t(m1), int64_t(m2), int64_t(m3));
    // sign_epi8(g, -1) = -g, sign_epi8(g, 1) = g
    return _mm256_sign_epi8(g, _mm256_or_si256(m, _mm256_set1_epi8(1)));
}

// 16 bytes of packed nibbles -> 32 nibbles: low nibbles first, then high nibbles (the legacy blocks' order).
inline __m256i nibbles16(const uint8_t* qs) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}

// 16 bytes of packed nibbles -> 32 table values, in nibbles16's order.
inline __m256i nibble_lookup16(const uint8_t* qs, __m256i table) {
    return _mm256_shuffle_epi8(table, nibbles16(qs));
}

// Q5_0 / Q5_1: the 32 high bits qh (little-endian) -> 0xFF in byte j where bit j is set.
inline __m256i high_bits32(const uint8_t* qh) {
    // byte j <- qh byte j / 8 (each 128-bit lane holds all four), then test its bit j % 8
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(load_u32(qh))), spread);
    const __m256i mask = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    return _mm256_cmpeq_epi8(_mm256_and_si256(bits, mask), mask);
}

// Bit `from` of each byte of v moved to bit `to` of that byte by one 16-bit shift: with from, to < 8, bit
// `to` of either byte of a lane comes from bit `from` of the same byte. Mask off the other bits (junk).
inline __m256i move_bit(__m256i v, int from, int to) {
    return from < to ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to);
}

inline __m256i iq4nl_table() {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rg_kvalues_iq4nl)));
}

template <>
struct Avx2Codes<RG_TYPE_Q8_0> {
    static void codes(const block_q8_0& b, __m256i* q) { q[0] = load256(b.qs); }
    static float scales(const block_q8_0& b, int16_t*, float*) { return half_scale(b.d); }
};

// Q4_0: nibble - 8.
template <>
struct Avx2Codes<RG_TYPE_Q4_0> {
    static void codes(const block_q4_0& b, __m256i* q) {
        q[0] = _mm256_sub_epi8(nibbles16(b.qs), _mm256_set1_epi8(8));
    }
    static float scales(const block_q4_0& b, int16_t*, float*) { return half_scale(b.d); }
};

// Q4_1: the nibbles themselves; the block's min m is its bias.
template <>
struct Avx2Codes<RG_TYPE_Q4_1> {
    static void codes(const block_q4_1& b, __m256i* q) { q[0] = nibbles16(b.qs); }
    static float scales(const block_q4_1& b, int16_t*, float* bias) {
        bias[0] = half_scale(b.m);
        return half_scale(b.d);
    }
};

// Q5_0: code j = (nibble j | high bit j << 4) - 16. Over a clear high bit, 0xF0 | nibble is nibble - 16 as
// int8; a set high bit leaves the nibble itself (16 + nibble - 16).
template <>
struct Avx2Codes<RG_TYPE_Q5_0> {
    static void codes(const block_q5_0& b, __m256i* q) {
        q[0] = _mm256_or_si256(nibbles16(b.qs),
                               _mm256_andnot_si256(high_bits32(b.qh), _mm256_set1_epi8(char(0xf0))));
    }
    static float scales(const block_q5_0& b, int16_t*, float*) { return half_scale(b.d); }
};

// Q5_1: nibble j | high bit j << 4 (0 .. 31); the block's min m is its bias.
template <>
struct Avx2Codes<RG_TYPE_Q5_1> {
    static void codes(const block_q5_1& b, __m256i* q) {
        q[0] = _mm256_or_si256(nibbles16(b.qs), _mm256_and_si256(high_bits32(b.qh), _mm256_set1_epi8(0x10)));
    }
    static float scales(const block_q5_1& b, int16_t*, float* bias) {
        bias[0] = half_scale(b.m);
        return half_scale(b.d);
    }
};

template <>
struct Avx2Codes<RG_TYPE_IQ4_NL> {
    static void codes(const block_iq4_nl& b, __m256i* q) { q[0] = nibble_lookup16(b.qs, iq4nl_table()); }
    static float scales(const block_iq4_nl& b, int16_t*, float*) { return half_scale(b.d); }
};

// MXFP4: the doubled E2M1 values by nibble, as IQ4_NL's codebook; the block's scale a power of two from its
// E8M0 exponent (BlockDecoder's e8m0_half).
template <>
struct Avx2Codes<RG_TYPE_MXFP4> {
    static void codes(const block_mxfp4& b, __m256i* q) {
        q[0] = nibble_lookup16(
            b.qs, _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rg_kvalues_e2m1))));
    }
    static float scales(const block_mxfp4& b, int16_t*, float*) { return decode_detail::e8m0_half(b.e); }
};

template <>
struct Avx2Codes<RG_TYPE_IQ4_XS> {
    static void codes(const block_iq4_xs& b, __m256i* q) {
        const __m256i table = iq4nl_table();
        for (int ib = 0; ib < 8; ++ib) q[ib] = nibble_lookup16(b.qs + 16 * ib, table);
    }
    static float scales(const block_iq4_xs& b, int16_t* isc, float*) { return IntScales<RG_TYPE_IQ4_XS>::get(b, isc); }
};

// Q4_K / Q5_K: k_int_scales and the biases -(dmin * m) of k_scales_biases: the 6-bit scales and minima of
// k_scale_min unpacked four at a time in 32-bit words (s = scales[0..11] as words u0, u1, u2):
// sc[0..3] = u0 & 63, m[0..3] = u1 & 63, sc[4..7] = low nibbles of u2 | top 2 bits of u0 << 4,
// m[4..7] = high nibbles of u2 | top 2 bits of u1 << 4.
template <class B>
inline float k_scales(const B& b, int16_t* isc, float* bias) {
    const uint32_t u0 = load_u32(b.scales), u1 = load_u32(b.scales + 4), u2 = load_u32(b.scales + 8);
    const uint32_t low6 = 0x3f3f3f3fu, nib = 0x0f0f0f0fu, top2 = 0x03030303u;
    const uint64_t sc = (u0 & low6) | uint64_t((u2 & nib) | (((u0 >> 6) & top2) << 4)) << 32;
    const uint64_t m = (u1 & low6) | uint64_t(((u2 >> 4) & nib) | (((u1 >> 6) & top2) << 4)) << 32;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(isc), _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc))));
    const __m256 mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(m))));
    const __m256 prod = _mm256_mul_ps(_mm256_set1_ps(half_scale(b.dmin)), mf);
    _mm256_storeu_ps(bias, _mm256_xor_ps(prod, _mm256_set1_ps(-0.0f)));
    return half_scale(b.d);
}

template <>
struct Avx2Codes<RG_TYPE_Q4_K> {
    static void codes(const block_q4_K& b, __m256i* q) {
        const __m256i lo = _mm256_set1_epi8(0x0f);
        for (int k = 0; k < 4; ++k) {
            const __m256i v = load256(b.qs + 32 * k);
            q[2 * k] = _mm256_and_si256(v, lo);
            q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo);
        }
    }
    static float scales(const block_q4_K& b, int16_t* isc, float* bias) { return k_scales(b, isc, bias); }
};

// Q5_K: Q4_K's nibbles with a 5th bit: code 32i + l takes bit i of qh[l] as its bit 4.
template <>
struct Avx2Codes<RG_TYPE_Q5_K> {
    static void codes(const block_q5_K& b, __m256i* q) {
        const __m256i lo = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10), hv = load256(b.qh);
        for (int k = 0; k < 4; ++k) {
            const __m256i v = load256(b.qs + 32 * k);
            q[2 * k] =
                _mm256_or_si256(_mm256_and_si256(v, lo), _mm256_and_si256(move_bit(hv, 2 * k, 4), bit4));
            q[2 * k + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo),
                                           _mm256_and_si256(move_bit(hv, 2 * k + 1, 4), bit4));
        }
    }
    static float scales(const block_q5_K& b, int16_t* isc, float* bias) { return k_scales(b, isc, bias); }
};

// Q2_K: code 128h + 32k + l = bits 2k of qs[32h + l] (0 .. 3). Per 16 codes, scales[g]: the low nibble is
// the integer sub-scale, the high nibble m the bias -(dmin * m) (IntScales<Q2_K>, BlockDecoder<Q2_K>).
template <>
struct Avx2Codes<RG_TYPE_Q2_K> {
    static void codes(const block_q2_K& b, __m256i* q) {
        const __m256i three = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; ++h) {
            const __m256i v = load256(b.qs + 32 * h);
            for (int k = 0; k < 4; ++k) q[4 * h + k] = _mm256_and_si256(_mm256_srli_epi16(v, 2 * k), three);
        }
    }
    static float scales(const block_q2_K& b, int16_t* isc, float* bias) {
        const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
        const __m128i nib = _mm_set1_epi8(0x0f);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(isc), _mm256_cvtepu8_epi16(_mm_and_si128(s, nib)));
        const __m128i m = _mm_and_si128(_mm_srli_epi16(s, 4), nib);
        const __m256 dmin = _mm256_set1_ps(half_scale(b.dmin)), neg = _mm256_set1_ps(-0.0f);
        for (int i = 0; i < 2; ++i) {
            const __m256 mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(i ? _mm_srli_si128(m, 8) : m));
            _mm256_storeu_ps(bias + 8 * i, _mm256_xor_ps(_mm256_mul_ps(dmin, mf), neg));
        }
        return half_scale(b.d);
    }
};

// Q3_K: code 32i + l (i = 4h + k) = (bits 2k of qs[32h + l] | bit i of hmask[l] << 2) - 4.
template <>
struct Avx2Codes<RG_TYPE_Q3_K> {
    static void codes(const block_q3_K& b, __m256i* q) {
        const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4), hm = load256(b.hmask);
        for (int h = 0; h < 2; ++h) {
            const __m256i v = load256(b.qs + 32 * h);
            for (int k = 0; k < 4; ++k) {
                const int i = 4 * h + k;
                const __m256i low = _mm256_and_si256(_mm256_srli_epi16(v, 2 * k), three);
                const __m256i high = _mm256_and_si256(move_bit(hm, i, 2), four);
                q[i] = _mm256_sub_epi8(_mm256_or_si256(low, high), four);
            }
        }
    }
    // IntScales<Q3_K>'s 6-bit scales - 32, unpacked four at a time in 32-bit words (scales[0..11] as u0, u1,
    // u2): scale s takes its low 4 bits from nibble s / 8 of byte s % 8 (u0, u1) and its high 2 bits from
    // bits 2 (s / 4) of byte 8 + s % 4 (u2).
    static float scales(const block_q3_K& b, int16_t* isc, float*) {
        const uint32_t u0 = load_u32(b.scales), u1 = load_u32(b.scales + 4), u2 = load_u32(b.scales + 8);
        const uint32_t nib = 0x0f0f0f0fu, top2 = 0x03030303u;
        const uint32_t s0 = (u0 & nib) | ((u2 & top2) << 4), s1 = (u1 & nib) | (((u2 >> 2) & top2) << 4);
        const uint32_t s2 = ((u0 >> 4) & nib) | (((u2 >> 4) & top2) << 4);
        const uint32_t s3 = ((u1 >> 4) & nib) | (((u2 >> 6) & top2) << 4);
        const __m128i s = _mm_setr_epi32(int32_t(s0), int32_t(s1), int32_t(s2), int32_t(s3));
        const __m256i v = _mm256_sub_epi16(_mm256_cvtepu8_epi16(s), _mm256_set1_epi16(32));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(isc), v);
        return half_scale(b.d);
    }
};

template <>
struct Avx2Codes<RG_TYPE_Q6_K> {
    static void codes(const block_q6_K& b, __m256i* q) {
        const __m256i lo = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
        for (int h = 0; h < 2; ++h) {
            const __m256i l0 = load256(b.ql + 64 * h), l1 = load256(b.ql + 64 * h + 32);
            const __m256i hv = load256(b.qh + 32 * h);
            for (int k = 0; k < 4; ++k) {
                const __m256i l = (k & 1) ? l1 : l0;
                const __m256i nib = _mm256_and_si256(k >> 1 ? _mm256_srli_epi16(l, 4) : l, lo);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * k), two);
                q[4 * h + k] = _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_slli_epi16(hi, 4)), off);
            }
        }
    }
    static float scales(const block_q6_K& b, int16_t* isc, float*) {
        for (int g = 0; g < 16; ++g) isc[g] = b.scales[g];  // IntScales<Q6_K>
        return half_scale(b.d);
    }
};

template <>
struct Avx2Codes<RG_TYPE_IQ2_XXS> {
    static void codes(const block_iq2_xxs& b, __m256i* q) {
        const uint8_t* qs = reinterpret_cast<const uint8_t*>(b.qs);
        for (int ib = 0; ib < 8; ++ib) {
            const uint8_t* p = qs + 8 * ib;
            const uint32_t a = load_u32(p + 4);
            q[ib] = signed_grid(rg_iq2xxs_grid[p[0]], rg_iq2xxs_grid[p[1]], rg_iq2xxs_grid[p[2]], rg_iq2xxs_grid[p[3]],
                                rg_ksigns_mask[a & 127], rg_ksigns_mask[(a >> 7) & 127],
                                rg_ksigns_mask[(a >> 14) & 127], rg_ksigns_mask[(a >> 21) & 127]);
        }
    }
    static float scales(const block_iq2_xxs& b, int16_t* isc, float*) {
        return IntScales<RG_TYPE_IQ2_XXS>::get(b, isc);
    }
};

template <>
struct Avx2Codes<RG_TYPE_IQ2_XS> {
    static void codes(const block_iq2_xs& b, __m256i* q) {
        const uint8_t* qs = reinterpret_cast<const uint8_t*>(b.qs);
        for (int ib = 0; ib < 8; ++ib) {
            uint16_t v[4];
            for (int j = 0; j < 4; ++j) v[j] = load_u16(qs + 8 * ib + 2 * j);
            q[ib] = signed_grid(rg_iq2xs_grid[v[0] & 511], rg_iq2xs_grid[v[1] & 511], rg_iq2xs_grid[v[2] & 511],
                                rg_iq2xs_grid[v[3] & 511], rg_ksigns_mask[v[0] >> 9], rg_ksigns_mask[v[1] >> 9],
                                rg_ksigns_mask[v[2] >> 9], rg_ksigns_mask[v[3] >> 9]);
        }
    }
    static float scales(const block_iq2_xs& b, int16_t* isc, float*) { return IntScales<RG_TYPE_IQ2_XS>::get(b, isc); }
};

template <>
struct Avx2Codes<RG_TYPE_IQ3_S> {
    static uint64_t grid_pair(const block_iq3_s& b, int t) {
        const uint8_t h = b.qh[t >> 2];
        const int i0 = 2 * t, i1 = 2 * t + 1;
        const int idx0 = b.qs[i0] | (((h >> (i0 & 7)) & 1) << 8);
        const int idx1 = b.qs[i1] | (((h >> (i1 & 7)) & 1) << 8);
        return rg_iq3s_grid[idx0] | (uint64_t(rg_iq3s_grid[idx1]) << 32);
    }
    static void codes(const block_iq3_s& b, __m256i* q) {
        for (int ib = 0; ib < 8; ++ib) {
            const int t = 4 * ib;
            q[ib] = signed_grid(grid_pair(b, t), grid_pair(b, t + 1), grid_pair(b, t + 2), grid_pair(b, t + 3),
                                rg_byte_mask[b.signs[t]], rg_byte_mask[b.signs[t + 1]], rg_byte_mask[b.signs[t + 2]],
                                rg_byte_mask[b.signs[t + 3]]);
        }
    }
    static float scales(const block_iq3_s& b, int16_t* isc, float*) { return IntScales<RG_TYPE_IQ3_S>::get(b, isc); }
};

// IQ1_M: codes 8 * grid + delta (grid bytes -1/0/1, delta +-1 per 8 codes), as BlockDecoder<IQ1_M>.
template <>
struct Avx2Codes<RG_TYPE_IQ1_M> {
    // +1 per byte, or -1 (0xFF) when the group's delta bit (nibble bit 3) is set; branch-free
    static int64_t delta(int nib) {
        return int64_t(0x0101010101010101ull ^ ((0 - uint64_t((nib >> 3) & 1)) & 0xfefefefefefefefeull));
    }
    static void codes(const block_iq1_m& b, __m256i* q) {
        const __m256i eight = _mm256_set1_epi8(8);
        for (int ib = 0; ib < 8; ++ib) {
            int64_t g[4], d[4];
            for (int j = 0; j < 4; ++j) {
                const int t = 4 * ib + j;
                const int nib = (b.qh[t >> 1] >> (4 * (t & 1))) & 0x0f;
                g[j] = int64_t(rg_iq1s_grid[b.qs[t] | ((nib & 7) << 8)]);
                d[j] = delta(nib);
            }
            const __m256i gv = _mm256_setr_epi64x(g[0], g[1], g[2], g[3]);
            q[ib] = _mm256_add_epi8(_mm256_sign_epi8(eight, gv), _mm256_setr_epi64x(d[0], d[1], d[2], d[3]));
        }
    }
    static float scales(const block_iq1_m& b, int16_t* isc, float*) { return IntScales<RG_TYPE_IQ1_M>::get(b, isc); }
};

// Q2_0: code j of a 32-code chunk is bits 2*(j%4) of byte j/4; value c - 1. Each byte is replicated 4
// times, masked to its 2-bit field, and the field (in the low or the high nibble) mapped back to 0..3 by a
// 16-entry lookup: 1,2,3 and 4,8,12 are disjoint, so one table serves every shift.
template <>
struct Avx2Codes<RG_TYPE_Q2_0> {
    static void codes(const block_q2_0& b, __m256i* q) {
        const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,  //
                                                4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
        const __m256i field = _mm256_set1_epi32(int32_t(0xc0300c03u));
        const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0,  //
                                               0, 1, 2, 3, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0);
        const __m256i nib = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
        for (int k = 0; k < 2; ++k) {
            const __m256i bytes = _mm256_set1_epi64x(int64_t(load_u64(b.qs + 8 * k)));
            const __m256i m = _mm256_and_si256(_mm256_shuffle_epi8(bytes, spread), field);
            const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(m, nib));
            const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(m, 4), nib));
            q[k] = _mm256_sub_epi8(_mm256_or_si256(lo, hi), one);
        }
    }
    static float scales(const block_q2_0& b, int16_t*, float*) { return half_scale(b.d); }
};

}  // namespace
}  // namespace regolith::cpu
