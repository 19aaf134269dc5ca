// QSA sparse attention (model/qsa_attention.h has the semantics): pooling the keys of the blocks a step
// completes (one block of threads per pooled block), block selection per query (one block of threads per
// query: scores in shared memory, then top-k rounds with ties to the lower block), and gated attention
// over the selected blocks and the tail (one warp per query head: the scores in shared memory, softmax,
// weighted sum of the values).
#include <cfloat>

#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__global__ void pool_k(QsaSeqView s, View norm, View freq, View axis, QsaDims d, int64_t b0) {
    const int64_t b = b0 + blockIdx.x, r = d.ratio, ID = d.index_head_dim, half = d.n_rot / 2;
    extern __shared__ float mean[];  // [ID]
    for (int64_t i = threadIdx.x; i < ID; i += blockDim.x) {
        float m = 0.0f;
        for (int64_t j = b * r; j < (b + 1) * r; ++j) m += s.index_k.row(j)[i];
        mean[i] = m / float(r);
    }
    __syncthreads();
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < ID; i += blockDim.x) ss += double(mean[i]) * double(mean[i]);
    ss = block_sum(ss);
    const float inv = float(1.0 / sqrt(double(float(ss / double(ID))) + double(d.eps)));
    for (int64_t i = threadIdx.x; i < ID; i += blockDim.x) mean[i] = mean[i] * inv * norm.row(0)[i];
    __syncthreads();
    float* bk = s.block_k.row(b);
    const int64_t* pos = s.pos.row<const int64_t>(b * r);
    for (int64_t i = 2 * half + threadIdx.x; i < ID; i += blockDim.x) bk[i] = mean[i];  // not rotated
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
        const float angle = float(pos[axis.row<const int32_t>(0)[i]]) * freq.row(0)[i];
        float sn, cs;
        sincosf(angle, &sn, &cs);
        const float a = mean[i], c = mean[i + half];
        bk[i] = a * cs - c * sn;
        bk[i + half] = c * cs + a * sn;
    }
}

__global__ void select_k(View iq, QsaSeqView s, QsaDims d, View sel, View n_sel) {
    const int64_t t = blockIdx.x, row = s.t0 + t, IH = d.index_n_head, ID = d.index_head_dim;
    const int64_t nb = (s.n0 + t + 1) / d.ratio, k = nb < d.topk ? nb : d.topk;
    if (threadIdx.x == 0) n_sel.row<int32_t>(0)[row] = int32_t(k);
    if (k == 0) return;
    int32_t* out = sel.row<int32_t>(row);
    if (k == nb) {
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) out[j] = int32_t(j);
        return;
    }
    extern __shared__ float score[];  // [nb]
    const float scale = 1.0f / sqrtf(float(ID));
    const float* q = iq.row(row);
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        const float* bk = s.block_k.row(b);
        float sum = 0.0f;
        for (int64_t h = 0; h < IH; ++h) {
            float dot = 0.0f;
            for (int64_t i = 0; i < ID; ++i) dot += q[h * ID + i] * bk[i];
            sum += fmaxf(dot, 0.0f);
        }
        score[b] = sum * scale;
    }
    __syncthreads();
    __shared__ float best_v[32];
    __shared__ int32_t best_i[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t j = 0; j < k; ++j) {
        float bv = -FLT_MAX;
        int32_t bi = INT32_MAX;
        for (int64_t b = threadIdx.x; b < nb; b += blockDim.x)
            if (score[b] > bv || (score[b] == bv && b < bi)) bv = score[b], bi = int32_t(b);
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < int(blockDim.x >> 5); ++w)
                if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) bv = best_v[w], bi = best_i[w];
            out[j] = bi;
            score[bi] = -FLT_MAX;  // taken (every real score is >= 0)
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)  // increasing block order
        for (int64_t a = 1; a < k; ++a)
            for (int64_t b = a; b > 0 && out[b - 1] > out[b]; --b) {
                const int32_t x = out[b];
                out[b] = out[b - 1], out[b - 1] = x;
            }
}

