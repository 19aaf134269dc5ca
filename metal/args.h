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
