// Per-type block decoders: the single definition of what each quantized block means.
//
// Every quantized type decodes one block into small integer codes and per-group affine parameters:
//
//     x[i] = scale[i / G] * q[i]  (+ bias[i / G]  when HAS_BIAS)
//
// evaluated in float32 as one multiply then one add (compile users with -ffp-contract=off where
// bit-exactness matters). `scale` and `bias` are computed with the same float32 operations, in the same
// order, as the gguf package's numpy dequantizers, so dequantization built on this is bit-exact (the
// per-type comments say why where the mapping is not literal). Only NaN outputs (from inf/NaN scale
// fields) may differ in NaN sign/payload, e.g. Q4_K's bias = -(dmin * m) where gguf subtracts dmin * m. The integer dot-product kernels use the
// same decode: sum_i x[i] a[i] = sum_g scale_g * (q . a)_g + bias_g * sum(a)_g. q always fits int8.
//
// A decoder is a struct BlockDecoder<TYPE> with:
//     using Block = block_xxx;           // the layout from core/quant.h
//     static constexpr uint32_t TYPE;   // the GGUF type id
//     static constexpr int QK;           // elements per block
//     static constexpr int G;            // elements per scale group: 16 or 32 (QK % 32 == 0, so a group
//                                        // never straddles a 32-element boundary)
//     static constexpr int NG = QK / G;  // scale groups per block
//     static constexpr bool HAS_BIAS;
//     static void decode(const Block& b, int8_t* q /*[QK]*/, float* scale /*[NG]*/, float* bias /*[NG]*/);
// (bias is untouched when !HAS_BIAS and may be nullptr). decode never allocates and never throws.
// Types of more than 32 elements whose 32-element parts decode on their own may also have
//     static void decode_part(const Block& b, int c, int8_t* q /*[32]*/, float* scale /*[32 / G]*/, float* bias);
// elements [32c, 32c + 32) with the q, scale and bias decode gives them (the same float operations), so GPU
// kernels can give a block's parts to separate lanes. has_decode_part<D> says whether D has it.
//
// dispatch_quant_type(type, f) (at the end of this file) maps a run-time type id to f(BlockDecoder<T>{}).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/errors.h"
#include "core/half.h"
#include "core/isa_namespace.h"
#include "core/quant.h"
#include "core/quant_tables.h"

#if defined(__SSSE3__)
#include <tmmintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "block decoders assume a little-endian host (GGUF data is little-endian)"
#endif

