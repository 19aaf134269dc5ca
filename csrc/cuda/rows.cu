// Row ops: embedding lookup (rows dequantized by id, one thread per block of a row), gathering rows, and the
// top k of each row (one block per row, k rounds of a block-wide argmax; ties to the lower id).
#include <cfloat>
#include <string>

#include "core/block_decode.h"
#include "core/types.h"
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

template <class Dec>
__global__ void get_rows_quant(View table, View ids, float scale, int64_t repeat, View out) {
    pdl_begin();
    using Block = typename Dec::Block;
    const int64_t nb = table.cols / Dec::QK, n = ids.rows * ids.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * nb) return;
    const int64_t r = i / nb, b = i % nb;
    const int32_t id = ids.row<const int32_t>(r / ids.cols)[r % ids.cols];
    if (id < 0 || id >= table.rows) return;  // checked on the host
    int8_t q[Dec::QK];
    float sc[Dec::NG], bi[Dec::NG];
    Dec::decode(table.row<const Block>(id)[b], q, sc, Dec::HAS_BIAS ? bi : nullptr);
    for (int k = 0; k < Dec::QK; ++k) {
        float v = sc[k / Dec::G] * float(q[k]) + (Dec::HAS_BIAS ? bi[k / Dec::G] : 0.0f);
        if (scale != 1.0f) v *= scale;
        for (int64_t rep = 0; rep < repeat; ++rep) out.row(r)[rep * table.cols + b * Dec::QK + k] = v;
    }
}

__global__ void get_rows_float(View table, View ids, float scale, int64_t repeat, View out) {
    pdl_begin();
    const int64_t n = ids.rows * ids.cols, w = table.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * w) return;
    const int64_t r = i / w, c = i % w;
    const int32_t id = ids.row<const int32_t>(r / ids.cols)[r % ids.cols];
    if (id < 0 || id >= table.rows) return;
    const uint8_t* row = table.row<const uint8_t>(id);
    float v = load_float(row, c, table.type);
    if (scale != 1.0f) v *= scale;
    for (int64_t rep = 0; rep < repeat; ++rep) out.row(r)[rep * w + c] = v;
}

__global__ void gather_rows_k(View x, View rows, View out) {
    pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= out.rows * x.cols) return;
    const int64_t r = i / x.cols, c = i % x.cols;
    out.row(r)[c] = x.row(rows.row<const int32_t>(0)[r])[c];
}

// One block per row: k rounds, each the largest value not taken yet (ties: the lower id).
__global__ void top_k_k(View x, int64_t k, View ids, View values) {
    pdl_begin();
    const int64_t r = blockIdx.x;
    const float* v = x.row(r);
    __shared__ float best_v[32];
    __shared__ int32_t best_i[32];
    __shared__ int32_t taken[64];
    for (int64_t j = 0; j < k; ++j) {
        // from -inf (with the tie rule a -inf value still wins over no value): a row with fewer than k values
        // above -inf (masked logits) takes its -inf columns too, never the no-id INT32_MAX
        float bv = -INFINITY;
        int32_t bi = INT32_MAX;
        for (int64_t c = threadIdx.x; c < x.cols; c += blockDim.x) {
            bool skip = false;
            for (int64_t p = 0; p < j; ++p) skip |= taken[p] == c;
            if (skip) continue;
            if (v[c] > bv || (v[c] == bv && c < bi)) bv = v[c], bi = int32_t(c);
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < int(blockDim.x >> 5); ++w)
                if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) bv = best_v[w], bi = best_i[w];
            taken[j] = bi;
            if (ids) ids.row<int32_t>(r)[j] = bi;
            if (values) values.row(r)[j] = v[bi];
        }
        __syncthreads();
    }
}

}  // namespace

void get_rows(cudaStream_t s, const View& table, const View& ids, float scale, int64_t repeat, const View& out) {
    const int64_t n = ids.rows * ids.cols;
    if (float_type(table.type)) {
        launch(get_rows_float, grid(n * table.cols, 256), 256, 0, s, table, ids, scale, repeat, out);
    } else {
        switch (table.type) {
#define RG_CASE_(T)                                                                                       \
    case T: {                                                                                             \
        using D = BlockDecoder<T>;                                                                        \
        launch(get_rows_quant<D>, grid(n * (table.cols / D::QK), 64), 64, 0, s, table, ids, scale, repeat, out); \
        break;                                                                                            \
    }
            RG_FOR_EACH_QUANT_TYPE(RG_CASE_)
#undef RG_CASE_
            default:
                throw Error("CUDA get_rows: no kernel for type " + std::string(type_traits(table.type)->name));
        }
    }
    RG_LAUNCHED("get_rows");
}

void gather_rows(cudaStream_t s, const View& x, const View& rows, const View& out) {
    launch(gather_rows_k, grid(out.rows * x.cols, 256), 256, 0, s, x, rows, out);
    RG_LAUNCHED("gather_rows");
}

void top_k(cudaStream_t s, const View& x, int64_t k, const View& ids, const View& values) {
    if (k > 64) throw Error("CUDA top_k: k is at most 64");
    launch(top_k_k, unsigned(x.rows), 256, 0, s, x, k, ids, values);
    RG_LAUNCHED("top_k");
}

}  // namespace regolith::cuda
