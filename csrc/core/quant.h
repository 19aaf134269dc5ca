// Quantized block layouts: the one place they are defined.
//
// Included by C++ (csrc/), CUDA (csrc/cuda/) and Metal Shading Language (metal/), so it uses only
// fixed-width integer types, a half type (Metal's half; raw binary16 bits elsewhere) and static_assert.
// Layouts are byte-for-byte the ones GGUF files hold (ggml's), so a tensor's bytes can be reinterpreted as
// an array of these blocks.
// Type ids are the GGUF ggml_type ids.
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
typedef half rg_half;  // IEEE binary16 as stored
typedef ushort rg_bf16_bits;
#define RG_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#elif defined(RG_METAL_EMU)
// The Metal emulator compiles the kernels' copy of this header inside its namespace, where half is the
// host's binary16 (csrc/metal/emu/msl.h), so kernels read a block's scales as on Metal.
#include <stdint.h>
typedef half rg_half;
typedef uint16_t rg_bf16_bits;
#define RG_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
// C++ and CUDA: raw IEEE binary16 bits, converted with fp16_to_fp32() (CUDA kernels share the C++ block
// decoders, so a CUDA half here would convert by value).
#include <stdint.h>
typedef uint16_t rg_half;
typedef uint16_t rg_bf16_bits;
#ifdef __cplusplus
#define RG_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define RG_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#endif

// GGUF ggml_type ids (ggml.h). Ids 4 and 5 (Q4_2, Q4_3) and 31..33, 36..38 were removed upstream.
enum RgType {
    RG_TYPE_F32 = 0,
    RG_TYPE_F16 = 1,
    RG_TYPE_Q4_0 = 2,
    RG_TYPE_Q4_1 = 3,
    RG_TYPE_Q5_0 = 6,
    RG_TYPE_Q5_1 = 7,
    RG_TYPE_Q8_0 = 8,
    RG_TYPE_Q8_1 = 9,
    RG_TYPE_Q2_K = 10,
    RG_TYPE_Q3_K = 11,
    RG_TYPE_Q4_K = 12,
    RG_TYPE_Q5_K = 13,
    RG_TYPE_Q6_K = 14,
    RG_TYPE_Q8_K = 15,
    RG_TYPE_IQ2_XXS = 16,
    RG_TYPE_IQ2_XS = 17,
    RG_TYPE_IQ3_XXS = 18,
    RG_TYPE_IQ1_S = 19,
    RG_TYPE_IQ4_NL = 20,
    RG_TYPE_IQ3_S = 21,
    RG_TYPE_IQ2_S = 22,
    RG_TYPE_IQ4_XS = 23,
    RG_TYPE_I8 = 24,
    RG_TYPE_I16 = 25,
    RG_TYPE_I32 = 26,
    RG_TYPE_I64 = 27,
    RG_TYPE_F64 = 28,
    RG_TYPE_IQ1_M = 29,
    RG_TYPE_BF16 = 30,
    RG_TYPE_TQ1_0 = 34,
    RG_TYPE_TQ2_0 = 35,
    RG_TYPE_MXFP4 = 39,
    RG_TYPE_NVFP4 = 40,
    RG_TYPE_Q1_0 = 41,
    RG_TYPE_Q2_0 = 42,  // upstream ggml since 2026 (PR 24448); not yet in gguf-py 0.19
    RG_TYPE_COUNT = 43,
};

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK4_NL 32
#define QK_MXFP4 32
#define QK_NVFP4 64
#define QK_NVFP4_SUB 16
#define QK1_0 128
#define QK2_0 64
#define QK_K 256
#define K_SCALE_SIZE 12