// Compiled into both portable and ISA-specific files: see core/isa_namespace.h.
namespace regolith {
inline namespace RG_ISA_NS {

template <uint32_t TYPE>
struct BlockDecoder;

// Common members of a decoder for block type B.
template <uint32_t TYPE_, class B, int QK_, int G_, bool HAS_BIAS_>
struct DecoderTraits {
    using Block = B;
    static constexpr uint32_t TYPE = TYPE_;
    static constexpr int QK = QK_, G = G_, NG = QK_ / G_;
    static constexpr bool HAS_BIAS = HAS_BIAS_;
    static_assert((G == 16 || G == 32) && QK % 32 == 0, "groups of 16 or 32 inside 32-element chunks");
};

template <class D, class = void>
struct has_decode_part : std::false_type {};
template <class D>
struct has_decode_part<D, std::void_t<decltype(&D::decode_part)>> : std::true_type {};

// ---- helpers: unaligned little-endian loads and 8-bytes-at-a-time (SWAR) code arithmetic ------------
namespace decode_detail {

RG_HD inline uint16_t load_u16(const void* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
RG_HD inline uint32_t load_u32(const void* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
RG_HD inline uint64_t load_u64(const void* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
RG_HD inline void store_u64(int8_t* q, uint64_t v) { std::memcpy(q, &v, 8); }

constexpr uint64_t kOnes = 0x0101010101010101ull;
constexpr uint64_t kLowNibbles = 0x0f0f0f0f0f0f0f0full;
constexpr uint64_t bytes_of(uint8_t b) { return kOnes * b; }

// Per byte x - k as int8, for bytes with x + 0x80 - k < 0x100 (so the add never carries out of a byte).
RG_HD inline uint64_t sub_bytes(uint64_t x, uint8_t k) {
    return (x + bytes_of(uint8_t(0x80 - k))) ^ bytes_of(0x80);
}

// Negate the bytes of g where m has 0xFF (two's complement: ~g + 1). Exact per byte provided every byte
// of g is >= 1: then ~g <= 0xFE and the +1 never carries into the next byte.
RG_HD inline uint64_t apply_signs(uint64_t g, uint64_t m) { return (g ^ m) + (m & kOnes); }

// Per-byte add without carries between bytes.
RG_HD inline uint64_t add_bytes(uint64_t a, uint64_t b) {
    constexpr uint64_t hi = bytes_of(0x80), lo = bytes_of(0x7f);
    return ((a & lo) + (b & lo)) ^ ((a ^ b) & hi);
}

RG_HD inline float bits_to_f32(uint32_t u) { return f32_from_bits(u); }

// 32 packed nibbles (16 bytes) -> q[0..15] = low nibbles, q[16..31] = high nibbles, minus k.
RG_HD inline void unpack_nibbles16(const uint8_t* qs, int8_t* q, uint8_t k) {
    for (int c = 0; c < 2; ++c) {
        const uint64_t v = load_u64(qs + 8 * c);
        const uint64_t lo = v & kLowNibbles, hi = (v >> 4) & kLowNibbles;
        store_u64(q + 8 * c, k ? sub_bytes(lo, k) : lo);
        store_u64(q + 16 + 8 * c, k ? sub_bytes(hi, k) : hi);
    }
}

// 32 bits of qh -> per element a byte with `bit` set where the element's bit is set.
RG_HD inline void or_high_bits32(uint32_t qh, int8_t* q, uint8_t bit) {
    for (int c = 0; c < 4; ++c) {
        uint64_t v = load_u64(q + 8 * c);
        v |= rg_byte_mask[(qh >> (8 * c)) & 0xff] & bytes_of(bit);
        store_u64(q + 8 * c, v);
    }
}

// Nibble indices into a 16-entry int8 table, laid out as IQ4_NL / IQ4_XS / MXFP4 / NVFP4 do:
// from N bytes, element l = table[qs[l] & 15] and element N + l = table[qs[l] >> 4]. N = 16 or 8.
template <int N>
RG_HD inline void lookup_nibbles(const uint8_t* qs, const int8_t* table, int8_t* q) {
    static_assert(N == 16 || N == 8, "16 or 8 bytes");
#if defined(__SSSE3__)
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(table));
    const __m128i m = _mm_set1_epi8(0x0f);
    if constexpr (N == 16) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_shuffle_epi8(t, _mm_and_si128(v, m)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                         _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(v, 4), m)));
    } else {
        const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs));
        const __m128i idx = _mm_and_si128(_mm_unpacklo_epi64(v, _mm_srli_epi16(v, 4)), m);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_shuffle_epi8(t, idx));
    }
#elif defined(__ARM_NEON)
    const int8x16_t t = vld1q_s8(table);
    if constexpr (N == 16) {
        const uint8x16_t v = vld1q_u8(qs);
        vst1q_s8(q, vqtbl1q_s8(t, vandq_u8(v, vdupq_n_u8(0x0f))));
        vst1q_s8(q + 16, vqtbl1q_s8(t, vshrq_n_u8(v, 4)));
    } else {
        const uint8x8_t v = vld1_u8(qs);
        vst1q_s8(q, vqtbl1q_s8(t, vcombine_u8(vand_u8(v, vdup_n_u8(0x0f)), vshr_n_u8(v, 4))));
    }