__global__ void attend_k(View q, View gate, View sel, View n_sel, QsaSeqView s, QsaDims d, View out, int64_t max_keys) {
    const int64_t H = d.n_head, KV = d.n_head_kv, D = d.head_dim, r = d.ratio;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t p = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
    if (p >= s.ntok * H) return;
    const int64_t t = p / H, h = p % H, row = s.t0 + t, i = s.n0 + t, kvh = h / (H / KV);
    extern __shared__ float w_all[];
    float* w = w_all + int64_t(warp) * max_keys;
    const int32_t* blocks = sel.row<const int32_t>(row);
    const int64_t nsel = n_sel.row<const int32_t>(0)[row], tail0 = (i + 1) / r * r;
    const int64_t n_keys = nsel * r + (i + 1 - tail0);
    const auto key = [&](int64_t j) { return j < nsel * r ? int64_t(blocks[j / r]) * r + j % r : tail0 + (j - nsel * r); };
    const float* qh = q.row(row * H + h);
    const float scale = 1.0f / sqrtf(float(D));
    // scores: the lanes split each key's dot product (coalesced rows), 4 keys at a time so the sums' shuffles
    // overlap
    for (int64_t j0 = 0; j0 < n_keys; j0 += 4) {
        float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float* kj[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) kj[u] = j0 + u < n_keys ? s.k.row(key(j0 + u) * KV + kvh) : nullptr;
        for (int64_t e = lane; e < D; e += 32) {
            const float qe = qh[e];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (kj[u]) dot[u] += qe * kj[u][e];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) dot[u] = warp_sum(dot[u]);
        if (lane < 4 && j0 + lane < n_keys) w[j0 + lane] = (lane == 0 ? dot[0] : lane == 1 ? dot[1] : lane == 2 ? dot[2] : dot[3]) * scale;
    }
    __syncwarp();
    float mx = -FLT_MAX;
    for (int64_t j = lane; j < n_keys; j += 32) mx = fmaxf(mx, w[j]);
    mx = warp_max(mx);
    double sum = 0.0;
    for (int64_t j = lane; j < n_keys; j += 32) {
        w[j] = expf(w[j] - mx);
        sum += w[j];
    }
    sum = warp_sum(sum);
    __syncwarp();
    const float inv = float(1.0 / sum);
    float* o = out.row(row * H + h);
    const float* g = gate.row(row * H + h);
    for (int64_t e = lane; e < D; e += 32) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n_keys; ++j) acc += (w[j] * inv) * s.v.row(key(j) * KV + kvh)[e];
        o[e] = acc * sigmoidf_(g[e]);
    }
}

}  // namespace

void qsa_pool(cudaStream_t s, const std::vector<QsaSeqView>& seqs, const View& norm, const View& freq, const View& axis,
              const QsaDims& d) {
    for (const QsaSeqView& q : seqs) {
        const int64_t b0 = q.n0 / d.ratio, b1 = (q.n0 + q.ntok) / d.ratio;
        if (b1 <= b0) continue;
        pool_k<<<unsigned(b1 - b0), 64, size_t(d.index_head_dim) * sizeof(float), s>>>(q, norm, freq, axis, d, b0);
        RG_LAUNCHED("qsa_pool");
    }
}

void qsa_select(cudaStream_t s, const View& iq, const std::vector<QsaSeqView>& seqs, const QsaDims& d, const View& sel,
                const View& n_sel) {
    for (const QsaSeqView& q : seqs) {
        if (q.ntok == 0) continue;
        const int64_t nb = (q.n0 + q.ntok) / d.ratio;
        select_k<<<unsigned(q.ntok), 128, size_t(nb + 1) * sizeof(float), s>>>(iq, q, d, sel, n_sel);
        RG_LAUNCHED("qsa_select");
    }
}

void qsa_attend(cudaStream_t s, const View& q, const View& gate, const View& sel, const View& n_sel,
                const std::vector<QsaSeqView>& seqs, const QsaDims& d, const View& out) {
    const int64_t max_keys = (d.topk + 1) * d.ratio;
    constexpr int kWarps = 4;
    for (const QsaSeqView& v : seqs) {
        if (v.ntok == 0) continue;
        attend_k<<<grid(v.ntok * d.n_head, kWarps), 32 * kWarps, size_t(kWarps * max_keys) * sizeof(float), s>>>(
            q, gate, sel, n_sel, v, d, out, max_keys);
        RG_LAUNCHED("qsa_attend");
    }
}

}  // namespace regolith::cuda
