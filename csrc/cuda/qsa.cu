// QSA sparse attention (model/qsa_attention.h has the semantics) over caches of any type (cache.cuh):
// pooling the keys of the blocks a step completes (one block of threads per pooled block), block selection
// per query (one block of threads per query: scores in shared memory, then top-k rounds with ties to the
// lower block), and gated attention over the selected blocks and the tail (the keys in splits,
// attend_part_k: each split's scores, softmax terms and value sum; the splits combined in order).
#include <algorithm>
#include <cfloat>
#include <string>

#include "cuda/cache.cuh"
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__global__ void pool_k(QsaSeqView s, View norm, View freq, View axis, QsaDims d, int64_t b0) {
    pdl_begin();
    const int64_t b = b0 + blockIdx.x, r = d.ratio, ID = d.index_head_dim, half = d.n_rot / 2;
    extern __shared__ float mean[];  // [ID]
    for (int64_t i = threadIdx.x; i < ID; i += blockDim.x) {
        float m = 0.0f;
        for (int64_t j = b * r; j < (b + 1) * r; ++j) m += cache_elem(s.index_k, s.index_k_scale, j, i);
        mean[i] = m / float(r);
    }
    __syncthreads();
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < ID; i += blockDim.x) ss += double(mean[i]) * double(mean[i]);
    ss = block_sum(ss);
    const float inv = float(1.0 / sqrt(double(float(ss / double(ID))) + double(d.eps)));
    for (int64_t i = threadIdx.x; i < ID; i += blockDim.x) mean[i] = mean[i] * inv * norm.row(0)[i];
    __syncthreads();
    const int64_t* pos = s.pos.row<const int64_t>(b * r);
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {  // the pair (i, i + half), in place
        const float angle = float(pos[axis.row<const int32_t>(0)[i]]) * freq.row(0)[i];
        float sn, cs;
        sincosf(angle, &sn, &cs);
        const float a = mean[i], c = mean[i + half];
        mean[i] = a * cs - c * sn;
        mean[i + half] = c * cs + a * sn;
    }
    __syncthreads();
    if (threadIdx.x < 32) cache_store_row(mean, s.block_k, s.block_k_scale, b);
}

__global__ void select_k(View iq, QsaSeqView s, QsaDims d, View sel, View n_sel) {
    pdl_begin();
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
        float sum = 0.0f;
        for (int64_t h = 0; h < IH; ++h) {
            // nn::dot's order (8 partial sums, combined pairwise, then the tail), so the scores are the CPU's
            // bits and near-ties fall the same way
            const float* qh = q + h * ID;
            float p[8] = {};
            int64_t i = 0;
            for (; i + 8 <= ID; i += 8)
                for (int l = 0; l < 8; ++l)
                    p[l] = __fadd_rn(p[l], __fmul_rn(qh[i + l], cache_elem(s.block_k, s.block_k_scale, b, i + l)));
            float dot = __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[4]), __fadd_rn(p[1], p[5])),
                                  __fadd_rn(__fadd_rn(p[2], p[6]), __fadd_rn(p[3], p[7])));
            for (; i < ID; ++i) dot = __fadd_rn(dot, __fmul_rn(qh[i], cache_elem(s.block_k, s.block_k_scale, b, i)));
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

// Attention of a query head over its keys (the selected blocks, then the tail) in splits of kSplitKeys keys:
// attend_part_k computes each split's max score m, sum of exponentials l and weighted value sum o (one block
// of kAttendWarps warps per (query, head, split)), attend_combine_k adds the splits in order, rescaled to
// the largest m. Every (query, head) is computed that way whatever the launch, so its result depends on its
// keys only.
constexpr int kAttendWarps = 8;
constexpr int kSplitKeys = 64;
constexpr int kMaxLaneElems = 16;  // head_dim <= 32 * kMaxLaneElems
constexpr int64_t kAttendGroup = 64;  // queries per launch pair: bounds the splits' scratch

struct AttendKeys {
    const int32_t* blocks;
    int64_t nsel, tail0, n_keys, r;
    __device__ int64_t operator()(int64_t j) const { return j < nsel * r ? int64_t(blocks[j / r]) * r + j % r : tail0 + (j - nsel * r); }
};

__device__ inline AttendKeys attend_keys(const View& sel, const View& n_sel, const QsaSeqView& s, const QsaDims& d, int64_t t) {
    const int64_t row = s.t0 + t, i = s.n0 + t, r = d.ratio, nsel = n_sel.row<const int32_t>(0)[row], tail0 = (i + 1) / r * r;
    return {sel.row<const int32_t>(row), nsel, tail0, nsel * r + (i + 1 - tail0), r};
}

