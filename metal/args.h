// Kernel argument structs, shared by the host (csrc/metal/) and the kernels (metal/*.metal): one definition,
// the same layout in C++ and the Metal Shading Language (fixed-width fields, sizes asserted).
#pragma once

#if !defined(__METAL_VERSION__)
#include <stdint.h>
#endif

// A tensor as a kernel sees it: `rows` rows of `cols` elements of GGUF type `type`, row r at `stride * r`
// bytes from the bound address.
struct RgShape {
    int64_t rows;
    int64_t cols;
    int64_t stride;
    uint32_t type;
    uint32_t pad;
};
static_assert(sizeof(RgShape) == 32, "RgShape layout");

// copy / zero: `rows` rows of `row_bytes` bytes.
struct RgCopyArgs {
    int64_t rows;
    int64_t row_bytes;
    int64_t src_stride;
    int64_t dst_stride;
};
static_assert(sizeof(RgCopyArgs) == 32, "RgCopyArgs layout");

// Norms (norm.metal): y = norm(x) with optional weights w, bias b (layer_norm) and gate z (rms_norm_gated,
// act: 0 silu, 1 sigmoid).
struct RgNormArgs {
    RgShape x, z, w, b, y;
    float eps;
    uint32_t act;
    uint32_t has_w;
    uint32_t pad;
};
static_assert(sizeof(RgNormArgs) == 176, "RgNormArgs layout");

// ---- rows (rows.metal) ---------------------------------------------------------------------------------------
// get_rows: out row i = dequantized table row ids[i] times scale (when scale != 1), `repeat` times side by side.
struct RgGetRowsArgs {
    RgShape table, ids, out;
    int64_t repeat;
    float scale;
    uint32_t pad;
};
static_assert(sizeof(RgGetRowsArgs) == 112, "RgGetRowsArgs layout");

// gather_rows: out[i] = x[rows[i]].
struct RgGatherRowsArgs {
    RgShape x, rows, out;
};
static_assert(sizeof(RgGatherRowsArgs) == 96, "RgGatherRowsArgs layout");

// One pass of top_k over `n` entries per row: the columns of x (from_cand 0) or candidate pairs (from_cand 1,
// rows of n (value, column) pairs), k largest per chunk of the row, written as candidate pairs (to_cand 1,
// rows of chunks * k pairs) or, by the last pass, to ids / values.
struct RgTopKArgs {
    RgShape x, ids, values;
    int64_t n;
    int64_t k;
    uint32_t from_cand;
    uint32_t to_cand;
    uint32_t has_ids;
    uint32_t has_values;
};
static_assert(sizeof(RgTopKArgs) == 128, "RgTopKArgs layout");

// ---- products and mixture of experts (metal/matmul.metal, metal/moe.metal) --------------------------------

// The product tiles (metal/matmul.metal): RG_MM_ROWS weight rows x a decode (ntok <= RG_MM_DECODE_TOKENS)
// or prefill token tile, K staged in chunks of _KC; threadgroup memory as RG_MM_SHMEM gives it.
#define RG_MM_THREADS 128
#define RG_MM_ROWS 32
#define RG_MM_DECODE_TOKENS 8
#define RG_MM_DECODE_KC 128
#define RG_MM_PREFILL_TOKENS 32
#define RG_MM_PREFILL_KC 64
#define RG_MM_SHMEM(tokens, kc) (((RG_MM_ROWS + (tokens)) * ((kc) + 4) + 2 * (tokens)) * 4)

// One product of a batch (rg_matmul_<type>): weight rows [0, rows) at w_off (bytes from the weight
// binding, rows w_stride bytes apart, cols elements each) times the ntok packed f32 rows [ntok][cols] at
// x_off, into y[t][r] at y_off (rows of y_ld floats). Its threadgroups: [tile0, tile0 + row_tiles * token
// tiles).
struct RgMatmulJob {
    int64_t w_off, x_off, y_off;
    int64_t w_stride;
    uint32_t rows, cols, ntok, y_ld;
    uint32_t tile0, row_tiles;
    uint32_t pad0, pad1;
};
static_assert(sizeof(RgMatmulJob) == 64, "RgMatmulJob layout");

#define RG_MATMUL_MAX_JOBS 32
struct RgMatmulArgs {
    uint32_t n_jobs, n_tiles;  // jobs in order of tile0; threadgroups in all
    uint32_t decode;           // the decode tile (every job's ntok <= RG_MM_DECODE_TOKENS), else prefill
    uint32_t pad0;
    RgMatmulJob jobs[RG_MATMUL_MAX_JOBS];
};
static_assert(sizeof(RgMatmulArgs) == 16 + 64 * RG_MATMUL_MAX_JOBS, "RgMatmulArgs layout");

// The grouped products of moe_experts (rg_moe_matmul_<type>): expert e's rows [e * n, (e + 1) * n) of the
// stacked weight (w_stride bytes apart, cols elements) times its grouped rows; x rows x_ld floats apart (row
// order[i] / k of grouped row i, or row i where k is 0), y rows y_ld floats apart (row i). The grid: row
// tiles x (slots * tok_tiles).
struct RgMoeMatmulArgs {
    int64_t w_stride, n, cols, x_ld, y_ld;
    uint32_t n_expert, k;
    uint32_t slots, tok_tiles;
    uint32_t decode;  // the decode tile, else prefill
    uint32_t pad0;
};
static_assert(sizeof(RgMoeMatmulArgs) == 64, "RgMoeMatmulArgs layout");

// The routing pairs p = t * k + j of ids [ntok][k] grouped by expert (rg_moe_group), into n_expert + 1
// offsets, 1 + n_expert active experts (their count, then their ids ascending) and the pairs in that order.
struct RgMoeGroupArgs {
    RgShape ids;
    uint32_t n_expert;
    uint32_t pad0, pad1, pad2;
};
static_assert(sizeof(RgMoeGroupArgs) == 48, "RgMoeGroupArgs layout");

// moe_route: softmax of logits rows, the top k (the first `keep` by probability, the rest by score = logit +
// bonus for resident experts), weights renormalised when norm_topk.
struct RgMoeRouteArgs {
    RgShape logits, ids, weights;
    uint32_t k, keep, norm_topk, has_resident;
    float bonus;
    uint32_t pad0, pad1, pad2;
};
static_assert(sizeof(RgMoeRouteArgs) == 128, "RgMoeRouteArgs layout");

// out = silu(g) * u, row by row.
struct RgMoeSwigluArgs {
    RgShape g, u, out;
};
static_assert(sizeof(RgMoeSwigluArgs) == 96, "RgMoeSwigluArgs layout");

// moe_combine: y[t] = sum over the rows i with pairs[i] / k = t, in row order, of weights[t][pairs[i] % k] *
// ys[i] (+ sigmoid(shared_gate[t][0]) * shared[t]); n_rows pairs (negative ones name no token).
struct RgMoeCombineArgs {
    RgShape ys, weights, shared, shared_gate, y;
    uint32_t n_rows, k, has_shared, pad0;
};
static_assert(sizeof(RgMoeCombineArgs) == 176, "RgMoeCombineArgs layout");
