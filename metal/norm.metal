// Norms over rows (Backend::rms_norm, rms_norm_gated, layer_norm): a threadgroup per row, threads striding
// over its columns, sums through rg_group_sum. The CPU sums in double where the backend interface says so;
// Metal GPUs have no double: float partial sums per thread, added in a tree, stay well inside the norms'
// tolerance (relative error ~ eps log n, against the CPU's ~ eps).
#include "compat.h"

#include "args.h"
#include "common.h"

kernel void rg_rms_norm(constant RgNormArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                        device const char* w [[buffer(2)]], device char* y [[buffer(3)]], RG_THREAD_IDS) {
    const int64_t r = tgpig.x, n = a.x.cols;
    device const float* xr = rg_row<float>(x, a.x, r);
    device float* yr = rg_row<float>(y, a.y, r);
    float ss = 0.0f;
    for (int64_t i = tiitg; i < n; i += ntg) ss += xr[i] * xr[i];
    ss = rg_group_sum(ss, (threadgroup float*)shmem, sgitg, tiisg, ntg);
    const float inv = 1.0f / sqrt(ss / float(n) + a.eps);
    if (a.has_w) {
        device const float* wr = rg_row<float>(w, a.w, r % a.w.rows);
        for (int64_t i = tiitg; i < n; i += ntg) yr[i] = xr[i] * inv * wr[i];
    } else {
        for (int64_t i = tiitg; i < n; i += ntg) yr[i] = xr[i] * inv;
    }
}
RG_KERNEL(rg_rms_norm)

// y = w * (x * inv) * act(z), inv from the float sum of squares (FLA's order).
kernel void rg_rms_norm_gated(constant RgNormArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                              device const char* z [[buffer(2)]], device const char* w [[buffer(3)]],
                              device char* y [[buffer(4)]], RG_THREAD_IDS) {
    const int64_t r = tgpig.x, n = a.x.cols;
    device const float* o = rg_row<float>(x, a.x, r);
    device const float* zr = rg_row<float>(z, a.z, r);
    device const float* wr = rg_row<float>(w, a.w, 0);
    device float* yr = rg_row<float>(y, a.y, r);
    float ss = 0.0f;
    for (int64_t i = tiitg; i < n; i += ntg) ss += o[i] * o[i];
    ss = rg_group_sum(ss, (threadgroup float*)shmem, sgitg, tiisg, ntg);
    const float inv = 1.0f / sqrt(ss / float(n) + a.eps);
    for (int64_t i = tiitg; i < n; i += ntg) {
        const float gate = a.act == 1 ? rg_sigmoid(zr[i]) : rg_silu(zr[i]);
        yr[i] = wr[i] * (o[i] * inv) * gate;
    }
}
RG_KERNEL(rg_rms_norm_gated)

// torch LayerNorm: mean, then the mean of squared deviations (two passes over the row).
kernel void rg_layer_norm(constant RgNormArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                          device const char* w [[buffer(2)]], device const char* b [[buffer(3)]],
                          device char* y [[buffer(4)]], RG_THREAD_IDS) {
    const int64_t r = tgpig.x, n = a.x.cols;
    device const float* xr = rg_row<float>(x, a.x, r);
    device const float* wr = rg_row<float>(w, a.w, 0);
    device const float* br = rg_row<float>(b, a.b, 0);
    device float* yr = rg_row<float>(y, a.y, r);
    threadgroup float* part = (threadgroup float*)shmem;
    float s = 0.0f;
    for (int64_t i = tiitg; i < n; i += ntg) s += xr[i];
    const float mean = rg_group_sum(s, part, sgitg, tiisg, ntg) / float(n);
    float v = 0.0f;
    for (int64_t i = tiitg; i < n; i += ntg) v += (xr[i] - mean) * (xr[i] - mean);
    const float var = rg_group_sum(v, part, sgitg, tiisg, ntg) / float(n);
    const float rstd = 1.0f / sqrt(var + a.eps);
    for (int64_t i = tiitg; i < n; i += ntg) yr[i] = (xr[i] - mean) * rstd * wr[i] + br[i];
}
RG_KERNEL(rg_layer_norm)
