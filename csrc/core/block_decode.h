// Per-type block decoders: the single definition of what each quantized block means.
//
// Every quantized type decodes one block into small integer codes and per-group affine parameters:
//
//     x[i] = scale[i / G] * q[i]  (+ bias[i / G]  when HAS_BIAS)
//
// evaluated in float32 as one multiply then one add (compile users with -ffp-contract=off where
// bit-exactness matters). `scale` and `bias` are computed with the same float32 operations, in the same
// order, as the gguf package's numpy dequantizers, so dequantization built on this is bit-exact.
// The integer dot-product kernels use the same decode: sum_i x[i] a[i] = sum_g scale_g * (q . a)_g
// + bias_g * sum(a)_g. q always fits int8 ([-128, 127]).
//
// A decoder is a struct BlockDecoder<TYPE> with:
//     using Block = block_xxx;           // the layout from core/quant.h
//     static constexpr int QK;           // elements per block
//     static constexpr int G;            // elements per scale group: 16 or 32 (QK % G == 0)
//     static constexpr bool HAS_BIAS;
//     static void decode(const Block& b, int8_t* q /*[QK]*/, float* scale /*[QK/G]*/, float* bias /*[QK/G]*/);
// (bias is untouched when !HAS_BIAS).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "core/quant.h"
#include "core/quant_tables.h"

namespace regolith {

template <int TYPE>
struct BlockDecoder;

template <>
struct BlockDecoder<RG_TYPE_Q8_0> {
    using Block = block_q8_0;
    static constexpr int QK = QK8_0, G = 32;
    static constexpr bool HAS_BIAS = false;
    static void decode(const Block& b, int8_t* q, float* scale, float*) {
        scale[0] = fp16_to_fp32(b.d);
        std::memcpy(q, b.qs, QK);
    }
};

template <>
struct BlockDecoder<RG_TYPE_Q4_0> {
    using Block = block_q4_0;
    static constexpr int QK = QK4_0, G = 32;
    static constexpr bool HAS_BIAS = false;
    static void decode(const Block& b, int8_t* q, float* scale, float*) {
        scale[0] = fp16_to_fp32(b.d);
        for (int j = 0; j < QK / 2; ++j) {
            q[j] = int8_t((b.qs[j] & 0x0f) - 8);
            q[j + QK / 2] = int8_t((b.qs[j] >> 4) - 8);
        }
    }
};

template <>
struct BlockDecoder<RG_TYPE_Q4_K> {
    using Block = block_q4_K;
    static constexpr int QK = QK_K, G = 32;
    static constexpr bool HAS_BIAS = true;
    // 8 (scale, min) pairs of 6 bits packed in 12 bytes.
    static void scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
        if (j < 4) {
            *sc = s[j] & 63;
            *m = s[j + 4] & 63;
        } else {
            *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
            *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    static void decode(const Block& b, int8_t* q, float* scale, float* bias) {
        const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
        for (int g = 0; g < 8; ++g) {
            uint8_t sc, m;
            scale_min(g, b.scales, &sc, &m);
            scale[g] = d * float(sc);
            bias[g] = -(dmin * float(m));
        }
        // 64 elements per 32 bytes: low nibbles are group 2k, high nibbles group 2k+1
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 32; ++l) {
                q[64 * k + l] = int8_t(b.qs[32 * k + l] & 0x0f);
                q[64 * k + 32 + l] = int8_t(b.qs[32 * k + l] >> 4);
            }
    }
};

}  // namespace regolith
