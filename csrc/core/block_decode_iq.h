// Block decoders for the i-quants (lattice codebooks and non-linear 4-bit). Part of block_decode.h,
// which states the contract; include that header, not this one.
//
// Grid types decode as x = db * (grid value) * (+-1) in gguf. Multiplying by -1 is an exact negation and
// round-to-nearest is symmetric, so db * (+-grid) is the same float: q = signed grid value (|q| <= 62),
// scale = db computed with gguf's operation order. Signs are applied 8 bytes at a time with
// apply_signs(), valid because every IQ2/IQ3 grid value is >= 1.
#pragma once

#ifndef RG_BLOCK_DECODE_INSIDE
#error "include core/block_decode.h instead of core/block_decode_iq.h"
#endif

namespace regolith {
inline namespace RG_ISA_NS {

// IQ2_XXS: per 32 elements two uint32: 4 grid indices (bytes) | 4 x 7-bit ksigns indices + 4-bit scale s.
// gguf: db = d * (0.5 + s) * 0.25; x = db * grid * sign.
template <>
struct BlockDecoder<RG_TYPE_IQ2_XXS> : DecoderTraits<RG_TYPE_IQ2_XXS, block_iq2_xxs, QK_K, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        const uint8_t* qs = reinterpret_cast<const uint8_t*>(b.qs);
        for (int ib = 0; ib < NG; ++ib) {
            const uint32_t aux1 = load_u32(qs + 8 * ib + 4);
            scale[ib] = d * (0.5f + float(aux1 >> 28)) * 0.25f;
            for (int k = 0; k < 4; ++k) {
                const uint64_t g = rg_iq2xxs_grid[qs[8 * ib + k]];
                store_u64(q + 32 * ib + 8 * k, apply_signs(g, rg_ksigns_mask[(aux1 >> (7 * k)) & 127]));
            }
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const uint8_t* qs = reinterpret_cast<const uint8_t*>(b.qs) + 8 * c;
        const uint32_t aux1 = load_u32(qs + 4);
        scale[0] = fp16_to_fp32(b.d) * (0.5f + float(aux1 >> 28)) * 0.25f;
        for (int k = 0; k < 4; ++k)
            store_u64(q + 8 * k, apply_signs(rg_iq2xxs_grid[qs[k]], rg_ksigns_mask[(aux1 >> (7 * k)) & 127]));
    }
};

// IQ2_XS: per 8 elements a uint16 (9-bit grid index | 7-bit ksigns index); 4-bit scales per 16.
// gguf: db = d * (0.5 + s) * 0.25; x = db * grid * sign.
template <>
struct BlockDecoder<RG_TYPE_IQ2_XS> : DecoderTraits<RG_TYPE_IQ2_XS, block_iq2_xs, QK_K, 16, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        for (int g = 0; g < NG; ++g)
            scale[g] = d * (0.5f + float((b.scales[g >> 1] >> (4 * (g & 1))) & 0x0f)) * 0.25f;
        const uint8_t* qs = reinterpret_cast<const uint8_t*>(b.qs);
        for (int t = 0; t < QK / 8; ++t) {
            const uint16_t v = load_u16(qs + 2 * t);
            store_u64(q + 8 * t, apply_signs(rg_iq2xs_grid[v & 511], rg_ksigns_mask[v >> 9]));
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        for (int j = 0; j < 2; ++j) scale[j] = d * (0.5f + float((b.scales[c] >> (4 * j)) & 0x0f)) * 0.25f;
        const uint8_t* qs = reinterpret_cast<const uint8_t*>(b.qs) + 8 * c;
        for (int t = 0; t < 4; ++t) {
            const uint16_t v = load_u16(qs + 2 * t);
            store_u64(q + 8 * t, apply_signs(rg_iq2xs_grid[v & 511], rg_ksigns_mask[v >> 9]));
        }
    }
};

