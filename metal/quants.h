// Dequantization of every weight type, for the kernels: the meaning of each block layout of core/quant.h,
// bit-exact with the CPU's dequantizer (core/block_decode.h: x = scale * q (+ bias), the same float
// operations in the same order, one rounding each), 32 elements at a time.
//
//     RgQuant<TYPE>::QK                        elements per block (a multiple of 32)
//     RgQuant<TYPE>::BYTES                     bytes per block (sizeof the block of core/quant.h)
//     RgQuant<TYPE>::dequant32(block, part, out)
//         out[0..32) = elements [32 part, 32 part + 32) of the block starting at `block`
//
// Blocks sit at multiples of their size from a row's start, so a block is aligned only as its own fields
// need (2 bytes where it has a half). F32, F16 and BF16 are blocks of 32 elements here, so one kernel
// template covers every type. The conformance suite's get_rows cases (exact) compare every type with the
// CPU bit for bit.
#pragma once

#include "compat.h"
#include "core/quant.h"
#include "core/quant_tables.h"

template <uint TYPE>
struct RgQuant;

template <>
struct RgQuant<RG_TYPE_F32> {
    static constexpr int QK = 32, BYTES = 128;
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const float* x = (device const float*)block;
        for (int j = 0; j < 32; ++j) out[j] = x[j];
    }
};

template <>
struct RgQuant<RG_TYPE_F16> {
    static constexpr int QK = 32, BYTES = 64;
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const half* x = (device const half*)block;
        for (int j = 0; j < 32; ++j) out[j] = float(x[j]);
    }
};

template <>
struct RgQuant<RG_TYPE_BF16> {
    static constexpr int QK = 32, BYTES = 64;
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const ushort* x = (device const ushort*)block;
        for (int j = 0; j < 32; ++j) out[j] = as_type<float>(uint(x[j]) << 16);
    }
};

// out[0..32) = the first n elements of part `part` of a block, then zeros: a float row (F32, F16, BF16) may
// end inside a part, a quantized row never does (whole blocks of whole parts), so n < 32 only for float
// types.
template <uint TYPE>
inline void rg_dequant_head(device const uchar* block, int part, int n, thread float* out) {
    RgQuant<TYPE>::dequant32(block, part, out);
}
template <>
inline void rg_dequant_head<RG_TYPE_F32>(device const uchar* block, int part, int n, thread float* out) {
    device const float* x = (device const float*)block;
    for (int j = 0; j < 32; ++j) out[j] = j < n ? x[j] : 0.0f;
}
template <>
inline void rg_dequant_head<RG_TYPE_F16>(device const uchar* block, int part, int n, thread float* out) {
    device const half* x = (device const half*)block;
    for (int j = 0; j < 32; ++j) out[j] = j < n ? float(x[j]) : 0.0f;
}
template <>
inline void rg_dequant_head<RG_TYPE_BF16>(device const uchar* block, int part, int n, thread float* out) {
    device const ushort* x = (device const ushort*)block;
    for (int j = 0; j < 32; ++j) out[j] = j < n ? as_type<float>(uint(x[j]) << 16) : 0.0f;
}

// gguf: x * d
template <>
struct RgQuant<RG_TYPE_Q8_0> {
    static constexpr int QK = QK8_0, BYTES = sizeof(block_q8_0);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q8_0* b = (device const block_q8_0*)block;
        const float d = float(b->d);
        for (int j = 0; j < 32; ++j) out[j] = d * float(b->qs[j]);
    }
};

