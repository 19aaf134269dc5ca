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
