// Causal grouped-query attention over a dense KV cache (model/causal_attention.h): appending keys and values
// (rounded to f16 for an F16 cache), then one block per (query, head): the scores of the visible keys in
// shared memory, the softmax (probabilities rounded to f16 for an F16 cache, as the CPU's f16 products do)
// and the weighted sum of the values, whose cache is transposed.
#include <cuda_fp16.h>

#include <cfloat>

#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__device__ inline float cache_at(const View& t, int64_t r, int64_t c) {
    if (t.type == RG_TYPE_F16) return __half2float(t.row<const __half>(r)[c]);
    return t.row(r)[c];
}
__device__ inline void cache_put(const View& t, int64_t r, int64_t c, float v) {
    if (t.type == RG_TYPE_F16)
        t.row<__half>(r)[c] = __float2half_rn(v);
    else
        t.row(r)[c] = v;
}
__device__ inline float round_f16(float v) { return __half2float(__float2half_rn(v)); }

__global__ void append_k(View k, View v, KvSeqView s, int64_t KV) {
    const int64_t D = k.cols / KV, cap = s.k.rows / KV;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= s.ntok * KV * D) return;
    const int64_t t = i / (KV * D), h = i / D % KV, e = i % D, pos = s.n0 + t;
    cache_put(s.k, h * cap + pos, e, k.row(s.t0 + t)[h * D + e]);
    cache_put(s.vt, h * D + e, pos, v.row(s.t0 + t)[h * D + e]);
}

__global__ void attend_k(View q, KvSeqView s, AttentionShape sh, View out) {
    const int64_t H = sh.n_head, KV = sh.n_head_kv, D = sh.head_dim, cap = s.k.rows / KV;
    const int64_t t = blockIdx.x / H, h = blockIdx.x % H, kvh = h / (H / KV), pos = s.n0 + t;
    const bool f16 = s.k.type == RG_TYPE_F16;
    const int64_t a = sh.window > 0 ? (pos - sh.window + 1 > 0 ? pos - sh.window + 1 : 0) : 0, n = pos + 1 - a;
    extern __shared__ float sm[];
    float* qs = sm;      // [D] the query (rounded to f16 for an F16 cache)
    float* w = sm + D;   // [n] scores, then probabilities
    const float* qr = q.row(s.t0 + t) + h * D;
    for (int64_t e = threadIdx.x; e < D; e += blockDim.x) qs[e] = f16 ? round_f16(qr[e]) : qr[e];
    __syncthreads();
    float mx = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float dot = 0.0f;
        for (int64_t e = 0; e < D; ++e) dot += qs[e] * cache_at(s.k, kvh * cap + a + j, e);
        w[j] = dot * sh.scale;
        mx = fmaxf(mx, w[j]);
    }
    mx = block_max(mx);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        w[j] = expf(w[j] - mx);
        sum += w[j];
    }
    sum = block_sum(sum);
    const float inv = float(1.0 / sum);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) w[j] = f16 ? round_f16(w[j] * inv) : w[j] * inv;
    __syncthreads();
    float* o = out.row(s.t0 + t) + h * D;
    for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; ++j) acc += w[j] * cache_at(s.vt, kvh * D + e, a + j);
        o[e] = acc;
    }
}

}  // namespace

void kv_append(cudaStream_t s, const View& k, const View& v, const std::vector<KvSeqView>& seqs, int64_t n_head_kv) {
    for (const KvSeqView& q : seqs) {
        if (q.ntok == 0) continue;
        append_k<<<grid(q.ntok * k.cols, 256), 256, 0, s>>>(k, v, q, n_head_kv);
        RG_LAUNCHED("kv_append");
    }
}

void attention(cudaStream_t s, const View& q, const std::vector<KvSeqView>& seqs, const AttentionShape& sh, const View& out) {
    for (const KvSeqView& v : seqs) {
        if (v.ntok == 0) continue;
        const int64_t keys = v.n0 + v.ntok;
        const size_t shared = size_t(sh.head_dim + keys) * sizeof(float);
        if (shared > 48 * 1024) {
            RG_CUDA(cudaFuncSetAttribute(attend_k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
        }
        attend_k<<<unsigned(v.ntok * sh.n_head), 128, shared, s>>>(q, v, sh, out);
        RG_LAUNCHED("attention");
    }
}

}  // namespace regolith::cuda