// ---- helpers ----------------------------------------------------------------------------------------------
// Little-endian loads at any byte alignment (block fields wider than 2 bytes are not aligned for them).
inline uint rg_q_u16(device const uchar* p) { return uint(p[0]) | (uint(p[1]) << 8); }
inline uint rg_q_u32(device const uchar* p) {
    return uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
}
// 32 nibble codes of 16 bytes (element l: low nibble of qs[l], element l + 16: its high nibble) through a
// 16-entry table, times d: IQ4_NL, IQ4_XS, MXFP4.
inline void rg_q_lookup32(device const uchar* qs, constant const int8_t* table, float d, thread float* out) {
    for (int l = 0; l < 16; ++l) {
        const uint v = qs[l];
        out[l] = d * float(table[v & 15]);
        out[l + 16] = d * float(table[v >> 4]);
    }
}
// 4 elements of a lattice codebook entry (bytes of `grid`) with sign bits `signs` (bit i negates element i),
// times d: the i-quants' x = db * grid * sign (negation is exact, so db * (-grid) is gguf's float).
inline void rg_q_grid4(constant const uchar* grid, uint signs, float d, thread float* out) {
    for (int i = 0; i < 4; ++i) {
        const int g = int(grid[i]);
        out[i] = d * float((signs >> i) & 1 ? -g : g);
    }
}
inline void rg_q_grid8(constant const uchar* grid, uint signs, float d, thread float* out) {
    rg_q_grid4(grid, signs, d, out);
    rg_q_grid4(grid + 4, signs >> 4, d, out + 4);
}
// IQ1_S / IQ1_M: 8 elements of an rg_iq1s_grid entry ({-1, 0, 1} as int8) with delta -1/8 or +1/8:
// dl * (grid + delta) == (dl / 8) * (8 grid + delta sign) exactly (core/block_decode_iq.h), d8 = dl / 8.
inline void rg_q_iq1_8(uint idx, bool negative_delta, float d8, thread float* out) {
    constant const int8_t* g = (constant const int8_t*)(rg_iq1s_grid + idx);
    const int delta = negative_delta ? -1 : 1;
    for (int i = 0; i < 8; ++i) out[i] = d8 * float(8 * int(g[i]) + delta);
}

// ---- legacy 32-element blocks
// ------------------------------------------------------------------------------- gguf: d * (nibble - 8)
template <>
struct RgQuant<RG_TYPE_Q4_0> {
    static constexpr int QK = QK4_0, BYTES = sizeof(block_q4_0);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q4_0* b = (device const block_q4_0*)block;
        const float d = float(b->d);
        for (int l = 0; l < 16; ++l) {
            const int v = b->qs[l];
            out[l] = d * float((v & 15) - 8);
            out[l + 16] = d * float((v >> 4) - 8);
        }
    }
};

// gguf: (d * nibble) + m
template <>
struct RgQuant<RG_TYPE_Q4_1> {
    static constexpr int QK = QK4_1, BYTES = sizeof(block_q4_1);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q4_1* b = (device const block_q4_1*)block;
        const float d = float(b->d), m = float(b->m);
        for (int l = 0; l < 16; ++l) {
            const int v = b->qs[l];
            out[l] = d * float(v & 15) + m;
            out[l + 16] = d * float(v >> 4) + m;
        }
    }
};

// gguf: d * ((nibble | bit4) - 16); element j's 5th bit is bit j of the little-endian qh.
template <>
struct RgQuant<RG_TYPE_Q5_0> {
    static constexpr int QK = QK5_0, BYTES = sizeof(block_q5_0);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q5_0* b = (device const block_q5_0*)block;
        const float d = float(b->d);
        const uint qh = rg_q_u32(b->qh);
        for (int l = 0; l < 16; ++l) {
            const int v = b->qs[l];
            out[l] = d * float(int((v & 15) | (((qh >> l) & 1) << 4)) - 16);
            out[l + 16] = d * float(int((v >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16);
        }
    }
};

// gguf: (d * (nibble | bit4)) + m
template <>
struct RgQuant<RG_TYPE_Q5_1> {
    static constexpr int QK = QK5_1, BYTES = sizeof(block_q5_1);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q5_1* b = (device const block_q5_1*)block;
        const float d = float(b->d), m = float(b->m);
        const uint qh = rg_q_u32(b->qh);
        for (int l = 0; l < 16; ++l) {
            const uint v = b->qs[l];
            out[l] = d * float((v & 15) | (((qh >> l) & 1) << 4)) + m;
            out[l + 16] = d * float((v >> 4) | (((qh >> (l + 16)) & 1) << 4)) + m;
        }
    }
};