// part [(t - t_lo) H + h][split][2 + D]: m, l, o[D] of queries t in [t_lo, t_lo + gridDim.x / H).
__global__ void attend_part_k(View q, View sel, View n_sel, QsaSeqView s, QsaDims d, int64_t t_lo, int64_t n_split,
                              float* part) {
    pdl_begin();
    const int64_t H = d.n_head, KV = d.n_head_kv, D = d.head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t qh_i = blockIdx.x, t = t_lo + qh_i / H, h = qh_i % H, kvh = h / (H / KV), split = blockIdx.y;
    const AttendKeys key = attend_keys(sel, n_sel, s, d, t);
    const int64_t j_lo = split * kSplitKeys, j_hi = key.n_keys < j_lo + kSplitKeys ? key.n_keys : j_lo + kSplitKeys;
    if (j_lo >= j_hi) return;
    __shared__ float w[kSplitKeys];
    __shared__ float sums[kAttendWarps][32 * kMaxLaneElems];
    const float* qh = q.row((s.t0 + t) * H + h);
    const float scale = 1.0f / sqrtf(float(D));
    float qe[kMaxLaneElems];
#pragma unroll
    for (int m = 0; m < kMaxLaneElems; ++m) qe[m] = lane + 32 * m < D ? qh[lane + 32 * m] : 0.0f;
    // scores: warp w takes keys j_lo + 8 w .. + 8, 4 at a time, the lanes splitting each dot product
    constexpr int kPerWarp = kSplitKeys / kAttendWarps;
    for (int u0 = 0; u0 < kPerWarp; u0 += 4) {
        const int64_t j0 = j_lo + warp * kPerWarp + u0;
        float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int64_t kj[4];  // cache rows, -1: none
#pragma unroll
        for (int u = 0; u < 4; ++u) kj[u] = j0 + u < j_hi ? key(j0 + u) * KV + kvh : -1;
#pragma unroll
        for (int m = 0; m < kMaxLaneElems; ++m) {
            const int64_t e = lane + 32 * m;
            if (e >= D) break;
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (kj[u] >= 0) dot[u] += qe[m] * cache_elem(s.k, s.k_scale, kj[u], e);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) dot[u] = warp_sum(dot[u]);
        if (lane < 4) w[warp * kPerWarp + u0 + lane] = j0 + lane < j_hi ? (lane == 0 ? dot[0] : lane == 1 ? dot[1] : lane == 2 ? dot[2] : dot[3]) * scale : -FLT_MAX;
    }
    __syncthreads();
    const float mx = block_max(threadIdx.x < unsigned(kSplitKeys) ? w[threadIdx.x] : -FLT_MAX);
    const float ex = threadIdx.x < unsigned(kSplitKeys) && j_lo + int64_t(threadIdx.x) < j_hi ? expf(w[threadIdx.x] - mx) : 0.0f;
    const double l = block_sum(double(ex));  // its barriers: every w read before the exponentials are written
    if (threadIdx.x < unsigned(kSplitKeys)) w[threadIdx.x] = ex;
    __syncthreads();
    // values: warp w sums its 8 keys' rows, 4 at a time, lanes over the elements
    float acc[kMaxLaneElems];
#pragma unroll
    for (int m = 0; m < kMaxLaneElems; ++m) acc[m] = 0.0f;
    for (int u0 = 0; u0 < kPerWarp; u0 += 4) {
        const int64_t j0 = j_lo + warp * kPerWarp + u0;
        int64_t vj[4];  // cache rows, -1: none
        float pj[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            vj[u] = j0 + u < j_hi ? key(j0 + u) * KV + kvh : -1;
            pj[u] = w[warp * kPerWarp + u0 + u];
        }
#pragma unroll
        for (int m = 0; m < kMaxLaneElems; ++m) {
            const int64_t e = lane + 32 * m;
            if (e >= D) break;
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (vj[u] >= 0) acc[m] += pj[u] * cache_elem(s.v, s.v_scale, vj[u], e);
        }
    }
#pragma unroll
    for (int m = 0; m < kMaxLaneElems; ++m)
        if (lane + 32 * m < D) sums[warp][lane + 32 * m] = acc[m];
    __syncthreads();
    float* out = part + (qh_i * n_split + split) * (2 + D);
    if (threadIdx.x == 0) out[0] = mx, out[1] = float(l);
    for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
        float total = 0.0f;
        for (int wi = 0; wi < kAttendWarps; ++wi) total += sums[wi][e];
        out[2 + e] = total;
    }
}