// IQ2_S: 10-bit grid index = qs[t] | 2 bits of qh; explicit sign bytes; 4-bit scales per 16.
// gguf: db = d * (0.5 + s) * 0.25; x = db * grid * sign.
template <>
struct BlockDecoder<RG_TYPE_IQ2_S> : DecoderTraits<RG_TYPE_IQ2_S, block_iq2_s, QK_K, 16, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        for (int g = 0; g < NG; ++g)
            scale[g] = d * (0.5f + float((b.scales[g >> 1] >> (4 * (g & 1))) & 0x0f)) * 0.25f;
        const uint8_t* signs = b.qs + QK / 8;
        for (int t = 0; t < QK / 8; ++t) {
            const int idx = b.qs[t] | (((b.qh[t >> 2] >> (2 * (t & 3))) & 3) << 8);
            store_u64(q + 8 * t, apply_signs(rg_iq2s_grid[idx], rg_byte_mask[signs[t]]));
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        for (int j = 0; j < 2; ++j) scale[j] = d * (0.5f + float((b.scales[c] >> (4 * j)) & 0x0f)) * 0.25f;
        const uint8_t* signs = b.qs + QK / 8;
        for (int t = 4 * c; t < 4 * c + 4; ++t) {
            const int idx = b.qs[t] | (((b.qh[t >> 2] >> (2 * (t & 3))) & 3) << 8);
            store_u64(q + 8 * (t - 4 * c), apply_signs(rg_iq2s_grid[idx], rg_byte_mask[signs[t]]));
        }
    }
};

// IQ3_XXS: 64 grid-index bytes (4 values each), then per 32 elements a uint32 of 4 x 7-bit ksigns
// indices + 4-bit scale s. gguf: db = d * (0.5 + s) * 0.5; x = db * grid * sign.
template <>
struct BlockDecoder<RG_TYPE_IQ3_XXS> : DecoderTraits<RG_TYPE_IQ3_XXS, block_iq3_xxs, QK_K, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        const uint8_t* idx = b.qs;
        const uint8_t* aux = b.qs + QK / 4;
        for (int ib = 0; ib < NG; ++ib) {
            const uint32_t a = load_u32(aux + 4 * ib);
            scale[ib] = d * (0.5f + float(a >> 28)) * 0.5f;
            for (int k = 0; k < 4; ++k) {
                const int t = 8 * ib + 2 * k;
                const uint64_t g = rg_iq3xxs_grid[idx[t]] | (uint64_t(rg_iq3xxs_grid[idx[t + 1]]) << 32);
                store_u64(q + 32 * ib + 8 * k, apply_signs(g, rg_ksigns_mask[(a >> (7 * k)) & 127]));
            }
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const uint32_t a = load_u32(b.qs + QK / 4 + 4 * c);
        scale[0] = fp16_to_fp32(b.d) * (0.5f + float(a >> 28)) * 0.5f;
        for (int k = 0; k < 4; ++k) {
            const int t = 8 * c + 2 * k;
            const uint64_t g = rg_iq3xxs_grid[b.qs[t]] | (uint64_t(rg_iq3xxs_grid[b.qs[t + 1]]) << 32);
            store_u64(q + 8 * k, apply_signs(g, rg_ksigns_mask[(a >> (7 * k)) & 127]));
        }
    }
};