// IQ4_NL: d * kvalues[nibble]
template <>
struct RgQuant<RG_TYPE_IQ4_NL> {
    static constexpr int QK = QK4_NL, BYTES = sizeof(block_iq4_nl);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq4_nl* b = (device const block_iq4_nl*)block;
        rg_q_lookup32(b->qs, rg_kvalues_iq4nl, float(b->d), out);
    }
};

// MXFP4: e8m0_half(e) * (2 * E2M1 value). The halved scale 2^(e - 128) is built from its bits as gguf's
// e8m0_to_fp32_half: subnormal patterns for e < 2. (Apple GPUs may flush float subnormals in the product.)
template <>
struct RgQuant<RG_TYPE_MXFP4> {
    static constexpr int QK = QK_MXFP4, BYTES = sizeof(block_mxfp4);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        const uint e = block[0];
        const float d = as_type<float>(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
        rg_q_lookup32(block + 1, rg_kvalues_e2m1, d, out);
    }
};

// NVFP4: 64 elements, 16 per UE4M3 scale (gguf's decode of the byte, halved: rg_ue4m3_half_bits) times
// 2 * E2M1 value. Sub-block s: element l of qs[8s + l]'s low nibble, element 8 + l of its high nibble.
template <>
struct RgQuant<RG_TYPE_NVFP4> {
    static constexpr int QK = QK_NVFP4, BYTES = sizeof(block_nvfp4);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        for (int h = 0; h < 2; ++h) {
            const int s = 2 * part + h;
            const float d = as_type<float>(rg_ue4m3_half_bits[block[s]]);
            device const uchar* qs = block + 4 + 8 * s;
            for (int l = 0; l < 8; ++l) {
                const uint v = qs[l];
                out[16 * h + l] = d * float(rg_kvalues_e2m1[v & 15]);
                out[16 * h + 8 + l] = d * float(rg_kvalues_e2m1[v >> 4]);
            }
        }
    }
};

// Q1_0: 128 elements, bit ? +1 : -1, times d. Element 8j + i is bit i of qs[j].
template <>
struct RgQuant<RG_TYPE_Q1_0> {
    static constexpr int QK = QK1_0, BYTES = sizeof(block_q1_0);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q1_0* b = (device const block_q1_0*)block;
        const float d = float(b->d);
        const uint bits = rg_q_u32(b->qs + 4 * part);
        for (int j = 0; j < 32; ++j) out[j] = d * float((bits >> j) & 1 ? 1 : -1);
    }
};

// Q2_0: 64 elements, ((qs[j / 4] >> 2 (j % 4)) & 3) - 1, times d.
template <>
struct RgQuant<RG_TYPE_Q2_0> {
    static constexpr int QK = QK2_0, BYTES = sizeof(block_q2_0);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q2_0* b = (device const block_q2_0*)block;
        const float d = float(b->d);
        const uint bits = rg_q_u32(b->qs + 8 * part), bits2 = rg_q_u32(b->qs + 8 * part + 4);
        for (int j = 0; j < 16; ++j) {
            out[j] = d * float(int((bits >> (2 * j)) & 3) - 1);
            out[16 + j] = d * float(int((bits2 >> (2 * j)) & 3) - 1);
        }
    }
};

// ---- k-quants: 256-element super-blocks
// --------------------------------------------------------------------- Parts of the 2-bit layouts (Q2_K,
// Q3_K, TQ2_0): part c = 4h + k, element l from bits 2k of qs[32h + l].

// Q2_K: (d * (sc & 15)) * q - (dmin * (sc >> 4)) per 16; bias = -(dmin * m) (a - b == a + (-b)).
template <>
struct RgQuant<RG_TYPE_Q2_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q2_K);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q2_K* b = (device const block_q2_K*)block;
        const float d = float(b->d), dmin = float(b->dmin);
        device const uchar* qs = b->qs + 32 * (part >> 2);
        const int shift = 2 * (part & 3);
        for (int h = 0; h < 2; ++h) {
            const uint sc = b->scales[2 * part + h];
            const float scale = d * float(sc & 15), bias = -(dmin * float(sc >> 4));
            for (int l = 0; l < 16; ++l)
                out[16 * h + l] = scale * float((qs[16 * h + l] >> shift) & 3) + bias;
        }
    }
};