// out = sigmoid(gate) * (sum over splits in order of exp(m_s - M) o_s) / (sum of exp(m_s - M) l_s), M the
// largest m_s: one block per (query, head).
__global__ void attend_combine_k(View gate, View sel, View n_sel, QsaSeqView s, QsaDims d, int64_t t_lo, int64_t n_split,
                                 const float* part, View out) {
    pdl_begin();
    const int64_t H = d.n_head, D = d.head_dim, qh_i = blockIdx.x, t = t_lo + qh_i / H, h = qh_i % H;
    const int64_t ns = (attend_keys(sel, n_sel, s, d, t).n_keys + kSplitKeys - 1) / kSplitKeys;
    const float* p = part + qh_i * n_split * (2 + D);
    float M = -FLT_MAX;
    for (int64_t sp = 0; sp < ns; ++sp) M = fmaxf(M, p[sp * (2 + D)]);
    double L = 0.0;
    for (int64_t sp = 0; sp < ns; ++sp) L += double(p[sp * (2 + D) + 1]) * double(expf(p[sp * (2 + D)] - M));
    const float inv = float(1.0 / L);
    float* o = out.row((s.t0 + t) * H + h);
    const float* g = gate.row((s.t0 + t) * H + h);
    for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
        float acc = 0.0f;
        for (int64_t sp = 0; sp < ns; ++sp) acc += p[sp * (2 + D) + 2 + e] * expf(p[sp * (2 + D)] - M);
        o[e] = acc * inv * sigmoidf_(g[e]);
    }
}

}  // namespace

void qsa_pool(cudaStream_t s, const std::vector<QsaSeqView>& seqs, const View& norm, const View& freq, const View& axis,
              const QsaDims& d) {
    for (const QsaSeqView& q : seqs) {
        const int64_t b0 = q.n0 / d.ratio, b1 = (q.n0 + q.ntok) / d.ratio;
        if (b1 <= b0) continue;
        launch(pool_k, unsigned(b1 - b0), 64, size_t(d.index_head_dim) * sizeof(float), s, q, norm, freq, axis, d, b0);
        RG_LAUNCHED("qsa_pool");
    }
}

void qsa_select(cudaStream_t s, const View& iq, const std::vector<QsaSeqView>& seqs, const QsaDims& d, const View& sel,
                const View& n_sel) {
    for (const QsaSeqView& q : seqs) {
        if (q.ntok == 0) continue;
        const int64_t nb = (q.n0 + q.ntok) / d.ratio;
        launch(select_k, unsigned(q.ntok), 128, size_t(nb + 1) * sizeof(float), s, iq, q, d, sel, n_sel);
        RG_LAUNCHED("qsa_select");
    }
}

void qsa_attend(cudaStream_t s, const View& q, const View& gate, const View& sel, const View& n_sel,
                const std::vector<QsaSeqView>& seqs, const QsaDims& d, const View& out, Scratch& scratch) {
    if (d.head_dim > 32 * kMaxLaneElems)
        throw Error("qsa_attend on cuda: head_dim " + std::to_string(d.head_dim) + " > " +
                    std::to_string(32 * kMaxLaneElems));
    const int64_t n_split = ((d.topk + 1) * d.ratio + kSplitKeys - 1) / kSplitKeys;  // of the most keys a query has
    for (const QsaSeqView& v : seqs) {
        for (int64_t t_lo = 0; t_lo < v.ntok; t_lo += kAttendGroup) {
            const int64_t n = std::min(kAttendGroup, v.ntok - t_lo), blocks = n * d.n_head;
            auto* part = static_cast<float*>(scratch.get(size_t(blocks * n_split * (2 + d.head_dim)) * sizeof(float), s));
            launch(attend_part_k, dim3(unsigned(blocks), unsigned(n_split)), 32 * kAttendWarps, 0, s, q, sel, n_sel, v, d, t_lo,
                                                                                                 n_split, part);
            RG_LAUNCHED("qsa_attend (splits)");
            launch(attend_combine_k, unsigned(blocks), 128, 0, s, gate, sel, n_sel, v, d, t_lo, n_split, part, out);
            RG_LAUNCHED("qsa_attend");
        }
    }
}

}  // namespace regolith::cuda
