// Mixture-of-experts routing, the resident experts of a layer, and the weighted sum of the experts' outputs.
//
// Routing: one warp per token, softmax over the router logits in shared memory, then the top k (the first
// `protect` by probability and, with MoCE, the rest by logit plus the resident bonus), ties to the lower id.
// Resident experts: every (token, slot) pair is its own product against its expert's rows of the stacked
// tensors (one warp per output row, the row's blocks decoded by the shared BlockDecoder), so the layer needs
// no grouping by expert and no host round trip; then SwiGLU, the down products, and per token the sum over
// its experts in expert-id order.
#include <cfloat>
#include <string>

#include "core/block_decode.h"
#include "core/types.h"
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

constexpr int kMaxK = 32;  // experts per token

__device__ bool better(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

// The lane-wide argmax of v over [0, n) excluding `taken` ids; every lane gets the (value, id).
__device__ void warp_argmax(const float* v, int64_t n, const int32_t* taken, int n_taken, float& bv, int32_t& bi) {
    bv = -FLT_MAX, bi = INT32_MAX;
    for (int64_t e = threadIdx.x & 31; e < n; e += 32) {
        bool skip = false;
        for (int p = 0; p < n_taken; ++p) skip |= taken[p] == e;
        if (!skip && better(v[e], int32_t(e), bv, bi)) bv = v[e], bi = int32_t(e);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
}

__global__ void route_k(View logits, View resident, MoeRouting rt, View ids, View weights) {
    const int64_t t = blockIdx.x, ne = logits.cols, k = rt.k;
    extern __shared__ float sm[];
    float* p = sm;         // [ne] probabilities
    float* score = sm + ne;  // [ne] logit + bonus
    __shared__ int32_t chosen[kMaxK];
    const float* l = logits.row(t);
    float mx = -FLT_MAX;
    for (int64_t e = threadIdx.x; e < ne; e += 32) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    double sum = 0.0;
    for (int64_t e = threadIdx.x; e < ne; e += 32) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    sum = warp_sum(sum);
    const float inv = float(1.0 / sum);
    for (int64_t e = threadIdx.x; e < ne; e += 32) {
        p[e] *= inv;
        score[e] = l[e] + (resident && resident.row<const int8_t>(0)[e] ? rt.bonus : 0.0f);
    }
    __syncwarp();
    const int64_t keep = resident ? (rt.protect < 0 ? 0 : rt.protect > k ? k : rt.protect) : k;
    for (int64_t j = 0; j < k; ++j) {
        float bv;
        int32_t bi;
        warp_argmax(j < keep ? p : score, ne, chosen, int(j), bv, bi);
        if (threadIdx.x == 0) chosen[j] = bi;
        __syncwarp();
    }
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int64_t j = 0; j < k; ++j) s += p[chosen[j]];
        for (int64_t j = 0; j < k; ++j) {
            ids.row<int32_t>(t)[j] = chosen[j];
            weights.row(t)[j] = rt.norm_topk ? p[chosen[j]] / s : p[chosen[j]];
        }
    }
}

// y[p][r] = W_e[r] . x[p / per_x] for pair p of expert e = ids[p] (rows of W_e: stacked rows e * n .. e * n + n).
template <class Dec>
__global__ void pair_mmv(View w, int64_t n, View ids, View x, int64_t per_x, View y) {
    using Block = typename Dec::Block;
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5), p = blockIdx.y;
    if (r >= n) return;
    const int32_t e = ids.row<const int32_t>(p / ids.cols)[p % ids.cols];
    const Block* blocks = w.row<const Block>(int64_t(e) * n + r);
    const float* xr = x.row(p / per_x);
    const int64_t nb = w.cols / Dec::QK;
    int8_t q[Dec::QK];
    float sc[Dec::NG], bi[Dec::NG];
    float acc = 0.0f;  // summed as matmul's decode kernel sums (per group, then into the row's sum)
    for (int64_t b = lane; b < nb; b += 32) {
        Dec::decode(blocks[b], q, sc, Dec::HAS_BIAS ? bi : nullptr);
        for (int g = 0; g < Dec::NG; ++g) {
            const float s = sc[g], o = Dec::HAS_BIAS ? bi[g] : 0.0f;
            const float* xg = xr + b * Dec::QK + g * Dec::G;
            float sum = 0.0f;
            for (int i = 0; i < Dec::G; ++i) sum += (s * float(q[g * Dec::G + i]) + o) * xg[i];
            acc += sum;
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) y.row(p)[r] = acc;
}