// Q3_K: d * (6-bit scale - 32) per 16; q = (low 2 bits | high bit << 2) - 4, the high bit of element
// 32c + l is bit c of hmask[l]. Scale s: low 4 bits are nibble s / 8 of scales[s % 8], high 2 bits are bits
// 2 (s / 4) of scales[8 + s % 4].
template <>
struct RgQuant<RG_TYPE_Q3_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q3_K);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q3_K* b = (device const block_q3_K*)block;
        const float d = float(b->d);
        device const uchar* qs = b->qs + 32 * (part >> 2);
        const int shift = 2 * (part & 3);
        for (int h = 0; h < 2; ++h) {
            const int s = 2 * part + h;
            const int lo = (b->scales[s & 7] >> (4 * (s >> 3))) & 15;
            const int hi = (b->scales[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
            const float scale = d * float((lo | (hi << 4)) - 32);
            for (int l = 16 * h; l < 16 * h + 16; ++l) {
                const int q = ((qs[l] >> shift) & 3) | (((b->hmask[l] >> part) & 1) << 2);
                out[l] = scale * float(q - 4);
            }
        }
    }
};

// Scale and min of 32-element group j of Q4_K / Q5_K: 6 bits each, packed in 12 bytes.
inline void rg_q_k_scale_min(device const uchar* s, int j, thread int& sc, thread int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K: (d * sc) * q - (dmin * m) per 32; part c takes nibble c % 2 of qs[32 (c / 2) + l].
template <>
struct RgQuant<RG_TYPE_Q4_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q4_K);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q4_K* b = (device const block_q4_K*)block;
        int sc, m;
        rg_q_k_scale_min(b->scales, part, sc, m);
        const float scale = float(b->d) * float(sc), bias = -(float(b->dmin) * float(m));
        device const uchar* qs = b->qs + 32 * (part >> 1);
        const int shift = 4 * (part & 1);
        for (int l = 0; l < 32; ++l) out[l] = scale * float((qs[l] >> shift) & 15) + bias;
    }
};

// Q5_K: as Q4_K with a 5th bit, bit c of qh[l].
template <>
struct RgQuant<RG_TYPE_Q5_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q5_K);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q5_K* b = (device const block_q5_K*)block;
        int sc, m;
        rg_q_k_scale_min(b->scales, part, sc, m);
        const float scale = float(b->d) * float(sc), bias = -(float(b->dmin) * float(m));
        device const uchar* qs = b->qs + 32 * (part >> 1);
        const int shift = 4 * (part & 1);
        for (int l = 0; l < 32; ++l) {
            const int q = ((qs[l] >> shift) & 15) | (((b->qh[l] >> part) & 1) << 4);
            out[l] = scale * float(q) + bias;
        }
    }
};

// Q6_K: (d * int8 scale) * (6-bit code - 32) per 16. Part c = 4h + k: low 4 bits are nibble k / 2 of
// ql[64h + 32 (k % 2) + l], high 2 bits are bits 2k of qh[32h + l].
template <>
struct RgQuant<RG_TYPE_Q6_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q6_K);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q6_K* b = (device const block_q6_K*)block;
        const float d = float(b->d);
        const int h = part >> 2, k = part & 3;
        device const uchar* ql = b->ql + 64 * h + 32 * (k & 1);
        device const uchar* qh = b->qh + 32 * h;
        const int lshift = 4 * (k >> 1), hshift = 2 * k;
        for (int g = 0; g < 2; ++g) {
            const float scale = d * float(b->scales[2 * part + g]);
            for (int l = 16 * g; l < 16 * g + 16; ++l) {
                const int q = ((ql[l] >> lshift) & 15) | (((qh[l] >> hshift) & 3) << 4);
                out[l] = scale * float(q - 32);
            }
        }
    }
};

// Q8_K: float d * int8 (ggml's activation type; d read as bytes, the block is only 2-byte aligned here).
template <>
struct RgQuant<RG_TYPE_Q8_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q8_K);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        const float d = as_type<float>(rg_q_u32(block));
        device const int8_t* qs = (device const int8_t*)(block + 4) + 32 * part;
        for (int l = 0; l < 32; ++l) out[l] = d * float(qs[l]);
    }
};

