// Causal grouped-query attention over a dense KV cache (model/causal_attention.h): appending keys and values
// (rounded to f16 for an F16 cache, rows quantized for Q8_0 / I8: cache.cuh), then one block per (query,
// head): the scores of the visible keys in shared memory, the softmax (probabilities rounded to f16 for an
// F16 cache, as the CPU's f16 products do) and the weighted sum of the values, whose cache is transposed for
// F16 / F32 and rows for Q8_0 / I8 (attend_k says how the warps share it).
#include <cuda_fp16.h>

#include <cfloat>

#include "cuda/cache.cuh"
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__device__ inline void cache_put(const View& t, int64_t r, int64_t c, float v) {
    if (t.type == RG_TYPE_F16)
        t.row<__half>(r)[c] = __float2half_rn(v);
    else
        t.row(r)[c] = v;
}
__device__ inline float round_f16(float v) { return __half2float(__float2half_rn(v)); }

__global__ void append_k(View k, View v, KvSeqView s, int64_t KV) {
    pdl_begin();
    const int64_t D = k.cols / KV, cap = s.k.rows / KV;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= s.ntok * KV * D) return;
    const int64_t t = i / (KV * D), h = i / D % KV, e = i % D, pos = s.n0 + t;
    cache_put(s.k, h * cap + pos, e, k.row(s.t0 + t)[h * D + e]);
    cache_put(s.vt, h * D + e, pos, v.row(s.t0 + t)[h * D + e]);
}

// Q8_0 / I8: a warp per (token, kv head) stores its key row and its value row.
constexpr int kAppendWarps = 4;
__global__ void append_rows_k(View k, View v, KvSeqView s, int64_t KV) {
    pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * kAppendWarps + (threadIdx.x >> 5);
    if (i >= s.ntok * KV) return;
    const int64_t D = k.cols / KV, cap = s.k.rows / KV, t = i / KV, h = i % KV, r = h * cap + s.n0 + t;
    cache_store_row(k.row(s.t0 + t) + h * D, s.k, s.k_scale, r);
    cache_store_row(v.row(s.t0 + t) + h * D, s.v, s.v_scale, r);
}

// One block of kAttendWarps warps per (query, head). Scores: warp w takes keys w, w + kAttendWarps, ..., 4 at
// a time, its lanes splitting each dot product; the softmax over the block; values: warp w takes value rows
// (elements) e = w, w + kAttendWarps, ... of the transposed cache (or column e of the value rows), its lanes
// splitting the keys (coalesced reads of a transposed cache), each row's lane sums added by a warp reduction. What a (query, head) computes depends on its keys
// only, not on the launch.
constexpr int kAttendWarps = 8;

__global__ void attend_k(View q, KvSeqView s, AttentionShape sh, View sinks, View out) {
    pdl_begin();
    const int64_t H = sh.n_head, KV = sh.n_head_kv, D = sh.head_dim, cap = s.k.rows / KV;
    const int64_t t = blockIdx.x / H, h = blockIdx.x % H, kvh = h / (H / KV), pos = s.n0 + t;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool f16 = s.k.type == RG_TYPE_F16;
    const int64_t a = sh.window > 0 ? (pos - sh.window + 1 > 0 ? pos - sh.window + 1 : 0) : 0, n = pos + 1 - a;
    extern __shared__ float sm[];
    float* qs = sm;      // [D] the query (rounded to f16 for an F16 cache)
    float* w = sm + D;   // [n] scores, then probabilities
    const float* qr = q.row(s.t0 + t) + h * D;
    for (int64_t e = threadIdx.x; e < D; e += blockDim.x) qs[e] = f16 ? round_f16(qr[e]) : qr[e];
    __syncthreads();
    for (int64_t j0 = 4 * warp; j0 < n; j0 += 4 * kAttendWarps) {
        float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t e = lane; e < D; e += 32) {
            const float qe = qs[e];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (j0 + u < n) dot[u] += qe * cache_elem(s.k, s.k_scale, kvh * cap + a + j0 + u, e);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) dot[u] = warp_sum(dot[u]);
        if (lane < 4 && j0 + lane < n) w[j0 + lane] = (lane == 0 ? dot[0] : lane == 1 ? dot[1] : lane == 2 ? dot[2] : dot[3]) * sh.scale;
    }
    __syncthreads();
    float mx = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, w[j]);
    mx = block_max(mx);
    // the head's sink logit joins the max and the sum, its probability dropped
    const float sink = sinks ? sinks.row(0)[h] : 0.0f;
    if (sinks) mx = fmaxf(mx, sink);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        w[j] = expf(w[j] - mx);
        sum += w[j];
    }
    sum = block_sum(sum);
    if (sinks) sum += double(expf(sink - mx));
    const float inv = float(1.0 / sum);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) w[j] = f16 ? round_f16(w[j] * inv) : w[j] * inv;
    __syncthreads();
    float* o = out.row(s.t0 + t) + h * D;
    for (int64_t e = warp; e < D; e += kAttendWarps) {
        float acc = 0.0f;
        if (s.v)
            for (int64_t j = lane; j < n; j += 32) acc += w[j] * cache_elem(s.v, s.v_scale, kvh * cap + a + j, e);
        else
            for (int64_t j = lane; j < n; j += 32) acc += w[j] * cache_elem(s.vt, View{}, kvh * D + e, a + j);
        acc = warp_sum(acc);
        if (lane == 0) o[e] = acc;
    }
}

}  // namespace

void kv_append(cudaStream_t s, const View& k, const View& v, const std::vector<KvSeqView>& seqs, int64_t n_head_kv) {
    for (const KvSeqView& q : seqs) {
        if (q.ntok == 0) continue;
        if (q.v)
            launch(append_rows_k, grid(q.ntok * n_head_kv, kAppendWarps), 32 * kAppendWarps, 0, s, k, v, q, n_head_kv);
        else
            launch(append_k, grid(q.ntok * k.cols, 256), 256, 0, s, k, v, q, n_head_kv);
        RG_LAUNCHED("kv_append");
    }
}

void attention(cudaStream_t s, const View& q, const std::vector<KvSeqView>& seqs, const AttentionShape& sh,
               const View& sinks, const View& out) {
    for (const KvSeqView& v : seqs) {
        if (v.ntok == 0) continue;
        const int64_t keys = v.n0 + v.ntok;
        const size_t shared = size_t(sh.head_dim + keys) * sizeof(float);
        if (shared > 48 * 1024) {
            RG_CUDA(cudaFuncSetAttribute(attend_k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
        }
        launch(attend_k, unsigned(v.ntok * sh.n_head), 32 * kAttendWarps, shared, s, q, v, sh, sinks, out);
        RG_LAUNCHED("attention");
    }
}

}  // namespace regolith::cuda