__global__ void pair_mmv_float(View w, int64_t n, View ids, View x, int64_t per_x, View y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5), p = blockIdx.y;
    if (r >= n) return;
    const int32_t e = ids.row<const int32_t>(p / ids.cols)[p % ids.cols];
    const uint8_t* row = w.row<const uint8_t>(int64_t(e) * n + r);
    const float* xr = x.row(p / per_x);
    float acc = 0.0f;
    for (int64_t c = lane; c < w.cols; c += 32) {
        float wc;
        if (w.type == RG_TYPE_F32) {
            wc = reinterpret_cast<const float*>(row)[c];
        } else {
            const uint16_t h = reinterpret_cast<const uint16_t*>(row)[c];
            wc = w.type == RG_TYPE_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
        }
        acc += wc * xr[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) y.row(p)[r] = acc;
}

void pair_products(cudaStream_t s, const View& w, int64_t n, const View& ids, const View& x, int64_t per_x, const View& y) {
    const dim3 g(grid(n, 4), unsigned(ids.rows * ids.cols));
    switch (w.type) {
        case RG_TYPE_F32:
        case RG_TYPE_F16:
        case RG_TYPE_BF16:
            pair_mmv_float<<<g, 128, 0, s>>>(w, n, ids, x, per_x, y);
            break;
#define RG_CASE_(T)                                                          \
    case T:                                                                  \
        pair_mmv<BlockDecoder<T>><<<g, 128, 0, s>>>(w, n, ids, x, per_x, y); \
        break;
            RG_FOR_EACH_QUANT_TYPE(RG_CASE_)
#undef RG_CASE_
        default:
            throw Error("CUDA moe_experts: no kernel for type " + std::string(type_traits(w.type)->name));
    }
    RG_LAUNCHED("moe_experts (products)");
}

__global__ void swiglu_k(float* g, const float* u, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) g[i] = siluf_(g[i]) * u[i];
}

__global__ void swiglu_view_k(View g, View u) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= g.rows * g.cols) return;
    float& v = g.row(i / g.cols)[i % g.cols];
    v = siluf_(v) * u.row(i / g.cols)[i % g.cols];
}

// y[t][c] = sum over the token's k pairs in expert-id order of w * ys[pair row] (+ sigmoid(sg) * sh).
__global__ void sum_pairs_k(View ys, View ids, View weights, const float* sh, View sg, View y) {
    const int64_t h = y.cols, k = ids.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= y.rows * h) return;
    const int64_t t = i / h, c = i % h;
    int32_t order[kMaxK];
    for (int64_t j = 0; j < k; ++j) order[j] = int32_t(j);
    const int32_t* id = ids.row<const int32_t>(t);
    for (int64_t a = 1; a < k; ++a)
        for (int64_t b = a; b > 0 && id[order[b - 1]] > id[order[b]]; --b) {
            const int32_t x = order[b];
            order[b] = order[b - 1], order[b - 1] = x;
        }
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += weights.row(t)[order[j]] * ys.row(t * k + order[j])[c];
    if (sh) acc += sigmoidf_(sg.row(t)[0]) * sh[t * h + c];
    y.row(t)[c] = acc;
}

// Where each routing pair lies among the rows: row_of[pairs[i]] = i.
__global__ void invert_k(View pairs, int32_t* row_of) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < pairs.cols) row_of[pairs.row<const int32_t>(0)[i]] = int32_t(i);
}