// ---- ternary
// ------------------------------------------------------------------------------------------------- TQ1_0: a
// byte holds 5 trits as a base-3 fraction scaled to 0..255; trit k = ((uint8(v * 3^k) * 3) >> 8) - 1.
// Elements 32k + l from qs[l] (k < 5: parts 0..4), 160 + 16k + l from qs[32 + l] (parts 5, 6 and the first
// half of 7), 240 + 4k + l from qh[l] (k < 4: the second half of part 7).
inline int rg_q_trit(uint v, uint k) {
    const uint pow3 = k < 4 ? (0x1b090301u >> (8 * k)) & 0xff : 81u;  // 3^k
    return int((((pow3 * v) & 0xff) * 3) >> 8) - 1;
}
template <>
struct RgQuant<RG_TYPE_TQ1_0> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_tq1_0);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_tq1_0* b = (device const block_tq1_0*)block;
        const float d = float(b->d);
        if (part < 5) {
            for (int l = 0; l < 32; ++l) out[l] = d * float(rg_q_trit(b->qs[l], uint(part)));
        } else if (part < 7) {
            for (int j = 0; j < 32; ++j)
                out[j] = d * float(rg_q_trit(b->qs[32 + (j & 15)], uint(2 * part - 10 + (j >> 4))));
        } else {
            for (int l = 0; l < 16; ++l) out[l] = d * float(rg_q_trit(b->qs[32 + l], 4));
            for (int j = 0; j < 16; ++j) out[16 + j] = d * float(rg_q_trit(b->qh[j & 3], uint(j >> 2)));
        }
    }
};

// TQ2_0: ((qs[32h + l] >> 2k) & 3) - 1, times d.
template <>
struct RgQuant<RG_TYPE_TQ2_0> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_tq2_0);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_tq2_0* b = (device const block_tq2_0*)block;
        const float d = float(b->d);
        device const uchar* qs = b->qs + 32 * (part >> 2);
        const int shift = 2 * (part & 3);
        for (int l = 0; l < 32; ++l) out[l] = d * float(int((qs[l] >> shift) & 3) - 1);
    }
};

// ---- i-quants
// ------------------------------------------------------------------------------------------------ IQ2_XXS:
// per 32 elements two uint32: 4 grid indices (bytes) | 4 x 7-bit ksigns indices + 4-bit scale s. gguf: db = d
// * (0.5 + s) * 0.25.
template <>
struct RgQuant<RG_TYPE_IQ2_XXS> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_iq2_xxs);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq2_xxs* b = (device const block_iq2_xxs*)block;
        device const uchar* idx = (device const uchar*)(b->qs + 4 * part);
        const uint aux = uint(b->qs[4 * part + 2]) | (uint(b->qs[4 * part + 3]) << 16);
        const float db = float(b->d) * (0.5f + float(aux >> 28)) * 0.25f;
        for (int k = 0; k < 4; ++k)
            rg_q_grid8((constant const uchar*)(rg_iq2xxs_grid + idx[k]), rg_ksigns[(aux >> (7 * k)) & 127],
                       db, out + 8 * k);
    }
};

// IQ2_XS: per 8 elements a uint16: 9-bit grid index | 7-bit ksigns index; 4-bit scales per 16.
// gguf: db = d * (0.5 + s) * 0.25.
template <>
struct RgQuant<RG_TYPE_IQ2_XS> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_iq2_xs);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq2_xs* b = (device const block_iq2_xs*)block;
        const float d = float(b->d);
        const uint sc = b->scales[part];
        for (int t = 0; t < 4; ++t) {
            const float db = d * (0.5f + float((sc >> (4 * (t >> 1))) & 15)) * 0.25f;
            const uint v = b->qs[4 * part + t];
            rg_q_grid8((constant const uchar*)(rg_iq2xs_grid + (v & 511)), rg_ksigns[v >> 9], db,
                       out + 8 * t);
        }
    }
};

