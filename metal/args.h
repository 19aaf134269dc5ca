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

// ---- elementwise (elementwise.metal), rotary embeddings (rope.metal), vision tower (vision.metal) ----------

// unary: y = f(x) with parameter p (Backend::unary).
struct RgUnaryArgs {
    RgShape x, y;
    float p;
    uint32_t pad[3];
};
static_assert(sizeof(RgUnaryArgs) == 80, "RgUnaryArgs layout");

// Two inputs, one output: glu (a gate, b up), add (b.stride 0 for one row added to every row), hc_mix (a gate,
// b xn, y mixed) and hc_write (a out, b w, y streams) over hc streams.
struct RgBinaryArgs {
    RgShape a, b, y;
    int64_t hc;
    int64_t pad;
};
static_assert(sizeof(RgBinaryArgs) == 112, "RgBinaryArgs layout");

// rope_table (pos, freq, axis -> table) and rope (x rotated by table row r / rows_per_pos).
struct RgRopeArgs {
    RgShape pos, freq, axis, table, x;
    int64_t rows_per_pos;
    int64_t pad;
};
static_assert(sizeof(RgRopeArgs) == 176, "RgRopeArgs layout");

// add_interpolated: x[r] += sum_j w[r][j] * table[idx[r][j]].
struct RgInterpArgs {
    RgShape table, idx, w, x;
};
static_assert(sizeof(RgInterpArgs) == 128, "RgInterpArgs layout");

// vision_qkv: qkv [n][3 * n_head * head_dim] -> q, k [n_head * n][hp], vt [n_head * head_dim][n].
struct RgVisionQkvArgs {
    RgShape qkv, table, q, k, vt;
    int64_t n_head;
    int64_t pad;
};
static_assert(sizeof(RgVisionQkvArgs) == 176, "RgVisionQkvArgs layout");

// softmax_scaled: each row of x <- softmax(scale * x).
struct RgSoftmaxArgs {
    RgShape x;
    float scale;
    uint32_t pad[3];
};
static_assert(sizeof(RgSoftmaxArgs) == 48, "RgSoftmaxArgs layout");