#else
    for (int l = 0; l < N; ++l) {
        q[l] = table[qs[l] & 0x0f];
        q[l + N] = table[qs[l] >> 4];
    }
#endif
}

// MXFP4 block scale: E8M0 exponent e -> 2^(e - 127) / 2 (the kvalues are doubled), as gguf's
// e8m0_to_fp32_half: subnormal bit patterns for e < 2, never inf or NaN.
RG_HD inline float e8m0_half(uint8_t e) {
    return bits_to_f32(e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23));
}

}  // namespace decode_detail

// ---- legacy 32-element blocks ------------------------------------------------------------------------
// gguf: d * (nibble - 8)
template <>
struct BlockDecoder<RG_TYPE_Q4_0> : DecoderTraits<RG_TYPE_Q4_0, block_q4_0, QK4_0, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        scale[0] = fp16_to_fp32(b.d);
        decode_detail::unpack_nibbles16(b.qs, q, 8);
    }
};

// gguf: (d * nibble) + m
template <>
struct BlockDecoder<RG_TYPE_Q4_1> : DecoderTraits<RG_TYPE_Q4_1, block_q4_1, QK4_1, 32, true> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float* bias) {
        scale[0] = fp16_to_fp32(b.d);
        bias[0] = fp16_to_fp32(b.m);
        decode_detail::unpack_nibbles16(b.qs, q, 0);
    }
};

// gguf: d * ((nibble | bit4) - 16)
template <>
struct BlockDecoder<RG_TYPE_Q5_0> : DecoderTraits<RG_TYPE_Q5_0, block_q5_0, QK5_0, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        scale[0] = fp16_to_fp32(b.d);
        unpack_nibbles16(b.qs, q, 0);
        or_high_bits32(load_u32(b.qh), q, 0x10);
        for (int c = 0; c < 4; ++c) store_u64(q + 8 * c, sub_bytes(load_u64(q + 8 * c), 16));
    }
};

// gguf: (d * (nibble | bit4)) + m
template <>
struct BlockDecoder<RG_TYPE_Q5_1> : DecoderTraits<RG_TYPE_Q5_1, block_q5_1, QK5_1, 32, true> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float* bias) {
        using namespace decode_detail;
        scale[0] = fp16_to_fp32(b.d);
        bias[0] = fp16_to_fp32(b.m);
        unpack_nibbles16(b.qs, q, 0);
        or_high_bits32(load_u32(b.qh), q, 0x10);
    }
};

// gguf: x * d
template <>
struct BlockDecoder<RG_TYPE_Q8_0> : DecoderTraits<RG_TYPE_Q8_0, block_q8_0, QK8_0, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        scale[0] = fp16_to_fp32(b.d);
        std::memcpy(q, b.qs, QK);
    }
};

// IQ4_NL: d * kvalues[nibble]
template <>
struct BlockDecoder<RG_TYPE_IQ4_NL> : DecoderTraits<RG_TYPE_IQ4_NL, block_iq4_nl, QK4_NL, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        scale[0] = fp16_to_fp32(b.d);
        decode_detail::lookup_nibbles<16>(b.qs, rg_kvalues_iq4nl, q);
    }
};

// MXFP4: e8m0_half(e) * (2 * E2M1 value); the halved scale is an exact power of two (or subnormal
// pattern) computed bit-for-bit as gguf does.
template <>
struct BlockDecoder<RG_TYPE_MXFP4> : DecoderTraits<RG_TYPE_MXFP4, block_mxfp4, QK_MXFP4, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        scale[0] = decode_detail::e8m0_half(b.e);
        decode_detail::lookup_nibbles<16>(b.qs, rg_kvalues_e2m1, q);
    }
};

