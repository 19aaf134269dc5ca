// The one order in which the CUDA backend sums a product of float weights (F32 / F16 / BF16) with f32
// activations: matmul's float products and the resident experts' both call float_row_dot, so a row's result
// depends on the row and the token only (the Backend's matmul contract) and the streamed and resident
// paths agree bit for bit.
#pragma once

#include "cuda/common.cuh"

namespace regolith::cuda {

constexpr int kFloatTok = 8;  // tokens per call

// Row `row` (cols elements of `type`) times the token rows xrow(t) (const float*), t < ntok <= kFloatTok, by a
// block of 128 threads: warp w sums the columns of its 128-column steps w, w + 4, ... (4 consecutive columns
// per lane, in order), its lanes are added by warp_sum, and the 4 warps' sums in warp order. Thread t < ntok
// gets token t's result (the others: 0). Every thread of the block must call it.
template <class XRow>
__device__ inline float float_row_dot(const uint8_t* row, uint32_t type, int64_t cols, int ntok, XRow xrow) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float acc[kFloatTok] = {};
#pragma unroll 2
    for (int64_t c0 = 128 * warp + 4 * lane; c0 < cols; c0 += 512) {
        float wc[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) wc[i] = c0 + i < cols ? load_float(row, c0 + i, type) : 0.0f;
#pragma unroll
        for (int t = 0; t < kFloatTok; ++t) {
            if (t >= ntok) break;
            const float* xr = xrow(t);
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (c0 + i < cols) acc[t] += wc[i] * xr[c0 + i];
        }
    }
    __shared__ float part[4][kFloatTok];
#pragma unroll
    for (int t = 0; t < kFloatTok; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) part[warp][t] = v;
    }
    __syncthreads();
    const int t = int(threadIdx.x);
    const float out = t < ntok ? ((part[0][t] + part[1][t]) + part[2][t]) + part[3][t] : 0.0f;
    __syncthreads();  // part[] may be reused by a later call
    return out;
}

}  // namespace regolith::cuda