// ---- legacy 32-element blocks -------------------------------------------------------------------
typedef struct {
    rg_half d;             // scale
    uint8_t qs[QK4_0 / 2]; // nibbles: element j in low nibble of qs[j], element j+16 in the high nibble
} block_q4_0;
RG_STATIC_ASSERT(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 size");

typedef struct {
    rg_half d;  // scale
    rg_half m;  // min
    uint8_t qs[QK4_1 / 2];
} block_q4_1;
RG_STATIC_ASSERT(sizeof(block_q4_1) == 4 + QK4_1 / 2, "block_q4_1 size");

typedef struct {
    rg_half d;
    uint8_t qh[4];  // 5th bit of each element, little-endian uint32
    uint8_t qs[QK5_0 / 2];
} block_q5_0;
RG_STATIC_ASSERT(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 size");

typedef struct {
    rg_half d;
    rg_half m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;
RG_STATIC_ASSERT(sizeof(block_q5_1) == 4 + 4 + QK5_1 / 2, "block_q5_1 size");

typedef struct {
    rg_half d;
    int8_t qs[QK8_0];
} block_q8_0;
RG_STATIC_ASSERT(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 size");

typedef struct {
    rg_half d;
    uint8_t qs[QK4_NL / 2];  // indices into the non-linear kvalues_iq4nl table
} block_iq4_nl;
RG_STATIC_ASSERT(sizeof(block_iq4_nl) == 2 + QK4_NL / 2, "block_iq4_nl size");

typedef struct {
    uint8_t e;               // E8M0 shared exponent
    uint8_t qs[QK_MXFP4 / 2]; // E2M1 codes
} block_mxfp4;
RG_STATIC_ASSERT(sizeof(block_mxfp4) == 1 + QK_MXFP4 / 2, "block_mxfp4 size");

typedef struct {
    uint8_t d[QK_NVFP4 / QK_NVFP4_SUB];  // UE4M3 scale per 16 elements
    uint8_t qs[QK_NVFP4 / 2];            // E2M1 codes, 8 bytes per 16-element sub-block
} block_nvfp4;
RG_STATIC_ASSERT(sizeof(block_nvfp4) == 4 + QK_NVFP4 / 2, "block_nvfp4 size");

typedef struct {
    rg_half d;
    uint8_t qs[QK1_0 / 8];  // one sign bit per element: 1 -> +d, 0 -> -d
} block_q1_0;
RG_STATIC_ASSERT(sizeof(block_q1_0) == 2 + QK1_0 / 8, "block_q1_0 size");

typedef struct {
    rg_half d;
    uint8_t qs[QK2_0 / 4];  // 2-bit codes c, element j at bits 2*(j%4) of qs[j/4]; value (c - 1) * d
} block_q2_0;
RG_STATIC_ASSERT(sizeof(block_q2_0) == 2 + QK2_0 / 4, "block_q2_0 size");

// ---- k-quants: 256-element super-blocks -----------------------------------------------------------
typedef struct {
    uint8_t scales[QK_K / 16];  // 4-bit scale | 4-bit min per 16 elements
    uint8_t qs[QK_K / 4];       // 2-bit codes
    rg_half d;                  // super-block scale for scales
    rg_half dmin;               // super-block scale for mins
} block_q2_K;
RG_STATIC_ASSERT(sizeof(block_q2_K) == 2 * 2 + QK_K / 16 + QK_K / 4, "block_q2_K size");

typedef struct {
    uint8_t hmask[QK_K / 8];  // high bit of each 3-bit code
    uint8_t qs[QK_K / 4];     // low 2 bits
    uint8_t scales[12];       // 16 6-bit scales
    rg_half d;
} block_q3_K;
RG_STATIC_ASSERT(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12, "block_q3_K size");

typedef struct {
    rg_half d;
    rg_half dmin;
    uint8_t scales[K_SCALE_SIZE];  // 8 6-bit scales and 8 6-bit mins
    uint8_t qs[QK_K / 2];
} block_q4_K;
RG_STATIC_ASSERT(sizeof(block_q4_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2, "block_q4_K size");

typedef struct {
    rg_half d;
    rg_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
RG_STATIC_ASSERT(sizeof(block_q5_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2 + QK_K / 8, "block_q5_K size");

typedef struct {
    uint8_t ql[QK_K / 2];      // low 4 bits
    uint8_t qh[QK_K / 4];      // high 2 bits
    int8_t scales[QK_K / 16];  // 8-bit scale per 16 elements
    rg_half d;
} block_q6_K;
RG_STATIC_ASSERT(sizeof(block_q6_K) == 2 + QK_K / 16 + 3 * QK_K / 4, "block_q6_K size");

typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];  // sum of qs per 16 elements
} block_q8_K;
RG_STATIC_ASSERT(sizeof(block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "block_q8_K size");

// ---- ternary ----------------------------------------------------------------------------------------
typedef struct {
    uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];  // 5 trits per byte (base-3, scaled to 0..255)
    uint8_t qh[QK_K / 64];                   // 4 trits per byte
    rg_half d;
} block_tq1_0;
RG_STATIC_ASSERT(sizeof(block_tq1_0) == 2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5, "block_tq1_0 size");

typedef struct {
    uint8_t qs[QK_K / 4];  // 2 bits per element, value - 1
    rg_half d;
} block_tq2_0;
RG_STATIC_ASSERT(sizeof(block_tq2_0) == 2 + QK_K / 4, "block_tq2_0 size");

// ---- i-quants (lattice codebooks; tables in quant_tables.h) ----------------------------------------
typedef struct {
    rg_half d;
    uint16_t qs[QK_K / 8];  // per 32 elements: 4 grid indices (8 bits) | 4x7 sign bits + 4-bit scale
} block_iq2_xxs;
RG_STATIC_ASSERT(sizeof(block_iq2_xxs) == 2 + QK_K / 8 * 2, "block_iq2_xxs size");

typedef struct {
    rg_half d;
    uint16_t qs[QK_K / 8];  // 9-bit grid index | 7-bit sign index
    uint8_t scales[QK_K / 32];
} block_iq2_xs;
RG_STATIC_ASSERT(sizeof(block_iq2_xs) == 2 + QK_K / 8 * 2 + QK_K / 32, "block_iq2_xs size");

typedef struct {
    rg_half d;
    uint8_t qs[QK_K / 4];  // first half: grid index low 8 bits; second half: sign bits
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
} block_iq2_s;
RG_STATIC_ASSERT(sizeof(block_iq2_s) == 2 + QK_K / 4 + QK_K / 16, "block_iq2_s size");

typedef struct {
    rg_half d;
    uint8_t qs[3 * QK_K / 8];  // grid indices, then per 32 elements 4x7 sign bits + 4-bit scale
} block_iq3_xxs;
RG_STATIC_ASSERT(sizeof(block_iq3_xxs) == 2 + 3 * QK_K / 8, "block_iq3_xxs size");

#define IQ3S_N_SCALE (QK_K / 64)
typedef struct {
    rg_half d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[IQ3S_N_SCALE];
} block_iq3_s;
RG_STATIC_ASSERT(sizeof(block_iq3_s) == 2 + 13 * (QK_K / 32) + IQ3S_N_SCALE, "block_iq3_s size");

typedef struct {
    rg_half d;
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32];  // grid index high bits, 3-bit scale, delta sign
} block_iq1_s;
RG_STATIC_ASSERT(sizeof(block_iq1_s) == 2 + QK_K / 8 + QK_K / 16, "block_iq1_s size");

typedef struct {
    uint8_t qs[QK_K / 8];      // grid index low 8 bits
    uint8_t qh[QK_K / 16];     // grid index high 3 bits + delta sign, per 8 elements
    uint8_t scales[QK_K / 32]; // 3-bit scales; the fp16 super-block scale is spread over the top nibbles
} block_iq1_m;
RG_STATIC_ASSERT(sizeof(block_iq1_m) == QK_K / 8 + QK_K / 16 + QK_K / 32, "block_iq1_m size");

typedef struct {
    rg_half d;
    uint16_t scales_h;              // high 2 bits of 8 6-bit scales
    uint8_t scales_l[QK_K / 64];    // low 4 bits
    uint8_t qs[QK_K / 2];           // indices into kvalues_iq4nl
} block_iq4_xs;
RG_STATIC_ASSERT(sizeof(block_iq4_xs) == 2 + 2 + QK_K / 64 + QK_K / 2, "block_iq4_xs size");
