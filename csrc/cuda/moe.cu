// Mixture-of-experts routing, the resident experts of a layer, and the weighted sum of the experts' outputs.
//
// Routing: one warp per token, softmax over the router logits in shared memory, then the top k (the first
// `protect` by probability and, with MoCE, the rest by logit plus the resident bonus), ties to the lower id.
// Resident experts: the (token, expert) pairs grouped by expert on the device (no host round trip), each
// expert's rows of the stacked tensors times its pairs with the tensor-core steps of matmul (cuda/qmma.cuh,
// so the same bits as the streamed path's products); then SwiGLU, the down products, and per token the sum
// over its experts in expert-id order.
#include <algorithm>
#include <cfloat>
#include <string>

#include "core/block_decode.h"
#include "core/types.h"
#include "cuda/float_dot.cuh"
#include "cuda/kernels.cuh"
#include "cuda/qmma.cuh"

namespace regolith::cuda {

namespace {

constexpr int kMaxK = 32;  // experts per token
constexpr size_t kMaxExactRowBytes = 48u << 10;  // pair_mmv_exact's row in shared memory (the default limit)

__device__ bool better(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

// The lane-wide argmax of v over [0, n) excluding ids e with taken[e]; every lane gets the (value, id).
__device__ void warp_argmax(const float* v, int64_t n, const uint8_t* taken, float& bv, int32_t& bi) {
    bv = -FLT_MAX, bi = INT32_MAX;
    for (int64_t e = threadIdx.x & 31; e < n; e += 32)
        if (!taken[e] && better(v[e], int32_t(e), bv, bi)) bv = v[e], bi = int32_t(e);
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
}

// One warp per token. Shared memory: p [ne] probabilities, score [ne] logit + bonus, taken [ne] flags.
__global__ void route_k(View logits, View resident, MoeRouting rt, View ids, View weights) {
    pdl_begin();
    const int64_t t = blockIdx.x, ne = logits.cols, k = rt.k;
    extern __shared__ float sm[];
    float* p = sm;
    float* score = sm + ne;
    auto* taken = reinterpret_cast<uint8_t*>(sm + 2 * ne);
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
        taken[e] = 0;
    }
    __syncwarp();
    const int64_t keep = resident ? (rt.protect < 0 ? 0 : rt.protect > k ? k : rt.protect) : k;
    for (int64_t j = 0; j < k; ++j) {
        float bv;
        int32_t bi;
        warp_argmax(j < keep ? p : score, ne, taken, bv, bi);
        if (threadIdx.x == 0) chosen[j] = bi, taken[bi < ne ? bi : 0] |= bi < ne;
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
// The routing pairs grouped by expert (one block of kGroupThreads): offset [n_expert + 1], order [pairs] (the
// pairs of expert e at order[offset[e] .. offset[e + 1]), in no particular order: each product depends on
// its own row and token only), active [1 + n_expert] (the number of experts with pairs, then those experts in
// id order). Counts and cursors in shared memory, [n_expert <= kMaxGroupExperts].
constexpr int kGroupThreads = 1024, kMaxGroupExperts = 8192;

__global__ void group_k(View ids, int64_t n_expert, int32_t* offset, int32_t* order, int32_t* active) {
    pdl_begin();
    __shared__ int32_t count[kMaxGroupExperts];
    __shared__ int32_t part[kGroupThreads / 32], used[kGroupThreads / 32];
    const int64_t pairs = ids.rows * ids.cols;
    const auto id = [&](int64_t p) { return ids.row<const int32_t>(p / ids.cols)[p % ids.cols]; };
    for (int64_t e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[id(p)], 1);
    __syncthreads();
    // exclusive scans of pairs and of experts with pairs: thread i sums its run of experts, the runs' sums are
    // scanned in warps (shuffles), the warps' totals by warp 0
    const int64_t run = (n_expert + blockDim.x - 1) / blockDim.x, e0 = threadIdx.x * run;
    int32_t sum = 0, n_used = 0;
    for (int64_t e = e0; e < e0 + run && e < n_expert; ++e) sum += count[e], n_used += count[e] > 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t incl = sum, incl_used = n_used;  // inclusive scans within the warp
    for (int o = 1; o < 32; o <<= 1) {
        const int32_t a = __shfl_up_sync(0xffffffffu, incl, o), b = __shfl_up_sync(0xffffffffu, incl_used, o);
        if (lane >= o) incl += a, incl_used += b;
    }
    if (lane == 31) part[warp] = incl, used[warp] = incl_used;
    __syncthreads();
    if (warp == 0) {
        const int nw = int(blockDim.x >> 5);
        int32_t w = lane < nw ? part[lane] : 0, wu = lane < nw ? used[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t a = __shfl_up_sync(0xffffffffu, w, o), b = __shfl_up_sync(0xffffffffu, wu, o);
            if (lane >= o) w += a, wu += b;
        }
        if (lane < nw) part[lane] = w, used[lane] = wu;  // inclusive over warps
        if (lane == nw - 1) offset[n_expert] = w, active[0] = wu;
    }
    __syncthreads();
    int32_t o = incl - sum + (warp > 0 ? part[warp - 1] : 0), u = incl_used - n_used + (warp > 0 ? used[warp - 1] : 0);
    for (int64_t e = e0; e < e0 + run && e < n_expert; ++e) {
        const int32_t c = count[e];
        offset[e] = o;
        count[e] = o;  // now the cursor
        o += c;
        if (c > 0) active[1 + u++] = int32_t(e);
    }
    __syncthreads();
    for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) order[atomicAdd(&count[id(p)], 1)] = int32_t(p);
}

// Where expert e's rows of one matrix lie: rows e * n .. of a stacked tensor (where null), or part `part` of
// the expert's record (ExpertSlots): in device slot where[e] when where[e] >= 0, else in host row e (mapped
// host memory, read over the bus), offsets[e][part] bytes into the slot. Rows are `stride` bytes apart.
struct ExpertLoc {
    const uint8_t* stacked;
    int64_t stride, n;
    const int32_t* where;
    const uint8_t* offsets;
    int64_t offsets_stride;
    const uint8_t *device, *host;
    int64_t device_stride, host_stride;
    int part;
    __device__ const uint8_t* at(int64_t e) const {
        if (!where) return stacked + e * n * stride;
        const int32_t s = where[e];
        const int32_t off = reinterpret_cast<const int32_t*>(offsets + e * offsets_stride)[part];
        return (s >= 0 ? device + s * device_stride : host + e * host_stride) + off;
    }
};

ExpertLoc expert_loc(const View& w, int64_t n, const ExpertSlotsView& sl, int part) {
    if (!sl.where) return ExpertLoc{w.base, w.stride, n, nullptr, nullptr, 0, nullptr, nullptr, 0, 0, part};
    return ExpertLoc{nullptr,         w.stride,         n,          sl.where.row<const int32_t>(0), sl.offsets.base,
                     sl.offsets.stride, sl.device.base, sl.host.base, sl.device.stride,              sl.host.stride,
                     part};
}

// The quantized products of the blockIdx.z-th expert e with pairs (active[1 + z]; blocks past active[0]
// return): rows [64 bx, +64) of e (its n rows where w puts them, a warp per 16) times its pairs
// [8 NT tile, +8 NT), each pair p's activations the row p / per_x of `a`; y[p] takes the result.
// blockIdx.y = tile * per_tile + b with per_tile = ceil(n_seg / spb): with one segment (no split) the block
// sums every segment of K and writes y; with n_seg = segments(K) it writes the sums of segments
// [b spb, + spb) to part [n_seg][pairs][n], and the last of the tile's blocks adds them (last_of_segments).
// The steps of matmul's kernels (cuda/qmma.cuh): the same bits.
template <class Dec, int NT>
__global__ void __launch_bounds__(kDecodeThreads, (kDecodeMinBlocks<Dec, NT>))
    qmm_grouped(ExpertLoc w, int64_t n, int64_t nb, const int32_t* offset, const int32_t* order, const int32_t* active,
                HalfActs a, int64_t per_x, View y, int64_t n_seg, int64_t spb, int64_t pairs, float* part,
                unsigned* counters) {
    pdl_begin();
    if (int64_t(blockIdx.z) >= active[0]) return;
    const int64_t per_tile = (n_seg + spb - 1) / spb;
    const int64_t e = active[1 + blockIdx.z], tile = blockIdx.y / per_tile, seg0 = blockIdx.y % per_tile * spb;
    const int64_t p0 = offset[e] + tile * 8 * NT, p1 = offset[e + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r0 = (int64_t(blockIdx.x) * 4 + warp) * 16;
    if (p0 >= p1) return;
    const auto pair = [&](int i) { return p0 + i < p1 ? int64_t(order[p0 + i]) : int64_t(-1); };
    if (r0 < n) {
        extern __shared__ __align__(16) uint8_t smem[];
        uint8_t* raw = smem + warp * decode_smem_bytes<Dec>();
        __half* tile_sm = reinterpret_cast<__half*>(raw + 16 * Staging<Dec>::kRawLd);
        const Rows we{w.at(e), n, w.stride};
        int64_t tok[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int64_t p = pair(8 * j + lane / 4);
            tok[j] = p < 0 ? p : p / per_x;
        }
        if (part) {
            int64_t c_lo, c_hi;
            segment_chunks(chunks<Dec>(nb), seg0, spb, c_lo, c_hi);
            const auto seg_end = [&](int64_t c, const float(&acc)[NT][4]) {
                const int64_t seg = c / kSegmentChunks;
                store_total<NT>(acc, r0, n, [&](int i, int64_t r, float v) {
                    const int64_t p = pair(i);
                    if (p >= 0) part[(seg * pairs + p) * n + r] = v;
                });
            };
            warp_segments<Dec, NT>(we, r0, nb, c_lo, c_hi, a, tok, raw, tile_sm, seg_end);
        } else {
            float total[NT][4];
            warp_product<Dec, NT>(we, r0, nb, 0, chunks<Dec>(nb), a, tok, raw, tile_sm, total);
            store_total<NT>(total, r0, n, [&](int i, int64_t r, float v) {
                const int64_t p = pair(i);
                if (p >= 0) y.row(p)[r] = a.s[p / per_x] * v;
            });
            return;
        }
    } else if (!part) {
        return;
    }
    const int64_t tiles = gridDim.y / per_tile;
    if (!last_of_segments(counters + (blockIdx.z * tiles + tile) * gridDim.x + blockIdx.x, per_tile)) return;
    // y[p][r] = s[p / per_x] * (((0 + part[0][p][r]) + part[1][p][r]) + ...) for the block's rows and pairs
    const int64_t rb = int64_t(blockIdx.x) * 64;
    for (int i = threadIdx.x; i < 64 * 8 * NT; i += blockDim.x) {
        const int64_t p = pair(i / 64), r = rb + i % 64;
        if (p < 0 || r >= n) continue;
        y.row(p)[r] = a.s[p / per_x] * sum_segments(part + p * n + r, pairs * n, n_seg);
    }
}

// Float weights: y[p][r] = W_e[r] . x[p / per_x], a block per (pair p = blockIdx.x, row r = blockIdx.y).
__global__ void pair_mmv_float(ExpertLoc w, uint32_t type, int64_t cols, View ids, View x, int64_t per_x, View y) {
    pdl_begin();
    const int64_t p = blockIdx.x, r = blockIdx.y;
    const int32_t e = ids.row<const int32_t>(p / ids.cols)[p % ids.cols];
    const float v = float_row_dot(w.at(e) + r * w.stride, type, cols, 1, [&](int) { return x.row(p / per_x); });
    if (threadIdx.x == 0) y.row(p)[r] = v;
}

// Exact products of quantized experts in slots (exact_activations()): pair_mmv_float on the row dequantized
// into shared memory (cols f32) as matmul's exact mode dequantizes a whole matrix (the CPU's two roundings).
template <class Dec>
__global__ void pair_mmv_exact(ExpertLoc w, int64_t cols, View ids, View x, int64_t per_x, View y) {
    pdl_begin();
    extern __shared__ float wrow[];
    const int64_t p = blockIdx.x, r = blockIdx.y;
    const int32_t e = ids.row<const int32_t>(p / ids.cols)[p % ids.cols];
    const auto* blocks = reinterpret_cast<const typename Dec::Block*>(w.at(e) + r * w.stride);
    for (int64_t b = threadIdx.x; b < cols / Dec::QK; b += blockDim.x) {
        int8_t q[Dec::QK];
        float scale[Dec::NG], bias[Dec::NG];
        Dec::decode(blocks[b], q, scale, Dec::HAS_BIAS ? bias : nullptr);
        for (int j = 0; j < Dec::QK; ++j) {
            const float v = __fmul_rn(scale[j / Dec::G], float(q[j]));
            wrow[b * Dec::QK + j] = Dec::HAS_BIAS ? __fadd_rn(v, bias[j / Dec::G]) : v;
        }
    }
    __syncthreads();
    const float v = float_row_dot(reinterpret_cast<const uint8_t*>(wrow), RG_TYPE_F32, cols, 1,
                                  [&](int) { return x.row(p / per_x); });
    if (threadIdx.x == 0) y.row(p)[r] = v;
}

// The pairs' grouping by expert, in device memory.
struct Groups {
    const int32_t *offset, *order, *active;
};

// y[p] = W_e x[p / per_x] for every pair p, W_e where `loc` puts it (w: the matrices' type, cols and row
// stride; with stacked weights their memory): x f32 for float weights (and, dequantized, for quantized ones in
// exact mode), its f16 form `a` for quantized ones.
void pair_products(cudaStream_t s, const View& w, const ExpertLoc& loc, int64_t n, const View& ids, const View& x,
                   const HalfActs& a, const Groups& gr, int64_t n_expert, int64_t per_x, const View& y, float* part,
                   Scratch& exact_scratch) {
    const int64_t pairs = ids.rows * ids.cols;
    // decode: too few experts' rows to fill the GPU, so the segments of K go to blocks of their own
    const bool as_float = float_type(w.type) || exact_activations();
    // an expert has at most one pair per token; at most min(n_expert, pairs) experts have pairs
    const unsigned slots = unsigned(std::min(n_expert, pairs));
    const int64_t tiles = grid(ids.rows, ids.rows <= 8 ? 8 : 16) * slots * grid(n, 64);
    const int64_t n_seg = part && !as_float && tiles <= kSegmentCounters ? segments(w.cols) : 1;
    if (n_seg == 1) part = nullptr;
    const int64_t spb = n_seg > 1 ? std::min(n_seg, segments_per_block(tiles * n_seg)) : 1;
    const int64_t per_tile = (n_seg + spb - 1) / spb;
    const dim3 per_row{unsigned(pairs), unsigned(n)};
    if (as_float && (float_type(w.type) || !loc.where)) {
        const View wf = float_type(w.type) ? w : dequantized(s, w, exact_scratch, size_t(4) << 30);
        const ExpertLoc lf = float_type(w.type) ? loc : ExpertLoc{wf.base, wf.stride, n, nullptr, nullptr, 0,
                                                                  nullptr, nullptr, 0, 0, 0};
        launch(pair_mmv_float, per_row, 128, 0, s, lf, wf.type, wf.cols, ids, x, per_x, y);
    } else if (as_float) {  // exact mode, experts in slots: each row dequantized where it lies
        const size_t smem = size_t(w.cols) * sizeof(float);
        if (smem > kMaxExactRowBytes) throw Error("exact activations on cuda: expert rows of at most 12,288 columns");
        dispatch_quant_type(w.type, [&](auto dec) {
            using D = decltype(dec);
            launch(pair_mmv_exact<D>, per_row, 128, smem, s, loc, w.cols, ids, x, per_x, y);
        });
    } else {
        dispatch_quant_type(w.type, [&](auto dec) {
            using D = decltype(dec);
            constexpr size_t smem = 4 * decode_smem_bytes<D>();
            const int64_t nb = w.cols / D::QK;
            if (ids.rows <= 8) {
                launch(qmm_grouped<D, 1>, dim3(grid(n, 64), unsigned(grid(ids.rows, 8) * per_tile), slots),
                       kDecodeThreads, smem, s, loc, n, nb, gr.offset, gr.order, gr.active, a, per_x, y, n_seg,
                       spb, pairs, part, segment_counters());
            } else {
                launch(qmm_grouped<D, 2>, dim3(grid(n, 64), unsigned(grid(ids.rows, 16) * per_tile), slots),
                       kDecodeThreads, smem, s, loc, n, nb, gr.offset, gr.order, gr.active, a, per_x, y, n_seg,
                       spb, pairs, part, segment_counters());
            }
        });
    }
    RG_LAUNCHED("moe_experts (products)");
}

// g[p] := act(g[p] + gate_bias[e], u[p] + up_bias[e]) over the pair rows p = t * k + j of g, u [pairs][ff],
// e = ids[t][j] (the biases when given).
__global__ void expert_act_k(View g, View u, View ids, ExpertActView a) {
    pdl_begin();
    const int64_t ff = g.cols, k = ids.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= g.rows * ff) return;
    const int64_t p = i / ff, c = i % ff;
    float gv = g.row(p)[c], uv = u.row(p)[c];
    if (a.gate_bias) {
        const int32_t e = ids.row<const int32_t>(p / k)[p % k];
        gv += a.gate_bias.row(e)[c];
        uv += a.up_bias.row(e)[c];
    }
    g.row(p)[c] = a.act == Glu::SwigluOai ? swiglu_oai_(gv, uv) : siluf_(gv) * uv;
}

__global__ void swiglu_view_k(View g, View u) {
    pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= g.rows * g.cols) return;
    float& v = g.row(i / g.cols)[i % g.cols];
    v = siluf_(v) * u.row(i / g.cols)[i % g.cols];
}

// y[t][c] = sum over the token's k pairs in expert-id order of w * (ys[pair row] + down_bias[e]) (+ sigmoid(sg)
// * sh).
__global__ void sum_pairs_k(View ys, View ids, View weights, View down_bias, const float* sh, View sg, View y) {
    pdl_begin();
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
    for (int64_t j = 0; j < k; ++j) {
        float v = ys.row(t * k + order[j])[c];
        if (down_bias) v += down_bias.row(id[order[j]])[c];
        acc += weights.row(t)[order[j]] * v;
    }
    if (sh) acc += sigmoidf_(sg.row(t)[0]) * sh[t * h + c];
    y.row(t)[c] = acc;
}

// Where each routing pair lies among the rows: row_of[pairs[i]] = i.
__global__ void invert_k(View pairs, int32_t* row_of) {
    pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < pairs.cols) row_of[pairs.row<const int32_t>(0)[i]] = int32_t(i);
}

// y[t][c] = sum over the token's pairs in row order (expert-id order: the rows are grouped by expert) of
// w * ys[row] (+ sigmoid(sg) * sh).
__global__ void combine_k(View ys, const int32_t* row_of, View weights, View shared, View sg, View y) {
    pdl_begin();
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

void init_moe_kernels() {
#define RG_INIT_(T)                                                                                  \
    allow_smem(qmm_grouped<BlockDecoder<T>, 1>, 4 * decode_smem_bytes<BlockDecoder<T>>(),            \
               !kLaneDecode<BlockDecoder<T>>);                                                       \
    allow_smem(qmm_grouped<BlockDecoder<T>, 2>, 4 * decode_smem_bytes<BlockDecoder<T>>());
    RG_FOR_EACH_QUANT_TYPE(RG_INIT_)
#undef RG_INIT_
}

void moe_route(cudaStream_t s, const View& logits, const View& resident, const MoeRouting& r, const View& ids,
               const View& weights) {
    if (r.k > kMaxK) throw Error("CUDA moe_route: at most 32 experts per token");
    if (logits.rows == 0) return;
    launch(route_k, unsigned(logits.rows), 32, size_t(2 * logits.cols) * sizeof(float) + size_t(logits.cols), s, logits, resident, r, ids, weights);
    RG_LAUNCHED("moe_route");
}

void moe_experts(cudaStream_t s, const View& x, const View& ids, const View& weights, const View& gate, const View& up,
                 const View& down, int64_t n_expert, const ExpertSlotsView& slots, const ExpertActView& act,
                 const SharedExpertView* shared, const View& y, Scratch& scratch, Scratch& matmul_scratch) {
    const int64_t ntok = x.rows, k = ids.cols, pairs = ntok * k, h = x.cols, ff = gate.rows / n_expert;
    if (k > kMaxK) throw Error("CUDA moe_experts: at most 32 experts per token");
    const int64_t fs = shared ? shared->gate.cols : 0;
    if (n_expert > kMaxGroupExperts) throw Error("CUDA moe_experts: at most 8192 experts");
    // g, u [pairs][ff], ys [pairs][h], sh [ntok][h] f32; the f16 forms of x and g; the grouping
    const size_t f32_bytes = (size_t(2 * pairs * ff + pairs * h + ntok * h) * sizeof(float) + 255) / 256 * 256;
    const size_t xa_bytes = half_acts_bytes(ntok, h), ga_bytes = half_acts_bytes(pairs, ff);
    // decode (ntok <= 16): the products' segment sums, [segments][pairs][max(ff, h)]
    const bool split = ntok <= 16;
    const size_t part_bytes = split ? size_t(std::max(segments(h), segments(ff)) * pairs * std::max(ff, h)) * 4 : 0;
    const size_t group_bytes = (size_t(2 * n_expert + 2 + pairs) * 4 + 255) / 256 * 256;
    auto* base = static_cast<uint8_t*>(scratch.get(f32_bytes + xa_bytes + ga_bytes + group_bytes + part_bytes, s));
    float* part = split ? reinterpret_cast<float*>(base + f32_bytes + xa_bytes + ga_bytes + group_bytes) : nullptr;
    float* f = reinterpret_cast<float*>(base);
    const View g{base, pairs, ff, ff * 4, RG_TYPE_F32};
    const View u{reinterpret_cast<uint8_t*>(f + pairs * ff), pairs, ff, ff * 4, RG_TYPE_F32};
    const View ys{reinterpret_cast<uint8_t*>(f + 2 * pairs * ff), pairs, h, h * 4, RG_TYPE_F32};
    float* sh = f + 2 * pairs * ff + pairs * h;
    const HalfActs xa = half_acts_at(base + f32_bytes, ntok, h);
    const HalfActs ga = half_acts_at(base + f32_bytes + xa_bytes, pairs, ff);
    auto* offset = reinterpret_cast<int32_t*>(base + f32_bytes + xa_bytes + ga_bytes);
    int32_t* order = offset + n_expert + 1;
    int32_t* active = order + pairs;
    launch(group_k, 1, kGroupThreads, 0, s, ids, n_expert, offset, order, active);
    RG_LAUNCHED("moe_experts (grouping)");
    const Groups gr{offset, order, active};
    if (!float_type(gate.type) || !float_type(up.type)) acts_f16(s, x, xa);
    pair_products(s, gate, expert_loc(gate, ff, slots, 0), ff, ids, x, xa, gr, n_expert, k, g, part, matmul_scratch);
    pair_products(s, up, expert_loc(up, ff, slots, 1), ff, ids, x, xa, gr, n_expert, k, u, part, matmul_scratch);
    launch(expert_act_k, grid(pairs * ff, 256), 256, 0, s, g, u, ids, act);
    RG_LAUNCHED("moe_experts (act)");
    if (!float_type(down.type)) acts_f16(s, g, ga);
    pair_products(s, down, expert_loc(down, h, slots, 2), h, ids, g, ga, gr, n_expert, 1, ys, part, matmul_scratch);
    if (shared) {
        launch(swiglu_view_k, grid(ntok * fs, 256), 256, 0, s, shared->gate, shared->up);
        RG_LAUNCHED("moe_experts (shared swiglu)");
        const MatmulView job{shared->down, shared->gate, View{reinterpret_cast<uint8_t*>(sh), ntok, h, h * 4, RG_TYPE_F32}};
        matmul(s, &job, 1, matmul_scratch);
    }
    launch(sum_pairs_k, grid(ntok * h, 256), 256, 0, s, ys, ids, weights, act.down_bias, shared ? sh : nullptr,
                                                   shared ? shared->gate_logit : View{}, y);
    RG_LAUNCHED("moe_experts (sum)");
}

void moe_combine(cudaStream_t s, const View& ys, const View& pairs, const View& weights, const View& shared,
                 const View& shared_gate, const View& y, Scratch& scratch) {
    if (weights.cols > kMaxK) throw Error("CUDA moe_combine: at most 32 experts per token");
    // the inverse of the pair list, [ntok * k]
    auto* row_of = static_cast<int32_t*>(scratch.get(size_t(weights.rows * weights.cols) * sizeof(int32_t), s));
    launch(invert_k, grid(pairs.cols, 256), 256, 0, s, pairs, row_of);
    RG_LAUNCHED("moe_combine (pairs)");
    launch(combine_k, grid(y.rows * y.cols, 256), 256, 0, s, ys, row_of, weights, shared, shared_gate, y);
    RG_LAUNCHED("moe_combine");
}

}  // namespace regolith::cuda
