// Attention caches in their storage types (Backend::store_rows): F32, F16, Q8_0 (llama.cpp's blocks) and I8
// (int8 rows, one f32 scale per row in a [rows][1] tensor). Reads dequantize an element to f32 as the CPU's
// cache_row does (the same float products); a warp stores a row as the CPU's quantizers do (core/quantize.cpp:
// the scale max|x| / 127, codes round(x * (1 / scale)), half away from zero), bit for bit.
#pragma once

#include <cuda_fp16.h>

#include "core/quant.h"
#include "cuda/common.cuh"

namespace regolith::cuda {

// Element c of row r of cache t (scale: an I8 cache's row scales, else empty), as f32.
__device__ inline float cache_elem(const View& t, const View& scale, int64_t r, int64_t c) {
    switch (t.type) {
        case RG_TYPE_F16:
            return __half2float(t.row<const __half>(r)[c]);
        case RG_TYPE_Q8_0: {
            const block_q8_0& b = t.row<const block_q8_0>(r)[c / QK8_0];
            return fp16_to_fp32(b.d) * float(b.qs[c % QK8_0]);
        }
        case RG_TYPE_I8:
            return float(t.row<const int8_t>(r)[c]) * scale.row(r)[0];
        default:
            return t.row(r)[c];
    }
}

// The code of x with scale d (d == 0: every code 0).
__device__ inline int8_t cache_code(float x, float d) {
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    return int8_t(int(roundf(__fmul_rn(x, id))));
}

// Row r of cache t := x[0, t.cols) (f32, global or shared memory), by the 32 lanes of one warp.
__device__ inline void cache_store_row(const float* x, const View& t, const View& scale, int64_t r) {
    const int lane = threadIdx.x & 31;
    const int64_t n = t.cols;
    switch (t.type) {
        case RG_TYPE_F16:
            for (int64_t c = lane; c < n; c += 32) t.row<__half>(r)[c] = __float2half_rn(x[c]);
            return;
        case RG_TYPE_Q8_0:
            for (int64_t b = 0; b < n / QK8_0; ++b) {  // a block per step, lane = element
                const float v = x[b * QK8_0 + lane], d = warp_max(fabsf(v)) / 127.0f;
                block_q8_0& out = t.row<block_q8_0>(r)[b];
                out.qs[lane] = cache_code(v, d);
                if (lane == 0) out.d = __half_as_ushort(__float2half_rn(d));
            }
            return;
        case RG_TYPE_I8: {
            float m = 0.0f;
            for (int64_t c = lane; c < n; c += 32) m = fmaxf(m, fabsf(x[c]));
            const float d = warp_max(m) / 127.0f;
            for (int64_t c = lane; c < n; c += 32) t.row<int8_t>(r)[c] = cache_code(x[c], d);
            if (lane == 0) scale.row(r)[0] = d;
            return;
        }
        default:
            for (int64_t c = lane; c < n; c += 32) t.row(r)[c] = x[c];
    }
}

}  // namespace regolith::cuda
