// CPU matrix products: the per-ISA kernel tables behind cpu_backend().matmul.
//
// Quantized weights multiply int8-quantized activations (Q8: one float scale per 32 elements, as ggml's
// vec_dot does): each weight block is decoded once by its BlockDecoder into int8 codes and per-group
// scales, then dotted with every token's activations in integer arithmetic. Float weights (F32, F16, BF16)
// multiply float activations directly.
#pragma once

#include <cstdint>

#include "core/quant.h"

namespace regolith::cpu {

// Activations of ntok tokens prepared once per matmul: float copy and Q8 quantization.
struct MatmulArgs {
    const uint8_t* w;    // weight rows
    int64_t row_bytes;
    int64_t rows;
    int64_t cols;
    int64_t ntok;
    const float* x;      // [ntok][cols] float activations
    const int8_t* xq;    // [ntok][cols] int8 codes (quantized types only)
    const float* xd;     // [ntok][cols / act_block] scale per activation block (32 or 128 codes)
    const float* xs;     // [ntok][cols / 16] float sum of x per 16 elements (for affine-bias types)
    const uint8_t* xu;   // [ntok][cols] xq + 128 (kernels of the offset form: KernelTable::act_offset)
    float* y;            // [ntok][rows]
};

// Per-thread working memory, owned by the caller: kernel translation units compiled with ISA flags must
// not instantiate standard-library code (the linker could hand their copies to the portable path).
struct Scratch {
    int8_t* q;        // [kPanelRows][cols] decoded codes
    float* scale;     // [kPanelRows][cols / 16]
    float* bias;      // [kPanelRows][cols / 16]
    int16_t* isc;     // [kPanelRows][cols / 16] integer sub-scales (IntScales types)
    float* dsuper;    // [kPanelRows][cols / 256] their per-block float factor
    float* row;       // [cols] a float weight row
    float* panel;     // [kPanelRows][cols] float weight rows (float-weight prefill)
    float* acc;       // [kPanelRows / 2][kTileTokens / 3][kTileAcc] float-tile partial sums
    float* xdt;       // [cols / 128][kMaxTok] a token group's activation scales, by block then token
};

// Tokens processed together per pass over a weight row: every decoded block is used ntok times.
constexpr int kMaxTok = 8;
// Rows decoded together into a panel when ntok > kMaxTok (prefill): each weight block is decoded once and
// the panel (kPanelRows x cols int8, L2-resident) is reused by every token.
constexpr int64_t kPanelRows = 16;
// How far ahead of the block being decoded the kernels prefetch weights (matmul_impl.h, prefetch_weights):
// rows are contiguous, so this runs into the next row and past the matrix's end (harmless: prefetches do
// not fault). Chosen per CPU vendor (matmul_run.cpp) from one thread's decode products: 2048 bytes, the
// best of 512-4096 on a Xeon (Sapphire Rapids class); 8192 on AMD, the best of 1024-32768 on an EPYC
// (Zen 5), where 2048 left a Q8_0 matvec at 14-17 of the 37 GB/s one thread reads (33-34 at 8192).
int64_t choose_prefetch_bytes();
inline const int64_t prefetch_bytes = choose_prefetch_bytes();
// Float-weight prefill tiles (2 rows x 3 tokens): tokens per block, columns per pass, and the floats of one
// tile's partial sums (2 x 3 outputs x 16 lanes).
constexpr int64_t kTileTokens = 48;
constexpr int64_t kTileCols = 1024;
constexpr int64_t kTileAcc = 2 * 3 * 16;

// Computes output rows [r0, r1) for all tokens.
using RowsKernel = void (*)(const MatmulArgs& args, int64_t r0, int64_t r1, const Scratch& scratch);

struct KernelTable {
    RowsKernel by_type[RG_TYPE_COUNT];  // nullptr: type not supported
    int act_block[RG_TYPE_COUNT];       // activation quantization block the kernel expects: 32 or 128
    bool act_offset[RG_TYPE_COUNT];     // the kernel also reads the codes + 128 (MatmulArgs::xu)
    RowsKernel exact_by_type[RG_TYPE_COUNT];  // float-activation kernels (set_exact_activations)
    // Q8 activation quantization (see quantize_activations), the ISA's version; identical results.
    void (*quantize)(const float* x, int64_t n, int block, int8_t* q, float* d, float* s);
};

// Exact mode (regolith::exact_activations(), core/backend.h): quantized weights are dequantized and
// multiplied with float activations instead of int8 ones.

const KernelTable& kernels_scalar();
#if defined(RG_HAVE_AVX2)
const KernelTable& kernels_avx2();
#endif
#if defined(RG_HAVE_AVXVNNI)
const KernelTable& kernels_avxvnni();
#endif
#if defined(RG_HAVE_AVX512)
const KernelTable& kernels_avx512();
#endif
#if defined(RG_HAVE_NEON)
const KernelTable& kernels_neon();
#endif
#if defined(RG_HAVE_NEONDOT)
const KernelTable& kernels_neondot();
#endif

// The activation block the active ISA's kernel for `type` expects (32 or 128; 0 for unsupported types).
int activation_block(uint32_t type);

// Q8 activation quantization of one row of n elements (n % block == 0, block 32 or 128): codes q[n],
// scale d[n / block] (amax / 127 per block), sums s[n / 16] of the quantized x per 16 elements.
void quantize_activations(const float* x, int64_t n, int block, int8_t* q, float* d, float* s);

// The sums of quantize_activations: s[g] = d * (sum of the 16 codes of group g), the quantized x's and not
// x's own, as llama.cpp's q8_1 / q8_K `bsums`: a block's bias term then sees the same activation as its
// scale term, so for x = scale * q + bias the product is W . x_quantized and its rounding error scales with
// |W|. With x's exact sums the error of the scale term (whose codes are all of one sign, |scale * q| up to
// twice |W|) is left uncancelled: measured on Gemma 3 270M's Q4_K products, 2.7x the KL divergence.
void activation_sums(const int8_t* q, const float* d, int64_t n, int block, float* s);

}  // namespace regolith::cpu