// IQ2_S: 10-bit grid index = qs[t] | 2 bits of qh[t / 4]; sign bytes qs[32 + t]; 4-bit scales per 16.
// gguf: db = d * (0.5 + s) * 0.25.
template <>
struct RgQuant<RG_TYPE_IQ2_S> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_iq2_s);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq2_s* b = (device const block_iq2_s*)block;
        const float d = float(b->d);
        const uint sc = b->scales[part], qh = b->qh[part];
        for (int j = 0; j < 4; ++j) {
            const int t = 4 * part + j;
            const float db = d * (0.5f + float((sc >> (4 * (j >> 1))) & 15)) * 0.25f;
            const uint idx = b->qs[t] | (((qh >> (2 * j)) & 3) << 8);
            rg_q_grid8((constant const uchar*)(rg_iq2s_grid + idx), b->qs[32 + t], db, out + 8 * j);
        }
    }
};

// IQ3_XXS: 64 grid-index bytes (4 values each), then per 32 elements a uint32 of 4 x 7-bit ksigns indices +
// 4-bit scale s. gguf: db = d * (0.5 + s) * 0.5.
template <>
struct RgQuant<RG_TYPE_IQ3_XXS> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_iq3_xxs);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq3_xxs* b = (device const block_iq3_xxs*)block;
        const uint aux = rg_q_u32(b->qs + 64 + 4 * part);
        const float db = float(b->d) * (0.5f + float(aux >> 28)) * 0.5f;
        device const uchar* idx = b->qs + 8 * part;
        for (int k = 0; k < 4; ++k) {
            const uint signs = rg_ksigns[(aux >> (7 * k)) & 127];
            rg_q_grid4((constant const uchar*)(rg_iq3xxs_grid + idx[2 * k]), signs, db, out + 8 * k);
            rg_q_grid4((constant const uchar*)(rg_iq3xxs_grid + idx[2 * k + 1]), signs >> 4, db,
                       out + 8 * k + 4);
        }
    }
};

// IQ3_S: 9-bit grid index = qs[i] | bit i % 8 of qh[i / 8] (4 values each); sign bytes; 4-bit scales per 32.
// gguf: db = d * (1 + 2s).
template <>
struct RgQuant<RG_TYPE_IQ3_S> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_iq3_s);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq3_s* b = (device const block_iq3_s*)block;
        const float db = float(b->d) * float(1 + 2 * ((b->scales[part >> 1] >> (4 * (part & 1))) & 15));
        device const uchar* qs = b->qs + 8 * part;
        const uint qh = b->qh[part];
        for (int j = 0; j < 4; ++j) {
            const uint signs = b->signs[4 * part + j];
            const uint i0 = qs[2 * j] | (((qh >> (2 * j)) & 1) << 8);
            const uint i1 = qs[2 * j + 1] | (((qh >> (2 * j + 1)) & 1) << 8);
            rg_q_grid4((constant const uchar*)(rg_iq3s_grid + i0), signs, db, out + 8 * j);
            rg_q_grid4((constant const uchar*)(rg_iq3s_grid + i1), signs >> 4, db, out + 8 * j + 4);
        }
    }
};

// IQ1_S: per 32 elements a uint16 qh: 4 x 3 high index bits, 3-bit scale s, delta sign (bit 15).
// gguf: dl = d * (2s + 1); x = dl * (grid + delta); here (dl / 8) * (8 grid +- 1) (rg_q_iq1_8).
template <>
struct RgQuant<RG_TYPE_IQ1_S> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_iq1_s);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq1_s* b = (device const block_iq1_s*)block;
        const uint qh = b->qh[part];
        const float d8 = float(b->d) * float(2 * ((qh >> 12) & 7) + 1) * 0.125f;
        for (int k = 0; k < 4; ++k)
            rg_q_iq1_8(b->qs[4 * part + k] | (((qh >> (3 * k)) & 7) << 8), (qh & 0x8000) != 0, d8,
                       out + 8 * k);
    }
};

