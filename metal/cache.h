// Attention caches (Backend::store_rows): rows of F32, F16, Q8_0 (core/quant.h's block_q8_0) or I8 (int8
// codes, the row's f32 scale in a [rows][1] tensor beside the cache), read element by element as floats and
// stored from floats, both bit for bit as the CPU's (csrc/cpu/cache.cpp, core/quantize.cpp). The cache type
// is the shape's `type`, the same for every thread of a dispatch, so its branches do not diverge.
#pragma once

#include "compat.h"

#include "args.h"
#include "common.h"
#include "core/quant.h"

// Row r of a cache bound at `base` with shape s; `scale` / ss: an I8 cache's scales (unused otherwise).
struct RgCacheRow {
    device const char* p;
    uint type;
    float s;  // I8: the row's scale
};
inline RgCacheRow rg_cache_row(device const char* base, constant RgShape& s, device const char* scale,
                               constant RgShape& ss, int64_t r) {
    RgCacheRow c;
    c.p = base + r * s.stride;
    c.type = s.type;
    c.s = s.type == RG_TYPE_I8 ? rg_row<float>(scale, ss, r)[0] : 0.0f;
    return c;
}

// Element i of a cache row: the f32 the CPU's dequantizer gives (an f16 widened, a Q8_0 block's scale times
// the code, an I8 code times the row's scale).
inline float rg_cache_at(RgCacheRow c, int i) {
    switch (c.type) {
        case RG_TYPE_F16:
            return float(((device const half*)c.p)[i]);
        case RG_TYPE_Q8_0: {
            device const block_q8_0* b = (device const block_q8_0*)c.p + i / QK8_0;
            return float(b->d) * float(b->qs[i % QK8_0]);
        }
        case RG_TYPE_I8:
            return float(((device const int8_t*)c.p)[i]) * c.s;
        default:
            return ((device const float*)c.p)[i];
    }
}

// tile[i][j] = element c0 + j of cache row r0 + i as T, for i < 8, j < w; 0 for rows from r_end. Filled by
// the 32 lanes of a SIMD-group, for a simdgroup_load once the SIMD-group has passed a simdgroup_barrier.
template <typename T>
inline void rg_cache_tile(threadgroup T* tile, int w, device const char* base, constant RgShape& s,
                          device const char* scale, constant RgShape& ss, int64_t r0, int64_t r_end, int c0,
                          uint tiisg) {
    for (int e = int(tiisg); e < 8 * w; e += 32) {
        const int64_t r = r0 + e / w;
        tile[e] = T(r < r_end ? rg_cache_at(rg_cache_row(base, s, scale, ss, r), c0 + e % w) : 0.0f);
    }
}

// max(m, a) for a = |x| >= 0 that keeps a NaN once seen (numpy's amax, the CPU quantizers' scale).
inline float rg_amax_step(float m, float a) { return isnan(a) || a > m ? a : m; }
// The amax of the SIMD-group's lanes' m: NaN (numpy's default NaN) where any lane's is.
inline float rg_simd_amax(float m) {
    return simd_max(isnan(m) ? 1u : 0u) != 0u ? as_type<float>(0x7fc00000u) : simd_max(m);
}
// A rounded code as numpy casts it to int8 (the CPU's np_cast_u8): the low byte of the int32, 0 for NaN, inf
// and values outside int32.
inline int8_t rg_code_i8(float v) { return abs(v) < 2147483648.0f ? int8_t(int(v)) : int8_t(0); }

// Stores x[0..n) as row r of a cache (and an I8 row's scale): F32 copied, F16 rounded to nearest even, Q8_0
// per block of 32 d = max|x| / 127 (stored as f16), q = round(x * (1 / d)), I8 the same over the whole row
// with s in scale row r; a zero block or row has scale 0 and codes 0. Called by every lane of one SIMD-group;
// x is device or threadgroup memory.
template <typename P>
inline void rg_cache_store(device char* base, constant RgShape& s, device char* scale, constant RgShape& ss,
                           int64_t r, P x, int n, uint tiisg) {
    device char* row = base + r * s.stride;
    const int l = int(tiisg);
    if (s.type == RG_TYPE_F32) {
        for (int i = l; i < n; i += 32) ((device float*)row)[i] = x[i];
    } else if (s.type == RG_TYPE_F16) {
        for (int i = l; i < n; i += 32) ((device half*)row)[i] = half(x[i]);
    } else if (s.type == RG_TYPE_Q8_0) {
        for (int b = 0; b < n / QK8_0; ++b) {
            const float v = x[b * QK8_0 + l];
            const float d = rg_simd_amax(abs(v)) / 127.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
            device block_q8_0* blk = (device block_q8_0*)row + b;
            blk->qs[l] = rg_code_i8(round(v * id));
            if (l == 0) blk->d = half(d);
        }
    } else {  // I8
        float m = 0.0f;
        for (int i = l; i < n; i += 32) m = rg_amax_step(m, abs(x[i]));
        const float d = rg_simd_amax(m) / 127.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
        for (int i = l; i < n; i += 32) ((device int8_t*)row)[i] = rg_code_i8(round(x[i] * id));
        if (l == 0) rg_row<float>(scale, ss, r)[0] = d;
    }
}
