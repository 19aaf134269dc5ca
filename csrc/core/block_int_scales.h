// Integer sub-scales of the 256-element super-block types.
//
// For these types each group's scale is a small integer times one float per block:
//     scale[g] == dsuper * isc[g]   (the same real number; equal to within float rounding)
// IntScales<TYPE>::get(block, isc) fills isc[NG] and returns dsuper. The matmul kernels use it to
// accumulate a whole block in int32 (multiplying the int16 products by isc) and convert to float once per
// block, as ggml's k-quant kernels do. Types without a specialization use the float-scale path.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/block_decode.h"

namespace regolith {
inline namespace RG_ISA_NS {

template <uint32_t TYPE>
struct IntScales;

template <uint32_t TYPE, class = void>
struct has_int_scales : std::false_type {};
template <uint32_t TYPE>
struct has_int_scales<TYPE, std::void_t<decltype(&IntScales<TYPE>::get)>> : std::true_type {};

// Largest |isc| any specialization produces: int16 products * isc summed over a 256-block stay in int32
// (8 chunks * 2 * 32512 * 128 < 2^31).
constexpr int kMaxIntScale = 128;

template <>
struct IntScales<RG_TYPE_Q2_K> {
    static float get(const block_q2_K& b, int16_t* isc) {
        for (int g = 0; g < 16; ++g) isc[g] = b.scales[g] & 0x0f;
        return fp16_to_fp32(b.d);
    }
};

template <>
struct IntScales<RG_TYPE_Q3_K> {
    static float get(const block_q3_K& b, int16_t* isc) {
        for (int s = 0; s < 16; ++s) {
            const int lo = (b.scales[s & 7] >> (4 * (s >> 3))) & 0x0f;
            const int hi = (b.scales[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
            isc[s] = int16_t((lo | (hi << 4)) - 32);
        }
        return fp16_to_fp32(b.d);
    }
};

// Q4_K / Q5_K: the 6-bit scales of the 8 groups, times d.
template <class B>
inline float k_int_scales(const B& b, int16_t* isc) {
    for (int g = 0; g < 8; ++g) {
        uint8_t sc, m;
        k_scale_min(g, b.scales, &sc, &m);
        isc[g] = sc;
    }
    return fp16_to_fp32(b.d);
}

template <>
struct IntScales<RG_TYPE_Q4_K> {
    static float get(const block_q4_K& b, int16_t* isc) { return k_int_scales(b, isc); }
};

template <>
struct IntScales<RG_TYPE_Q5_K> {
    static float get(const block_q5_K& b, int16_t* isc) { return k_int_scales(b, isc); }
};

template <>
struct IntScales<RG_TYPE_Q6_K> {
    static float get(const block_q6_K& b, int16_t* isc) {
        for (int g = 0; g < 16; ++g) isc[g] = b.scales[g];
        return fp16_to_fp32(b.d);
    }
};

template <>
struct IntScales<RG_TYPE_Q8_K> {
    static float get(const block_q8_K& b, int16_t* isc) {
        for (int g = 0; g < 8; ++g) isc[g] = 1;
        return b.d;
    }
};

template <>
struct IntScales<RG_TYPE_TQ1_0> {
    static float get(const block_tq1_0& b, int16_t* isc) {
        for (int g = 0; g < 8; ++g) isc[g] = 1;
        return fp16_to_fp32(b.d);
    }
};

template <>
struct IntScales<RG_TYPE_TQ2_0> {
    static float get(const block_tq2_0& b, int16_t* isc) {
        for (int g = 0; g < 8; ++g) isc[g] = 1;
        return fp16_to_fp32(b.d);
    }
};

// IQ2: db = d * (0.5 + s) * 0.25 = (d / 8) * (2s + 1).
template <>
struct IntScales<RG_TYPE_IQ2_XXS> {
    static float get(const block_iq2_xxs& b, int16_t* isc) {
        const uint8_t* qs = reinterpret_cast<const uint8_t*>(b.qs);
        for (int ib = 0; ib < 8; ++ib) isc[ib] = int16_t(2 * (qs[8 * ib + 7] >> 4) + 1);
        return fp16_to_fp32(b.d) * 0.125f;
    }
};

template <>
struct IntScales<RG_TYPE_IQ2_XS> {
    static float get(const block_iq2_xs& b, int16_t* isc) {
        for (int g = 0; g < 16; ++g) isc[g] = int16_t(2 * ((b.scales[g >> 1] >> (4 * (g & 1))) & 0x0f) + 1);
        return fp16_to_fp32(b.d) * 0.125f;
    }
};

template <>
struct IntScales<RG_TYPE_IQ2_S> {
    static float get(const block_iq2_s& b, int16_t* isc) {
        for (int g = 0; g < 16; ++g) isc[g] = int16_t(2 * ((b.scales[g >> 1] >> (4 * (g & 1))) & 0x0f) + 1);
        return fp16_to_fp32(b.d) * 0.125f;
    }
};

// IQ3_XXS: db = d * (0.5 + s) * 0.5 = (d / 4) * (2s + 1).
template <>
struct IntScales<RG_TYPE_IQ3_XXS> {
    static float get(const block_iq3_xxs& b, int16_t* isc) {
        const uint8_t* aux = b.qs + QK_K / 4;
        for (int ib = 0; ib < 8; ++ib) isc[ib] = int16_t(2 * (aux[4 * ib + 3] >> 4) + 1);
        return fp16_to_fp32(b.d) * 0.25f;
    }
};

template <>
struct IntScales<RG_TYPE_IQ3_S> {
    static float get(const block_iq3_s& b, int16_t* isc) {
        for (int g = 0; g < 8; ++g) isc[g] = int16_t(1 + 2 * ((b.scales[g >> 1] >> (4 * (g & 1))) & 0x0f));
        return fp16_to_fp32(b.d);
    }
};

// IQ1: the decoder's codes are 8 * (grid + delta), so scale = d * (2s + 1) / 8.
template <>
struct IntScales<RG_TYPE_IQ1_S> {
    static float get(const block_iq1_s& b, int16_t* isc) {
        const uint8_t* qh8 = reinterpret_cast<const uint8_t*>(b.qh);
        for (int ib = 0; ib < 8; ++ib) isc[ib] = int16_t(2 * ((qh8[2 * ib + 1] >> 4) & 7) + 1);
        return fp16_to_fp32(b.d) * 0.125f;
    }
};

template <>
struct IntScales<RG_TYPE_IQ1_M> {
    static float get(const block_iq1_m& b, int16_t* isc) {
        uint16_t sc[4];
        for (int u = 0; u < 4; ++u) sc[u] = uint16_t(b.scales[2 * u] | (b.scales[2 * u + 1] << 8));
        const uint16_t dbits =
            uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        for (int s = 0; s < 16; ++s) isc[s] = int16_t(2 * ((sc[s >> 2] >> (3 * (s & 3))) & 7) + 1);
        return fp16_to_fp32(dbits) * 0.125f;
    }
};

template <>
struct IntScales<RG_TYPE_IQ4_XS> {
    static float get(const block_iq4_xs& b, int16_t* isc) {
        const uint16_t sh = uint16_t(reinterpret_cast<const uint8_t*>(&b.scales_h)[0] |
                                     (reinterpret_cast<const uint8_t*>(&b.scales_h)[1] << 8));
        for (int ib = 0; ib < 8; ++ib) {
            const int lo = (b.scales_l[ib >> 1] >> (4 * (ib & 1))) & 0x0f;
            isc[ib] = int16_t((lo | (((sh >> (2 * ib)) & 3) << 4)) - 32);
        }
        return fp16_to_fp32(b.d);
    }
};

}  // namespace RG_ISA_NS
}  // namespace regolith
