// Gated DeltaNet (model/gated_delta_net.h has the equations): the causal depthwise conv with its state, the
// q/k normalisation and gates, and the delta rule, one block per (sequence, value head) with thread j holding
// column j of the head's state in registers and the tokens taken in order (for any number of tokens: the
// CPU's chunked scan computes the same recurrence, up to float rounding).
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

// out[t0 + t][c] = silu(sum_i w_t[i][c] * ext[t + i][c]), ext = the state's K-1 rows, then the x rows.
__global__ void conv_k(View x, View w_t, ConvSeqView s, View out) {
    pdl_begin();
    const int64_t cd = x.cols, K = w_t.rows, hist = K - 1;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= s.ntok * cd) return;
    const int64_t t = i / cd, c = i % cd;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
        const int64_t e = t + k;  // row of ext
        const float v = e < hist ? s.state.row(e)[c] : x.row(s.t0 + e - hist)[c];
        acc += w_t.row(k)[c] * v;
    }
    out.row(s.t0 + t)[c] = siluf_(acc);
}

// Per channel: the states after each token (ext rows t+1 .. t+K-1), then the new state (the last K-1 rows),
// in increasing row order so that a row of the old state is read before it is overwritten.
__global__ void conv_state_k(View x, ConvSeqView s, int64_t hist) {
    pdl_begin();
    const int64_t cd = x.cols;
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= cd) return;
    const auto ext = [&](int64_t e) { return e < hist ? s.state.row(e)[c] : x.row(s.t0 + e - hist)[c]; };
    if (s.after)
        for (int64_t t = 0; t < s.ntok; ++t)
            for (int64_t j = 0; j < hist; ++j) s.after.row(t)[j * cd + c] = ext(t + 1 + j);
    for (int64_t j = 0; j < hist; ++j) s.state.row(j)[c] = ext(s.ntok + j);
}

__global__ void l2norm_k(View qkv, int64_t nk, int64_t dk) {
    pdl_begin();
    const int64_t w = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= qkv.rows * 2 * nk) return;
    const int64_t t = w / (2 * nk), h = w % (2 * nk);
    float* p = qkv.row(t) + h * dk;
    float ss = 0.0f;
    for (int64_t j = lane; j < dk; j += 32) ss += p[j] * p[j];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss + 1e-6f), q_scale = 1.0f / sqrtf(float(dk));
    for (int64_t j = lane; j < dk; j += 32) p[j] = h < nk ? p[j] * inv * q_scale : p[j] * inv;
}

__global__ void gates_k(View g, View beta, View a, View dt) {
    pdl_begin();
    const int64_t nv = g.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= g.rows * nv) return;
    const int64_t t = i / nv, h = i % nv;
    const float x = g.row(t)[h] + dt.row(0)[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g.row(t)[h] = a.row(0)[h] * sp;
    beta.row(t)[h] = sigmoidf_(beta.row(t)[h]);
}

template <int DK>
__global__ void scan_k(View qkv, View g, View beta, GdnSeqView s, GdnDims d, View out) {
    pdl_begin();
    const int64_t h = blockIdx.x, j = threadIdx.x, dv = d.v_dim, kd = d.key_dim(),
                  kh = d.grouped ? h / (d.n_v_heads / d.n_k_heads) : h % d.n_k_heads;
    __shared__ float q[DK], k[DK];
    float S[DK];
    float* state = s.state.row(0) + h * DK * dv;
    if (j < dv)
#pragma unroll
        for (int i = 0; i < DK; ++i) S[i] = state[i * dv + j];
    for (int64_t t = 0; t < s.ntok; ++t) {
        const float* row = qkv.row(s.t0 + t);
        __syncthreads();
        for (int64_t i = j; i < DK; i += blockDim.x) q[i] = row[kh * DK + i], k[i] = row[kd + kh * DK + i];
        __syncthreads();
        if (j >= dv) continue;
        const float decay = expf(g.row(s.t0 + t)[h]), b = beta.row(s.t0 + t)[h];
        const float v = row[2 * kd + h * dv + j];
        float kv = 0.0f;
#pragma unroll
        for (int i = 0; i < DK; ++i) {
            S[i] *= decay;
            kv += k[i] * S[i];
        }
        const float delta = (v - kv) * b;
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < DK; ++i) {
            S[i] += k[i] * delta;
            o += q[i] * S[i];
        }
        out.row(s.t0 + t)[h * dv + j] = o;
        if (s.after) {
            float* a = s.after.row(t) + h * DK * dv;
#pragma unroll
            for (int i = 0; i < DK; ++i) a[i * dv + j] = S[i];
        }
    }
    if (j < dv)
#pragma unroll
        for (int i = 0; i < DK; ++i) state[i * dv + j] = S[i];
}

}  // namespace

void ssm_conv(cudaStream_t s, const View& x, const View& w_t, const std::vector<ConvSeqView>& seqs, const View& out) {
    for (const ConvSeqView& q : seqs) {
        if (q.ntok == 0) continue;
        launch(conv_k, grid(q.ntok * x.cols, 256), 256, 0, s, x, w_t, q, out);
        RG_LAUNCHED("ssm_conv");
        if (w_t.rows > 1) {
            launch(conv_state_k, grid(x.cols, 256), 256, 0, s, x, q, w_t.rows - 1);
            RG_LAUNCHED("ssm_conv (state)");
        }
    }
}

void gdn_prepare(cudaStream_t s, const View& qkv, const View& g, const View& beta, const View& a, const View& dt_bias,
                 const GdnDims& d) {
    if (qkv.rows == 0) return;
    launch(l2norm_k, grid(qkv.rows * 2 * d.n_k_heads, 4), 128, 0, s, qkv, d.n_k_heads, d.k_dim);
    RG_LAUNCHED("gdn_prepare (norms)");
    launch(gates_k, grid(g.rows * g.cols, 256), 256, 0, s, g, beta, a, dt_bias);
    RG_LAUNCHED("gdn_prepare (gates)");
}

void gdn_scan(cudaStream_t s, const View& qkv, const View& g, const View& beta, const std::vector<GdnSeqView>& seqs,
              const GdnDims& d, const View& out) {
    if (d.v_dim > 1024) throw Error("CUDA gdn_scan: value heads of at most 1024");
    const unsigned threads = unsigned((d.v_dim + 31) / 32 * 32);
    for (const GdnSeqView& q : seqs) {
        if (q.ntok == 0) continue;
        switch (d.k_dim) {
            case 8: launch(scan_k<8>, unsigned(d.n_v_heads), threads, 0, s, qkv, g, beta, q, d, out); break;
            case 16: launch(scan_k<16>, unsigned(d.n_v_heads), threads, 0, s, qkv, g, beta, q, d, out); break;
            case 32: launch(scan_k<32>, unsigned(d.n_v_heads), threads, 0, s, qkv, g, beta, q, d, out); break;
            case 64: launch(scan_k<64>, unsigned(d.n_v_heads), threads, 0, s, qkv, g, beta, q, d, out); break;
            case 128: launch(scan_k<128>, unsigned(d.n_v_heads), threads, 0, s, qkv, g, beta, q, d, out); break;
            default: throw Error("CUDA gdn_scan: key heads of 8, 16, 32, 64 or 128");
        }
        RG_LAUNCHED("gdn_scan");
    }
}

}  // namespace regolith::cuda