// IQ1_M: per 8 elements a nibble of qh: 3 high index bits + delta sign (bit 3); 3-bit scales per 16 in 4
// uint16 (bytes: this block has no aligned field), whose top nibbles together hold the fp16 super-block
// scale. gguf: dl = d * (2s + 1); x = dl * (grid + delta).
template <>
struct RgQuant<RG_TYPE_IQ1_M> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_iq1_m);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq1_m* b = (device const block_iq1_m*)block;
        const uint sc0 = rg_q_u16(b->scales), sc1 = rg_q_u16(b->scales + 2), sc2 = rg_q_u16(b->scales + 4),
                   sc3 = rg_q_u16(b->scales + 6);
        const float d = float(as_type<half>(
            ushort((sc0 >> 12) | ((sc1 >> 8) & 0x00f0) | ((sc2 >> 4) & 0x0f00) | (sc3 & 0xf000))));
        const uint sc = rg_q_u16(b->scales + 2 * (part >> 1)) >> (6 * (part & 1));  // scales 2c, 2c + 1
        for (int j = 0; j < 4; ++j) {
            const int t = 4 * part + j;
            const float d8 = d * float(2 * ((sc >> (3 * (j >> 1))) & 7) + 1) * 0.125f;
            const uint nib = (b->qh[t >> 1] >> (4 * (t & 1))) & 15;
            rg_q_iq1_8(b->qs[t] | ((nib & 7) << 8), (nib & 8) != 0, d8, out + 8 * j);
        }
    }
};

// IQ4_XS: 6-bit scales per 32 (low 4 bits in scales_l nibbles, high 2 in scales_h);
// gguf: dl = d * (s - 32); x = dl * kvalues[nibble].
template <>
struct RgQuant<RG_TYPE_IQ4_XS> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_iq4_xs);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_iq4_xs* b = (device const block_iq4_xs*)block;
        const int lo = (b->scales_l[part >> 1] >> (4 * (part & 1))) & 15;
        const int hi = (b->scales_h >> (2 * part)) & 3;
        rg_q_lookup32(b->qs + 16 * part, rg_kvalues_iq4nl, float(b->d) * float((lo | (hi << 4)) - 32), out);
    }
};

// ---- every weight type
// --------------------------------------------------------------------------------------- X(type id,
// lower-case GGUF name) for every type with an RgQuant: kernel files instantiate per-type kernels named
// rg_<op>_<name> from it; the host forms the names with metal_type_name() (csrc/metal/types.h).
// clang-format off
#define RG_METAL_WEIGHT_TYPES(X)                                                                            \
    X(RG_TYPE_F32, f32) X(RG_TYPE_F16, f16) X(RG_TYPE_BF16, bf16)                                           \
    X(RG_TYPE_Q4_0, q4_0) X(RG_TYPE_Q4_1, q4_1) X(RG_TYPE_Q5_0, q5_0) X(RG_TYPE_Q5_1, q5_1)                 \
    X(RG_TYPE_Q8_0, q8_0) X(RG_TYPE_Q8_K, q8_k)                                                             \
    X(RG_TYPE_Q2_K, q2_k) X(RG_TYPE_Q3_K, q3_k) X(RG_TYPE_Q4_K, q4_k) X(RG_TYPE_Q5_K, q5_k)                 \
    X(RG_TYPE_Q6_K, q6_k)                                                                                   \
    X(RG_TYPE_IQ1_S, iq1_s) X(RG_TYPE_IQ1_M, iq1_m) X(RG_TYPE_IQ2_XXS, iq2_xxs) X(RG_TYPE_IQ2_XS, iq2_xs)   \
    X(RG_TYPE_IQ2_S, iq2_s) X(RG_TYPE_IQ3_XXS, iq3_xxs) X(RG_TYPE_IQ3_S, iq3_s)                             \
    X(RG_TYPE_IQ4_NL, iq4_nl) X(RG_TYPE_IQ4_XS, iq4_xs)                                                     \
    X(RG_TYPE_TQ1_0, tq1_0) X(RG_TYPE_TQ2_0, tq2_0)                                                         \
    X(RG_TYPE_MXFP4, mxfp4) X(RG_TYPE_NVFP4, nvfp4) X(RG_TYPE_Q1_0, q1_0) X(RG_TYPE_Q2_0, q2_0)
// clang-format on