// IQ3_S: 9-bit grid index = qs[t] | bit t%8 of qh[t/8] (4 values each); explicit sign bytes; 4-bit
// scales per 32. gguf: db = d * (1 + 2s); x = db * grid * sign.
template <>
struct BlockDecoder<RG_TYPE_IQ3_S> : DecoderTraits<RG_TYPE_IQ3_S, block_iq3_s, QK_K, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        for (int g = 0; g < NG; ++g)
            scale[g] = d * float(1 + 2 * ((b.scales[g >> 1] >> (4 * (g & 1))) & 0x0f));
        for (int t = 0; t < QK / 8; ++t) {
            const int i0 = 2 * t, i1 = 2 * t + 1;
            const uint8_t h = b.qh[t >> 2];
            const int idx0 = b.qs[i0] | (((h >> (i0 & 7)) & 1) << 8);
            const int idx1 = b.qs[i1] | (((h >> (i1 & 7)) & 1) << 8);
            const uint64_t g = rg_iq3s_grid[idx0] | (uint64_t(rg_iq3s_grid[idx1]) << 32);
            store_u64(q + 8 * t, apply_signs(g, rg_byte_mask[b.signs[t]]));
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        scale[0] = fp16_to_fp32(b.d) * float(1 + 2 * ((b.scales[c >> 1] >> (4 * (c & 1))) & 0x0f));
        for (int t = 4 * c; t < 4 * c + 4; ++t) {
            const int i0 = 2 * t, i1 = 2 * t + 1;
            const uint8_t h = b.qh[t >> 2];
            const int idx0 = b.qs[i0] | (((h >> (i0 & 7)) & 1) << 8);
            const int idx1 = b.qs[i1] | (((h >> (i1 & 7)) & 1) << 8);
            const uint64_t g = rg_iq3s_grid[idx0] | (uint64_t(rg_iq3s_grid[idx1]) << 32);
            store_u64(q + 8 * (t - 4 * c), apply_signs(g, rg_byte_mask[b.signs[t]]));
        }
    }
};

// IQ1 codes: q = 8 * grid + (delta < 0 ? -1 : +1) per byte, grid in {-1, 0, 1}.
//
// gguf computes dl * (grid + delta) with delta = +-0.125. grid + delta = q / 8 exactly, so the value is
// round(dl * q / 8). We use scale = dl * 0.125, which is exact (a power-of-two scaling of a float32 that
// is at least 2^-24 in magnitude or zero, far from the subnormal range), and scale * q then rounds the same
// real number dl * q / 8 once: bit-identical. q is never 0 so signed zeros agree as well.
RG_HD inline uint64_t iq1_codes(uint64_t grid, bool negative_delta) {
    using namespace decode_detail;
    const uint64_t g8 =
        (grid << 3) & bytes_of(0xf8);  // per byte 8 * g; bits shifted in from below are masked
    const uint64_t delta =
        kOnes ^ ((uint64_t(0) - uint64_t(negative_delta)) & bytes_of(0xfe));  // 0x01 or 0xFF, no branch
    return add_bytes(g8, delta);
}

// IQ1_S: per 32 elements a uint16 qh: 4 x 3 high index bits, 3-bit scale s, delta sign (bit 15).
// gguf: dl = d * (2s + 1); x = dl * (grid + delta).
template <>
struct BlockDecoder<RG_TYPE_IQ1_S> : DecoderTraits<RG_TYPE_IQ1_S, block_iq1_s, QK_K, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        const uint8_t* qh8 = reinterpret_cast<const uint8_t*>(b.qh);
        for (int ib = 0; ib < NG; ++ib) {
            const uint16_t qh = load_u16(qh8 + 2 * ib);
            scale[ib] = d * float(2 * ((qh >> 12) & 7) + 1) * 0.125f;
            const bool neg = qh & 0x8000;
            for (int k = 0; k < 4; ++k) {
                const int idx = b.qs[4 * ib + k] | (((qh >> (3 * k)) & 7) << 8);
                store_u64(q + 32 * ib + 8 * k, iq1_codes(rg_iq1s_grid[idx], neg));
            }
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const uint16_t qh = load_u16(reinterpret_cast<const uint8_t*>(b.qh) + 2 * c);
        scale[0] = fp16_to_fp32(b.d) * float(2 * ((qh >> 12) & 7) + 1) * 0.125f;
        for (int k = 0; k < 4; ++k) {
            const int idx = b.qs[4 * c + k] | (((qh >> (3 * k)) & 7) << 8);
            store_u64(q + 8 * k, iq1_codes(rg_iq1s_grid[idx], qh & 0x8000));
        }
    }
};

