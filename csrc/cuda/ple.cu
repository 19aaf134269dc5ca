// The PLE layer's gate (one warp per token and stream: the two RMSNorms, their dot product in double, the
// signed square root and sigmoid, then the RMSNorm of the gated value) and its dilated causal conv (one thread
// per output element; then, per channel, the new history in increasing row order).
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__device__ float inv_rms_warp(const float* x, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = threadIdx.x & 31; i < n; i += 32) ss += double(x[i]) * double(x[i]);
    ss = warp_sum(ss);
    return float(1.0 / sqrt(double(float(ss / double(n))) + double(eps)));
}

__global__ void gate_k(View key, View query, View value, View nk, View nq, View nc, int64_t hc, float eps, View gated,
                       View normed) {
    pdl_begin();
    const int64_t w = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= key.rows * hc) return;
    const int64_t D = value.cols, t = w / hc, s = w % hc;
    const float* k = key.row(t) + s * D;
    const float* q = query.row(t) + s * D;
    const float* gk = nk.row(0) + s * D;
    const float* gq = nq.row(0) + s * D;
    const float ik = inv_rms_warp(k, D, eps), iq = inv_rms_warp(q, D, eps);
    double dot = 0.0;
    for (int64_t d = lane; d < D; d += 32) dot += double((k[d] * ik) * gk[d]) * double((q[d] * iq) * gq[d]);
    dot = warp_sum(dot);
    float g = float(dot) * float(1.0 / sqrt(double(D)));
    const float sgn = g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f);
    g = sqrtf(fmaxf(fabsf(g), 1e-6f)) * sgn;
    const float sig = sigmoidf_(g);
    float* out = gated.row(t) + s * D;
    const float* v = value.row(t);
    for (int64_t d = lane; d < D; d += 32) out[d] = sig * v[d];
    __syncwarp();
    const float io = inv_rms_warp(out, D, eps);
    const float* gc = nc.row(0) + s * D;
    float* nr = normed.row(t) + s * D;
    for (int64_t d = lane; d < D; d += 32) nr[d] = out[d] * io * gc[d];
}

__global__ void conv_k(View normed, View w, int64_t dil, PleConvSeqView s, View out) {
    pdl_begin();
    const int64_t C = normed.cols, K = w.cols, hist = (K - 1) * dil;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= s.ntok * C) return;
    const int64_t t = i / C, c = i % C;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
        const int64_t e = hist + t - (K - 1 - k) * dil;  // row of [state; normed]
        acc += w.row(c)[k] * (e < hist ? s.state.row(e)[c] : normed.row(s.t0 + e - hist)[c]);
    }
    out.row(s.t0 + t)[c] += siluf_(acc);
}

__global__ void history_k(View normed, PleConvSeqView s, int64_t hist) {
    pdl_begin();
    const int64_t C = normed.cols;
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int64_t j = 0; j < hist; ++j) {
        const int64_t e = s.ntok + j;
        s.state.row(j)[c] = e < hist ? s.state.row(e)[c] : normed.row(s.t0 + e - hist)[c];
    }
}

}  // namespace

void ple_gate(cudaStream_t s, const View& key, const View& query, const View& value, const View& norm_key,
              const View& norm_query, const View& norm_conv, int64_t hc, float eps, const View& gated, const View& normed) {
    if (key.rows == 0) return;
    launch(gate_k, grid(key.rows * hc, 4), 128, 0, s, key, query, value, norm_key, norm_query, norm_conv, hc, eps, gated, normed);
    RG_LAUNCHED("ple_gate");
}

void ple_conv(cudaStream_t s, const View& normed, const View& w, int64_t dilation, const std::vector<PleConvSeqView>& seqs,
              const View& out) {
    const int64_t hist = (w.cols - 1) * dilation;
    for (const PleConvSeqView& q : seqs) {
        if (q.ntok == 0) continue;
        launch(conv_k, grid(q.ntok * normed.cols, 256), 256, 0, s, normed, w, dilation, q, out);
        RG_LAUNCHED("ple_conv");
        if (hist > 0) {
            launch(history_k, grid(normed.cols, 256), 256, 0, s, normed, q, hist);
            RG_LAUNCHED("ple_conv (history)");
        }
    }
}

}  // namespace regolith::cuda