// NVFP4: 4 sub-blocks of 16, each ue4m3_half(d[s]) * (2 * E2M1 value). The scale table is gguf's own
// decode of every byte (0.5 factor included, 0x7F -> 0, bit 7 ignored).
template <>
struct BlockDecoder<RG_TYPE_NVFP4> : DecoderTraits<RG_TYPE_NVFP4, block_nvfp4, QK_NVFP4, 16, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        for (int s = 0; s < 4; ++s) {
            scale[s] = decode_detail::bits_to_f32(rg_ue4m3_half_bits[b.d[s]]);
            decode_detail::lookup_nibbles<8>(b.qs + 8 * s, rg_kvalues_e2m1, q + 16 * s);
        }
    }
};

// Q1_0 (no gguf class; upstream ggml): bit ? +d : -d == d * (+-1) exactly.
template <>
struct BlockDecoder<RG_TYPE_Q1_0> : DecoderTraits<RG_TYPE_Q1_0, block_q1_0, QK1_0, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        for (int g = 0; g < NG; ++g) scale[g] = d;
        // bit set -> 0x01, clear -> 0xFF (-1): mask | 0x01..
        for (int j = 0; j < 16; ++j) store_u64(q + 8 * j, ~rg_byte_mask[b.qs[j]] | kOnes);
    }
};

// Q2_0 (upstream ggml type 42): element j = ((qs[j/4] >> 2(j%4)) & 3) - 1, times d.
template <>
struct BlockDecoder<RG_TYPE_Q2_0> : DecoderTraits<RG_TYPE_Q2_0, block_q2_0, QK2_0, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        const float d = fp16_to_fp32(b.d);
        scale[0] = scale[1] = d;
        // two bytes at a time, placed at bits 0 and 32: shifting by 6, 12, 18 moves code r of each byte to
        // bits 8r..8r+1, the masked OR spreads the 4 codes over 4 bytes
        using namespace decode_detail;
        for (int c = 0; c < QK / 8; ++c) {
            const uint64_t y = b.qs[2 * c] | (uint64_t(b.qs[2 * c + 1]) << 32);
            store_u64(q + 8 * c, sub_bytes((y | (y << 6) | (y << 12) | (y << 18)) & bytes_of(3), 1));
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        scale[0] = fp16_to_fp32(b.d);
        for (int j = 0; j < 4; ++j) {
            const uint64_t y = b.qs[8 * c + 2 * j] | (uint64_t(b.qs[8 * c + 2 * j + 1]) << 32);
            store_u64(q + 8 * j, sub_bytes((y | (y << 6) | (y << 12) | (y << 18)) & bytes_of(3), 1));
        }
    }
};

// ---- k-quants: 256-element super-blocks -----------------------------------------------------------------
// Q2_K: (d * (sc & 15)) * q - (dmin * (sc >> 4)) per 16; a - b == a + (-b) exactly in IEEE arithmetic.
template <>
struct BlockDecoder<RG_TYPE_Q2_K> : DecoderTraits<RG_TYPE_Q2_K, block_q2_K, QK_K, 16, true> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float* bias) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
        for (int g = 0; g < NG; ++g) {
            scale[g] = d * float(b.scales[g] & 0x0f);
            bias[g] = -(dmin * float(b.scales[g] >> 4));
        }
        // element 128h + 32k + l = (qs[32h + l] >> 2k) & 3
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < 4; ++c) {
                const uint64_t v = load_u64(b.qs + 32 * h + 8 * c);
                for (int k = 0; k < 4; ++k)
                    store_u64(q + 128 * h + 32 * k + 8 * c, (v >> (2 * k)) & bytes_of(3));
            }
    }
};

