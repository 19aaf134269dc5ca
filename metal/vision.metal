// The vision tower's own ops (Backend::add_interpolated, vision_qkv, softmax_scaled); its GELUs are unary ops
// (elementwise.metal).
//
// add_interpolated: threadgroup (x, y) takes every tgpg.x-th stretch of ntg columns of row y, a thread per
// column: each thread reads the row's 4 indices and weights (the same for the whole threadgroup, cached) and
// 4 table rows at its column (coalesced across a SIMD-group); the 4 taps are added in order from 0, as the
// CPU.
//
// vision_qkv: threadgroup (x, h) takes 32 tokens (32 x ..) of head h, 8 SIMD-groups. q and k: a SIMD-group
// per token row, lanes over the hp output columns (rotated pairs j, j + hd/2, then zeros), so reads and
// writes are coalesced. v is transposed through threadgroup memory, 32 dims at a time: read as [32 tokens][32
// dims] (lanes along dims), written as vt rows of 32 consecutive tokens (lanes along tokens), coalesced both
// ways; the tile's rows are padded to 33 floats so the column reads hit 32 different banks. 4.2 KiB of
// threadgroup memory whatever the head size.
//
// softmax_scaled: a threadgroup per row (whole SIMD-groups, up to 256 threads striding over the row): the max
// of scale * x, e^(scale x - max) written in place, their sum, then the scaling. The CPU sums in double (8
// lanes); Metal has no double: each thread's float partial sum (n / ntg terms) then a tree across the
// threadgroup (simd_sum, rg_group_sum), relative error <= (n / ntg + 8) eps, a few 1e-7 for the rows of a
// frame (thousands of patches), far inside the reduction tolerance. The max is exact in any order. e^x is
// Metal's precise exp (the CPU's exp_nonpos: both within a few ulp).
#include "compat.h"

#include "args.h"
#include "common.h"

kernel void rg_add_interpolated(constant RgInterpArgs& a [[buffer(0)]],
                                device const char* table [[buffer(1)]], device const char* idx [[buffer(2)]],
                                device const char* w [[buffer(3)]], device char* x [[buffer(4)]],
                                RG_THREAD_IDS) {
    const int64_t r = tgpig.y;
    device const int32_t* ir = rg_row<int32_t>(idx, a.idx, r);
    device const float* wr = rg_row<float>(w, a.w, r);
    device const float* t0 = rg_row<float>(table, a.table, ir[0]);
    device const float* t1 = rg_row<float>(table, a.table, ir[1]);
    device const float* t2 = rg_row<float>(table, a.table, ir[2]);
    device const float* t3 = rg_row<float>(table, a.table, ir[3]);
    const float w0 = wr[0], w1 = wr[1], w2 = wr[2], w3 = wr[3];
    device float* xr = rg_row<float>(x, a.x, r);
    for (int64_t d = int64_t(tgpig.x) * ntg + tiitg; d < a.x.cols; d += int64_t(tgpg.x) * ntg) {
        float pos = 0.0f;
        pos += t0[d] * w0;
        pos += t1[d] * w1;
        pos += t2[d] * w2;
        pos += t3[d] * w3;
        xr[d] += pos;
    }
}
RG_KERNEL(rg_add_interpolated)

kernel void rg_vision_qkv(constant RgVisionQkvArgs& a [[buffer(0)]], device const char* qkv [[buffer(1)]],
                          device const char* table [[buffer(2)]], device char* q [[buffer(3)]],
                          device char* k [[buffer(4)]], device char* vt [[buffer(5)]], RG_THREAD_IDS) {
    const int64_t n = a.qkv.rows, H = a.qkv.cols / 3, hd = H / a.n_head, half = hd / 2, hp = a.q.cols;
    const int64_t h = tgpig.y, r0 = int64_t(tgpig.x) * 32, nr = n - r0 < 32 ? n - r0 : 32, nsg = ntg / 32;
    const int64_t row = 33;  // the v tile's row in threadgroup memory: 32 dims and a pad (floats)

    // q and k: token r0 + i by SIMD-group i % nsg.
    for (int64_t i = sgitg; i < nr; i += nsg) {
        const int64_t r = r0 + i;
        device const float* src = rg_row<float>(qkv, a.qkv, r) + h * hd;
        device const float* cs = rg_row<float>(table, a.table, r);
        device float* qd = rg_row<float>(q, a.q, h * n + r);
        device float* kd = rg_row<float>(k, a.k, h * n + r);
        for (int64_t j = tiisg; j < hp; j += 32) {
            if (j >= hd) {
                qd[j] = 0.0f;
                kd[j] = 0.0f;
                continue;
            }
            const int64_t p = j < half ? j : j - half;
            const float c = cs[p], s = cs[half + p];
            const float qa = src[p], qb = src[p + half], ka = src[H + p], kb = src[H + p + half];
            qd[j] = j < half ? qa * c - qb * s : qb * c + qa * s;
            kd[j] = j < half ? ka * c - kb * s : kb * c + ka * s;
        }
    }

    // v: tile[i][dd] = v[r0 + i][d0 + dd], then vt[h hd + d0 + dd][r0 + i] = tile[i][dd].
    threadgroup float* tile = (threadgroup float*)shmem;
    for (int64_t d0 = 0; d0 < hd; d0 += 32) {
        const int64_t nd = hd - d0 < 32 ? hd - d0 : 32;
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous stretch's readers are done
        for (int64_t i = sgitg; i < nr; i += nsg)
            if (int64_t(tiisg) < nd)
                tile[i * row + tiisg] = rg_row<float>(qkv, a.qkv, r0 + i)[2 * H + h * hd + d0 + tiisg];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int64_t dd = sgitg; dd < nd; dd += nsg)
            if (int64_t(tiisg) < nr)
                rg_row<float>(vt, a.vt, h * hd + d0 + dd)[r0 + tiisg] = tile[tiisg * row + dd];
    }
}
RG_KERNEL(rg_vision_qkv)

kernel void rg_softmax_scaled(constant RgSoftmaxArgs& a [[buffer(0)]], device char* x [[buffer(1)]],
                              RG_THREAD_IDS) {
    const int64_t n = a.x.cols;
    const float scale = a.scale;
    device float* s = rg_row<float>(x, a.x, tgpig.x);
    threadgroup float* part = (threadgroup float*)shmem;
    float mx = -INFINITY;
    for (int64_t i = tiitg; i < n; i += ntg) mx = max(mx, s[i] * scale);
    mx = rg_group_max(mx, part, sgitg, tiisg, ntg);
    float sum = 0.0f;
    for (int64_t i = tiitg; i < n; i += ntg) {
        const float e = exp(s[i] * scale - mx);
        s[i] = e;
        sum += e;
    }
    const float inv = 1.0f / rg_group_sum(sum, part, sgitg, tiisg, ntg);
    for (int64_t i = tiitg; i < n; i += ntg) s[i] *= inv;  // this thread's own elements
}
RG_KERNEL(rg_softmax_scaled)