// IQ1_M: per 8 elements a nibble of qh: 3 high index bits + delta sign (bit 3); 3-bit scales per 16 in
// 4 uint16, whose top nibbles together hold the fp16 super-block scale d.
// gguf: dl = d * (2s + 1); x = dl * (grid + delta).
template <>
struct BlockDecoder<RG_TYPE_IQ1_M> : DecoderTraits<RG_TYPE_IQ1_M, block_iq1_m, QK_K, 16, false> {
    // The 4 uint16 of scales into sc; returns d, the fp16 their top nibbles hold.
    RG_HD static float scales_and_d(const Block& b, uint16_t (&sc)[4]) {
        using namespace decode_detail;
        for (int u = 0; u < 4; ++u) sc[u] = load_u16(b.scales + 2 * u);
        return fp16_to_fp32(
            uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)));
    }
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        uint16_t sc[4];
        const float d = scales_and_d(b, sc);
        for (int s = 0; s < NG; ++s)
            scale[s] = d * float(2 * ((sc[s >> 2] >> (3 * (s & 3))) & 7) + 1) * 0.125f;
        for (int t = 0; t < QK / 8; ++t) {
            const int nib = (b.qh[t >> 1] >> (4 * (t & 1))) & 0x0f;
            const int idx = b.qs[t] | ((nib & 7) << 8);
            store_u64(q + 8 * t, iq1_codes(rg_iq1s_grid[idx], nib & 8));
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        uint16_t sc[4];
        const float d = scales_and_d(b, sc);
        for (int j = 0; j < 2; ++j) {
            const int s = 2 * c + j;
            scale[j] = d * float(2 * ((sc[s >> 2] >> (3 * (s & 3))) & 7) + 1) * 0.125f;
        }
        for (int t = 4 * c; t < 4 * c + 4; ++t) {
            const int nib = (b.qh[t >> 1] >> (4 * (t & 1))) & 0x0f;
            const int idx = b.qs[t] | ((nib & 7) << 8);
            store_u64(q + 8 * (t - 4 * c), iq1_codes(rg_iq1s_grid[idx], nib & 8));
        }
    }
};

// IQ4_XS: 6-bit scales per 32 (low 4 bits in scales_l nibbles, high 2 in scales_h);
// gguf: dl = d * (s - 32); x = dl * kvalues[nibble].
template <>
struct BlockDecoder<RG_TYPE_IQ4_XS> : DecoderTraits<RG_TYPE_IQ4_XS, block_iq4_xs, QK_K, 32, false> {
    RG_HD static void decode(const Block& b, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const float d = fp16_to_fp32(b.d);
        const uint16_t sh = load_u16(&b.scales_h);
        for (int ib = 0; ib < NG; ++ib) {
            const int lo = (b.scales_l[ib >> 1] >> (4 * (ib & 1))) & 0x0f;
            const int hi = (sh >> (2 * ib)) & 3;
            scale[ib] = d * float((lo | (hi << 4)) - 32);
            lookup_nibbles<16>(b.qs + 16 * ib, rg_kvalues_iq4nl, q + 32 * ib);
        }
    }
    RG_HD static void decode_part(const Block& b, int c, int8_t* q, float* scale, float*) {
        using namespace decode_detail;
        const int lo = (b.scales_l[c >> 1] >> (4 * (c & 1))) & 0x0f;
        const int hi = (load_u16(&b.scales_h) >> (2 * c)) & 3;
        scale[0] = fp16_to_fp32(b.d) * float((lo | (hi << 4)) - 32);
        lookup_nibbles<16>(b.qs + 16 * c, rg_kvalues_iq4nl, q);
    }
};

}  // namespace RG_ISA_NS
}  // namespace regolith
