// Norms over rows, one block (RMSNorm, LayerNorm) or one warp (the gated RMSNorm of short rows) per row; the
// sums in double as the CPU takes them.
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__global__ void rms_norm_k(View x, View w, float eps, View y) {
    pdl_begin();
    const int64_t r = blockIdx.x, n = x.cols;
    const float* xr = x.row(r);
    double ss = 0.0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += double(xr[i]) * double(xr[i]);
    ss = block_sum(ss);
    const float inv = float(1.0 / sqrt(double(float(ss / double(n))) + double(eps)));
    const float* wr = w ? w.row(r % w.rows) : nullptr;
    float* yr = y.row(r);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = wr ? xr[i] * inv * wr[i] : xr[i] * inv;
}

__global__ void rms_norm_gated_k(View x, View z, View w, float eps, bool sigmoid_gate, View y) {
    pdl_begin();
    const int64_t r = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= x.rows) return;
    const int64_t n = x.cols;
    const float* o = x.row(r);
    float ss = 0.0f;
    for (int64_t i = lane; i < n; i += 32) ss += o[i] * o[i];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / float(n) + eps);
    const float* zr = z.row(r);
    const float* wr = w.row(0);
    float* yr = y.row(r);
    for (int64_t i = lane; i < n; i += 32) {
        const float g = sigmoid_gate ? sigmoidf_(zr[i]) : siluf_(zr[i]);
        yr[i] = wr[i] * (o[i] * inv) * g;
    }
}

__global__ void layer_norm_k(View x, View w, View b, float eps, View y) {
    pdl_begin();
    const int64_t r = blockIdx.x, n = x.cols;
    const float* xr = x.row(r);
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += double(xr[i]);
    const double mean = block_sum(s) / double(n);
    double v = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (double(xr[i]) - mean) * (double(xr[i]) - mean);
    const double var = block_sum(v) / double(n);
    const float m = float(mean), rstd = float(1.0 / sqrt(var + double(eps)));
    const float *wr = w.row(0), *br = b.row(0);
    float* yr = y.row(r);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] - m) * rstd * wr[i] + br[i];
}

int threads_for(int64_t n) { return n >= 4096 ? 1024 : n >= 1024 ? 256 : n >= 256 ? 128 : 64; }

}  // namespace

void rms_norm(cudaStream_t s, const View& x, const View& w, float eps, const View& y) {
    if (x.rows == 0) return;
    launch(rms_norm_k, unsigned(x.rows), threads_for(x.cols), 0, s, x, w, eps, y);
    RG_LAUNCHED("rms_norm");
}

void rms_norm_gated(cudaStream_t s, const View& x, const View& z, const View& w, float eps, bool sigmoid_gate, const View& y) {
    if (x.rows == 0) return;
    launch(rms_norm_gated_k, grid(x.rows, 4), 128, 0, s, x, z, w, eps, sigmoid_gate, y);
    RG_LAUNCHED("rms_norm_gated");
}

void layer_norm(cudaStream_t s, const View& x, const View& w, const View& b, float eps, const View& y) {
    if (x.rows == 0) return;
    launch(layer_norm_k, unsigned(x.rows), threads_for(x.cols), 0, s, x, w, b, eps, y);
    RG_LAUNCHED("layer_norm");
}

}  // namespace regolith::cuda
