// The vision tower's own ops: the bilinear position grid (one thread per element, the 4 taps in order), the
// rotated and padded q / k and the transposed v of one frame's attention, and its softmax (one block per row).
#include <cfloat>

#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__global__ void interp_k(View table, View idx, View w, View x) {
    pdl_begin();
    const int64_t H = x.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= x.rows * H) return;
    const int64_t r = i / H, d = i % H;
    float pos = 0.0f;
    for (int j = 0; j < 4; ++j) pos += table.row(idx.row<const int32_t>(r)[j])[d] * w.row(r)[j];
    x.row(r)[d] += pos;
}

__global__ void qkv_k(View qkv, View table, int64_t nh, View q, View k, View vt) {
    pdl_begin();
    const int64_t n = qkv.rows, H = qkv.cols / 3, hd = H / nh, half = hd / 2, hp = q.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * nh * hp) return;
    const int64_t r = i / (nh * hp), h = i / hp % nh, j = i % hp;
    const float* row = qkv.row(r) + h * hd;
    if (j < hd) vt.row(h * hd + j)[r] = row[2 * H + j];
    for (int part = 0; part < 2; ++part) {
        float* dst = (part == 0 ? q : k).row(h * n + r);
        if (j >= hd) {
            dst[j] = 0.0f;
            continue;
        }
        const float* src = row + part * H;
        const int64_t p = j < half ? j : j - half;
        const float cs = table.row(r)[p], sn = table.row(r)[half + p];
        const float a = src[p], b = src[p + half];
        dst[j] = j < half ? a * cs - b * sn : b * cs + a * sn;
    }
}

__global__ void softmax_k(View x, float scale) {
    pdl_begin();
    float* s = x.row(blockIdx.x);
    const int64_t n = x.cols;
    float mx = -FLT_MAX;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, s[i] * scale);
    mx = block_max(mx);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        s[i] = expf(s[i] * scale - mx);
        sum += s[i];
    }
    const float inv = float(1.0 / block_sum(sum));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s[i] *= inv;
}

}  // namespace

void add_interpolated(cudaStream_t s, const View& table, const View& idx, const View& w, const View& x) {
    if (x.rows == 0) return;
    launch(interp_k, grid(x.rows * x.cols, 256), 256, 0, s, table, idx, w, x);
    RG_LAUNCHED("add_interpolated");
}

void vision_qkv(cudaStream_t s, const View& qkv, const View& table, int64_t n_head, const View& q, const View& k,
                const View& vt) {
    if (qkv.rows == 0) return;
    launch(qkv_k, grid(qkv.rows * n_head * q.cols, 256), 256, 0, s, qkv, table, n_head, q, k, vt);
    RG_LAUNCHED("vision_qkv");
}

void softmax_scaled(cudaStream_t s, const View& x, float scale) {
    if (x.rows == 0) return;
    launch(softmax_k, unsigned(x.rows), 128, 0, s, x, scale);
    RG_LAUNCHED("softmax_scaled");
}

}  // namespace regolith::cuda
