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

// ---- attention: dense (attention.metal, csrc/metal/attention.cpp) and QSA (qsa.metal, csrc/metal/qsa.cpp) ----

// kv_append of one sequence: k, v [ntok][n_head_kv * head_dim] (rows t0..) into its caches kc
// [n_head_kv * cap][head_dim] and vt [n_head_kv * head_dim][cap] at positions n0...
struct RgKvAppendArgs {
    RgShape k, v, kc, vt;
    int64_t t0, ntok, n0, cap;
    int32_t n_head_kv, head_dim;
    uint32_t pad[2];
};
static_assert(sizeof(RgKvAppendArgs) == 176, "RgKvAppendArgs layout");

// Causal GQA attention of one sequence: q [ntok][n_head * head_dim] (rows t0..) at positions n0.. over its
// caches k [n_head_kv * cap][head_dim], vt [n_head_kv * head_dim][cap]; keys split n_split ways.
struct RgAttentionArgs {
    RgShape q, k, vt, out;
    int64_t t0, ntok, n0, cap, window;
    int32_t n_head, n_head_kv, head_dim, n_split;
    float scale;
    uint32_t pad;
};
static_assert(sizeof(RgAttentionArgs) == 192, "RgAttentionArgs layout");

// The merge of key splits (dense and QSA attention): part [ntok * n_head][n_split][2 + head_dim] (max score
// m, sum of exponentials l, weighted values o) -> out, times sigmoid(gate) when has_gate. Head h of token t
// is row (t0 + t) * n_head / heads_per_row + h / heads_per_row of out (and gate), columns from
// (h % heads_per_row) * head_dim.
struct RgAttnMergeArgs {
    RgShape out, gate;
    int64_t t0;
    int32_t n_head, heads_per_row, head_dim, n_split;
    uint32_t has_gate, pad;
};
static_assert(sizeof(RgAttnMergeArgs) == 96, "RgAttnMergeArgs layout");

// qsa_pool of one sequence: blocks b0 + tgpig.x.
struct RgQsaPoolArgs {
    RgShape index_k, block_k, pos, norm, freq, axis;
    int64_t b0;
    int32_t ratio, index_head_dim, n_rot, pad;
    float eps;
    uint32_t pad2;
};
static_assert(sizeof(RgQsaPoolArgs) == 224, "RgQsaPoolArgs layout");

// qsa_select of one sequence: scores [ntok][nb_stride] (device scratch), then sel / n_sel.
struct RgQsaSelectArgs {
    RgShape iq, block_k, sel, n_sel;
    int64_t t0, ntok, n0, nb_stride;
    int32_t ratio, topk, index_n_head, index_head_dim;
    float index_scale;
    uint32_t pad;
};
static_assert(sizeof(RgQsaSelectArgs) == 184, "RgQsaSelectArgs layout");

// qsa_attend of one sequence: q, gate, out rows (t0 + t) * n_head + h; keys split n_split ways.
struct RgQsaAttendArgs {
    RgShape q, gate, sel, n_sel, k, v, out;
    int64_t t0, ntok, n0;
    int32_t n_head, n_head_kv, head_dim, ratio, n_split;
    float scale;
};
static_assert(sizeof(RgQsaAttendArgs) == 272, "RgQsaAttendArgs layout");