// Q3_K: d * (6-bit scale - 32) per 16; q = low 2 bits - (high bit clear ? 4 : 0) = (low | high << 2) - 4.
template <>
struct BlockDecoder<RG_TYPE_Q3_K> : DecoderTraits<RG_TYPE_Q3_K, block_q3_K, QK_K, 16, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        // scale s: low 4 bits from nibble s/8 of scales[s%8], high 2 bits from bits 2(s/4) of scales[8+s%4]
        for (int s = 0; s < NG; ++s) {
            const int lo = (b.scales[s & 7] >> (4 * (s >> 3))) & 0x0f;
            const int hi = (b.scales[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
            scale[s] = d * float(int8_t(lo | (hi << 4)) - 32);
        }
        // element 32i + l (i = 4h + k): low = (qs[32h + l] >> 2k) & 3, high = bit i of hmask[l]
        for (int c = 0; c < 4; ++c) {
            const uint64_t hm = load_u64(b.hmask + 8 * c);
            for (int h = 0; h < 2; ++h) {
                const uint64_t v = load_u64(b.qs + 32 * h + 8 * c);
                for (int k = 0; k < 4; ++k) {
                    const int i = 4 * h + k;
                    const uint64_t code = ((v >> (2 * k)) & bytes_of(3)) | (((hm >> i) & kOnes) << 2);
                    store_u64(q + 32 * i + 8 * c, sub_bytes(code, 4));
                }
            }
        }
    }
};

// 8 (scale, min) pairs of 6 bits packed in 12 bytes (Q4_K, Q5_K).
RG_HD inline void k_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K / Q5_K parameters of group g: scale = d * sc, bias = -(dmin * m).
template <class B>
RG_HD inline void k_scale_bias(const B& b, int g, float* scale, float* bias) {
    uint8_t sc, m;
    k_scale_min(g, b.scales, &sc, &m);
    *scale = fp16_to_fp32(b.d) * float(sc);
    *bias = -(fp16_to_fp32(b.dmin) * float(m));
}

// Q4_K / Q5_K group parameters: scale = d * sc, bias = -(dmin * m) for the 8 groups of 32.
template <class B>
RG_HD inline void k_scales_biases(const B& b, float* scale, float* bias) {
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int g = 0; g < 8; ++g) {
        uint8_t sc, m;
        k_scale_min(g, b.scales, &sc, &m);
        scale[g] = d * float(sc);
        bias[g] = -(dmin * float(m));
    }
}

// Q4_K: (d * sc) * q - (dmin * m) per 32.
template <>
struct BlockDecoder<RG_TYPE_Q4_K> : DecoderTraits<RG_TYPE_Q4_K, block_q4_K, QK_K, 32, true> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float* bias) {
        using namespace decode_detail;
        k_scales_biases(b, scale, bias);
        // 64 elements per 32 bytes: low nibbles are group 2k, high nibbles group 2k+1
        for (int k = 0; k < 4; ++k)
            for (int c = 0; c < 4; ++c) {
                const uint64_t v = load_u64(b.qs + 32 * k + 8 * c);
                store_u64(q + 64 * k + 8 * c, v & kLowNibbles);
                store_u64(q + 64 * k + 32 + 8 * c, (v >> 4) & kLowNibbles);
            }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float* bias) {
        using namespace decode_detail;
        k_scale_bias(b, c, scale, bias);
        for (int j = 0; j < 4; ++j) {
            const uint64_t v = load_u64(b.qs + 32 * (c >> 1) + 8 * j);
            store_u64(q + 8 * j, (v >> (4 * (c & 1))) & kLowNibbles);
        }
    }
};