// y[t][c] = sum over the token's pairs in row order (expert-id order: the rows are grouped by expert) of
// w * ys[row] (+ sigmoid(sg) * sh).
__global__ void combine_k(View ys, const int32_t* row_of, View weights, View shared, View sg, View y) {
    const int64_t h = y.cols, k = weights.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= y.rows * h) return;
    const int64_t t = i / h, c = i % h;
    int32_t rows[kMaxK], js[kMaxK];
    for (int64_t j = 0; j < k; ++j) rows[j] = row_of[t * k + j], js[j] = int32_t(j);
    for (int64_t a = 1; a < k; ++a)
        for (int64_t b = a; b > 0 && rows[b - 1] > rows[b]; --b) {
            const int32_t r = rows[b], j = js[b];
            rows[b] = rows[b - 1], js[b] = js[b - 1];
            rows[b - 1] = r, js[b - 1] = j;
        }
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += weights.row(t)[js[j]] * ys.row(rows[j])[c];
    if (shared) acc += sigmoidf_(sg.row(t)[0]) * shared.row(t)[c];
    y.row(t)[c] = acc;
}

}  // namespace

void moe_route(cudaStream_t s, const View& logits, const View& resident, const MoeRouting& r, const View& ids,
               const View& weights) {
    if (r.k > kMaxK) throw Error("CUDA moe_route: at most 32 experts per token");
    if (logits.rows == 0) return;
    route_k<<<unsigned(logits.rows), 32, size_t(2 * logits.cols) * sizeof(float), s>>>(logits, resident, r, ids, weights);
    RG_LAUNCHED("moe_route");
}

void moe_experts(cudaStream_t s, const View& x, const View& ids, const View& weights, const View& gate, const View& up,
                 const View& down, int64_t n_expert, const SharedExpertView* shared, const View& y, Scratch& scratch,
                 Scratch& matmul_scratch) {
    const int64_t ntok = x.rows, k = ids.cols, pairs = ntok * k, h = x.cols, ff = gate.rows / n_expert;
    if (k > kMaxK) throw Error("CUDA moe_experts: at most 32 experts per token");
    const int64_t fs = shared ? shared->gate.cols : 0;
    float* base = static_cast<float*>(scratch.get(size_t(2 * pairs * ff + pairs * h + ntok * h) * sizeof(float), s));
    const View g{reinterpret_cast<uint8_t*>(base), pairs, ff, ff * 4, RG_TYPE_F32};
    const View u{reinterpret_cast<uint8_t*>(base + pairs * ff), pairs, ff, ff * 4, RG_TYPE_F32};
    const View ys{reinterpret_cast<uint8_t*>(base + 2 * pairs * ff), pairs, h, h * 4, RG_TYPE_F32};
    float* sh = base + 2 * pairs * ff + pairs * h;
    pair_products(s, gate, ff, ids, x, k, g);
    pair_products(s, up, ff, ids, x, k, u);
    swiglu_k<<<grid(pairs * ff, 256), 256, 0, s>>>(reinterpret_cast<float*>(g.base), reinterpret_cast<const float*>(u.base),
                                                  pairs * ff);
    RG_LAUNCHED("moe_experts (swiglu)");
    pair_products(s, down, h, ids, g, 1, ys);
    if (shared) {
        swiglu_view_k<<<grid(ntok * fs, 256), 256, 0, s>>>(shared->gate, shared->up);
        RG_LAUNCHED("moe_experts (shared swiglu)");
        const MatmulView job{shared->down, shared->gate, View{reinterpret_cast<uint8_t*>(sh), ntok, h, h * 4, RG_TYPE_F32}};
        matmul(s, &job, 1, matmul_scratch);
    }
    sum_pairs_k<<<grid(ntok * h, 256), 256, 0, s>>>(ys, ids, weights, shared ? sh : nullptr,
                                                   shared ? shared->gate_logit : View{}, y);
    RG_LAUNCHED("moe_experts (sum)");
}

void moe_combine(cudaStream_t s, const View& ys, const View& pairs, const View& weights, const View& shared,
                 const View& shared_gate, const View& y, Scratch& scratch) {
    if (weights.cols > kMaxK) throw Error("CUDA moe_combine: at most 32 experts per token");
    // the inverse of the pair list, [ntok * k]
    auto* row_of = static_cast<int32_t*>(scratch.get(size_t(weights.rows * weights.cols) * sizeof(int32_t), s));
    invert_k<<<grid(pairs.cols, 256), 256, 0, s>>>(pairs, row_of);
    RG_LAUNCHED("moe_combine (pairs)");
    combine_k<<<grid(y.rows * y.cols, 256), 256, 0, s>>>(ys, row_of, weights, shared, shared_gate, y);
    RG_LAUNCHED("moe_combine");
}

}  // namespace regolith::cuda