// Q5_K: as Q4_K with a 5th bit: element 32i + l takes bit i of qh[l].
template <>
struct BlockDecoder<RG_TYPE_Q5_K> : DecoderTraits<RG_TYPE_Q5_K, block_q5_K, QK_K, 32, true> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float* bias) {
        using namespace decode_detail;
        k_scales_biases(b, scale, bias);
        for (int c = 0; c < 4; ++c) {
            const uint64_t hm = load_u64(b.qh + 8 * c);
            for (int k = 0; k < 4; ++k) {
                const uint64_t v = load_u64(b.qs + 32 * k + 8 * c);
                store_u64(q + 64 * k + 8 * c, (v & kLowNibbles) | (((hm >> (2 * k)) & kOnes) << 4));
                store_u64(q + 64 * k + 32 + 8 * c,
                          ((v >> 4) & kLowNibbles) | (((hm >> (2 * k + 1)) & kOnes) << 4));
            }
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float* bias) {
        using namespace decode_detail;
        k_scale_bias(b, c, scale, bias);
        for (int j = 0; j < 4; ++j) {
            const uint64_t v = load_u64(b.qs + 32 * (c >> 1) + 8 * j), hm = load_u64(b.qh + 8 * j);
            store_u64(q + 8 * j, ((v >> (4 * (c & 1))) & kLowNibbles) | (((hm >> c) & kOnes) << 4));
        }
    }
};

// Q6_K: (d * int8 scale) * (6-bit code - 32) per 16. Element 128h + 32k + l:
// low 4 bits = nibble k/2 of ql[64h + 32(k%2) + l], high 2 bits = bits 2k of qh[32h + l].
template <>
struct BlockDecoder<RG_TYPE_Q6_K> : DecoderTraits<RG_TYPE_Q6_K, block_q6_K, QK_K, 16, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        for (int g = 0; g < NG; ++g) scale[g] = d * float(b.scales[g]);
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < 4; ++c) {
                const uint64_t hv = load_u64(b.qh + 32 * h + 8 * c);
                for (int k = 0; k < 4; ++k) {
                    const uint64_t lv = load_u64(b.ql + 64 * h + 32 * (k & 1) + 8 * c);
                    const uint64_t code =
                        ((lv >> (4 * (k >> 1))) & kLowNibbles) | (((hv >> (2 * k)) & bytes_of(3)) << 4);
                    store_u64(q + 128 * h + 32 * k + 8 * c, sub_bytes(code, 32));
                }
            }
    }
    // part c = 4h + k
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        scale[0] = d * float(b.scales[2 * c]);
        scale[1] = d * float(b.scales[2 * c + 1]);
        const int h = c >> 2, k = c & 3;
        for (int j = 0; j < 4; ++j) {
            const uint64_t hv = load_u64(b.qh + 32 * h + 8 * j);
            const uint64_t lv = load_u64(b.ql + 64 * h + 32 * (k & 1) + 8 * j);
            const uint64_t code = ((lv >> (4 * (k >> 1))) & kLowNibbles) | (((hv >> (2 * k)) & bytes_of(3)) << 4);
            store_u64(q + 8 * j, sub_bytes(code, 32));
        }
    }
};

// Q8_K: float d * int8 (no gguf class; ggml's activation type).
template <>
struct BlockDecoder<RG_TYPE_Q8_K> : DecoderTraits<RG_TYPE_Q8_K, block_q8_K, QK_K, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        for (int g = 0; g < NG; ++g) scale[g] = b.d;
        std::memcpy(q, b.qs, QK);
    }
};

// ---- ternary --------------------------------------------------------------------------------------------
// TQ1_0: a byte holds 5 trits as a base-3 fraction scaled to 0..255; trit k = ((uint8(v * 3^k) * 3) >> 8).
// Elements: 32k + l from qs[l] (k < 5), 160 + 16k + l from qs[32 + l], 240 + 4k + l from qh[l] (k < 4).
template <>
struct BlockDecoder<RG_TYPE_TQ1_0> : DecoderTraits<RG_TYPE_TQ1_0, block_tq1_0, QK_K, 32, false> {
    RG_HD static int8_t trit(uint8_t v, uint8_t pow3) { return int8_t(((uint8_t(v * pow3) * 3) >> 8) - 1); }
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        const float d = fp16_to_fp32(b.d);
        for (int g = 0; g < NG; ++g) scale[g] = d;
        static constexpr uint8_t pow3[5] = {1, 3, 9, 27, 81};
        for (int k = 0; k < 5; ++k) {
            for (int l = 0; l < 32; ++l) q[32 * k + l] = trit(b.qs[l], pow3[k]);
            for (int l = 0; l < 16; ++l) q[160 + 16 * k + l] = trit(b.qs[32 + l], pow3[k]);
        }
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 4; ++l) q[240 + 4 * k + l] = trit(b.qh[l], pow3[k]);
    }
};

// TQ2_0: element 128h + 32k + l = ((qs[32h + l] >> 2k) & 3) - 1, times d.
template <>
struct BlockDecoder<RG_TYPE_TQ2_0> : DecoderTraits<RG_TYPE_TQ2_0, block_tq2_0, QK_K, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        for (int g = 0; g < NG; ++g) scale[g] = d;
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < 4; ++c) {
                const uint64_t v = load_u64(b.qs + 32 * h + 8 * c);
                for (int k = 0; k < 4; ++k)
                    store_u64(q + 128 * h + 32 * k + 8 * c, sub_bytes((v >> (2 * k)) & bytes_of(3), 1));
            }
    }
};

}  // namespace RG_ISA_NS
}  // namespace regolith

#define RG_BLOCK_DECODE_INSIDE
#include "core/block_decode_iq.h"
#undef RG_BLOCK_DECODE_INSIDE

// ---- run-time type dispatch -------------------------------------------------------------------------------
// Every type with a BlockDecoder, as X(TYPE_ID): for explicit instantiation and tables over decoders.
// clang-format off
#define RG_FOR_EACH_QUANT_TYPE(X)                                                                        \
    X(RG_TYPE_Q4_0) X(RG_TYPE_Q4_1) X(RG_TYPE_Q5_0) X(RG_TYPE_Q5_1) X(RG_TYPE_Q8_0) X(RG_TYPE_Q8_K)     \
    X(RG_TYPE_Q2_K) X(RG_TYPE_Q3_K) X(RG_TYPE_Q4_K) X(RG_TYPE_Q5_K) X(RG_TYPE_Q6_K)                     \
    X(RG_TYPE_IQ1_S) X(RG_TYPE_IQ1_M) X(RG_TYPE_IQ2_XXS) X(RG_TYPE_IQ2_XS) X(RG_TYPE_IQ2_S)             \
    X(RG_TYPE_IQ3_XXS) X(RG_TYPE_IQ3_S) X(RG_TYPE_IQ4_NL) X(RG_TYPE_IQ4_XS) X(RG_TYPE_TQ1_0)            \
    X(RG_TYPE_TQ2_0) X(RG_TYPE_MXFP4) X(RG_TYPE_NVFP4) X(RG_TYPE_Q1_0) X(RG_TYPE_Q2_0)
// clang-format on

namespace regolith {
inline namespace RG_ISA_NS {

// True when `type` has a BlockDecoder.
constexpr bool is_quant_type(uint32_t type) {
    switch (type) {
#define RG_CASE_(T) case T:
        RG_FOR_EACH_QUANT_TYPE(RG_CASE_)
#undef RG_CASE_
        return true;
        default:
            return false;
    }
}

// Calls f(BlockDecoder<T>{}) for the run-time type id `type` and returns its result (every instantiation
// must return the same type). Throws regolith::Error for ids without a decoder (F32/F16/BF16 included:
// callers handle plain types themselves). Use as:
//     dispatch_quant_type(type, [&](auto dec) { using D = decltype(dec); ... D::decode(...); });
template <class F>
decltype(auto) dispatch_quant_type(uint32_t type, F&& f) {
    switch (type) {
#define RG_CASE_(T) \
    case T:         \
        return f(BlockDecoder<T>{});
        RG_FOR_EACH_QUANT_TYPE(RG_CASE_)
#undef RG_CASE_
        default:
            throw Error("no block decoder for ggml type id " + std::to_string(type));
    }
}

}  // namespace RG_ISA_NS
}  // namespace regolith
