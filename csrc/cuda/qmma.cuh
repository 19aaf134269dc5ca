// Products of quantized matrices on the tensor cores, for every ntok: the one way the CUDA backend computes
// a quantized y[t][r] = W[r] . x[t], so that the result depends on row r and token t only (the Backend's
// matmul contract): decode (ntok <= 16), prefill and the MoE products all run these same steps.
//
// - Activations: each token row x[t] is scaled by a power of two s[t] (the smallest >= max |x[t]|, so no
//   value overflows half precision and the scaling is exact) and rounded to f16: xh [rows][K] (acts_f16).
// - Weights: 16 rows at a time, K in chunks of kChunk elements, each block decoded by the shared
//   BlockDecoder (core/block_decode.h) to scale * q + bias and rounded to f16 in shared memory; the tokens'
//   f16 rows of the chunk are staged beside them.
// - y[t][r] = s[t] * the sum over segments of kSegment elements, in order, of the segment's sum over k steps
//   of 16, in order, of the WMMA 16x16x16 product (f32 accumulation).
//   An output element of the tensor-core product depends on its row and column only, not on where in the
//   tile they sit or on the tile's other rows and columns (checked by the conformance suite's "48 tokens
//   at once = 1 and 5 at a time" cases), so kernels may tile tokens as they like.
#pragma once

#include <cuda_fp16.h>
#include <mma.h>

#include "core/block_decode.h"
#include "cuda/common.cuh"

namespace regolith::cuda {

constexpr int kChunk = 256;           // K elements staged per step
constexpr int kChunkLd = kChunk + 8;  // row stride of staged rows in shared memory (halves; fewer bank conflicts)
constexpr int kTileHalves = 16 * kChunkLd;
// K is summed in segments of kSegment elements: each segment's products accumulate from zero, then the
// segments' sums are added in order (total = ((0 + seg 0) + seg 1) + ...), so a decode kernel may give the
// segments of few-row matrices to separate blocks and still compute what a kernel summing them in one
// block computes.
constexpr int kSegment = 2 * kChunk;
inline int64_t segments(int64_t k) { return (k + kSegment - 1) / kSegment; }

// Rows of a matrix as a kernel addresses them: row r at base + r * stride bytes, `rows` of them.
struct Rows {
    const uint8_t* base;
    int64_t rows, stride;
};

// The activations of a product: xh [rows][ld] f16 and the per-token scales s [rows].
struct HalfActs {
    __half* xh;
    float* s;
    int64_t ld;
};

// Bytes of scratch acts_f16 needs for m rows of k columns (a multiple of 256).
inline size_t half_acts_bytes(int64_t m, int64_t k) {
    return (size_t(m) * size_t(k) * 2 + size_t(m) * 4 + 255) / 256 * 256;
}
inline HalfActs half_acts_at(void* scratch, int64_t m, int64_t k) {
    auto* xh = static_cast<__half*>(scratch);
    return {xh, reinterpret_cast<float*>(xh + m * k), k};
}

// x [rows][cols] f32 -> a.xh / a.s, rows [0, x.rows). A block per row.
void acts_f16(cudaStream_t s, const View& x, const HalfActs& a);

// Stages rows [r0, r0 + 16) x blocks [b0, b0 + nblk) of `w` as f16 into sm [16][kChunkLd] (rows past the
// matrix: zeros). Run by `threads` threads numbered `tid`; the caller synchronizes.
template <class Dec>
__device__ inline void stage_weights(const Rows& w, int64_t r0, int64_t b0, int nblk, __half* sm, int tid, int threads) {
    using Block = typename Dec::Block;
    for (int task = tid; task < 16 * nblk; task += threads) {
        const int rr = task / nblk, bb = task % nblk;
        __half* dst = sm + rr * kChunkLd + bb * Dec::QK;
        const int64_t r = r0 + rr;
        if (r >= w.rows) {
            for (int i = 0; i < Dec::QK; i += 8) *reinterpret_cast<uint4*>(dst + i) = uint4{0, 0, 0, 0};
            continue;
        }
        const Block& blk = reinterpret_cast<const Block*>(w.base + r * w.stride)[b0 + bb];
        int8_t q[Dec::QK];
        float scale[Dec::NG], bias[Dec::NG];
        Dec::decode(blk, q, scale, Dec::HAS_BIAS ? bias : nullptr);
#pragma unroll
        for (int i = 0; i < Dec::QK; i += 8) {
            const int g = i / Dec::G;
            const float sc = scale[g], o = Dec::HAS_BIAS ? bias[g] : 0.0f;
            __half2 h[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                h[j] = __floats2half2_rn(sc * float(q[i + 2 * j]) + o, sc * float(q[i + 2 * j + 1]) + o);
            *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(h);
        }
    }
}

// Stages columns [k0, k0 + elems) of n rows of f16 activations into sm [n][kChunkLd]: row i is xh row
// row_of(i), or zeros where row_of(i) < 0. elems is a multiple of 16; 16-byte copies.
template <class RowOf>
__device__ inline void stage_tokens(const HalfActs& a, int n, RowOf row_of, int64_t k0, int elems, __half* sm, int tid,
                                    int threads) {
    const int vecs = elems / 8;
    for (int v = tid; v < n * vecs; v += threads) {
        const int i = v / vecs, c = (v % vecs) * 8;
        const int64_t r = row_of(i);
        *reinterpret_cast<uint4*>(sm + i * kChunkLd + c) =
            r < 0 ? uint4{0, 0, 0, 0} : *reinterpret_cast<const uint4*>(a.xh + r * a.ld + k0 + c);
    }
}

using AccFrag = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// acc[j] += the staged weights (wsm [16][kChunkLd]) times staged tokens 16 j .. 16 j + 15 (tsm), for j < nt,
// over the chunk's `elems` columns in steps of 16.
template <int NT>
__device__ inline void mma_chunk(const __half* wsm, const __half* tsm, int elems, int nt, AccFrag (&acc)[NT]) {
    using namespace nvcuda;
    for (int k = 0; k < elems; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::load_matrix_sync(a, wsm + k, unsigned(kChunkLd));
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (j >= nt) break;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
            wmma::load_matrix_sync(b, tsm + j * kTileHalves + k, unsigned(kChunkLd));
            wmma::mma_sync(acc[j], a, b, acc[j]);
        }
    }
}

// total += seg, element by element (fragments of one type hold the same elements in the same threads).
__device__ inline void add_frag(AccFrag& total, const AccFrag& seg) {
#pragma unroll
    for (int i = 0; i < total.num_elements; ++i) total.x[i] += seg.x[i];
}

// For the tile's columns i < n_cols with out_row(i) = (y row pointer, scale) not null: y[r0 + e] = scale *
// acc[e][i] for rows < n_rows. `out` is 256 floats of the warp's shared memory.
template <class OutRow>
__device__ inline void store_tile(const AccFrag& acc, float* out, int64_t r0, int64_t n_rows, OutRow out_row) {
    nvcuda::wmma::store_matrix_sync(out, acc, 16, nvcuda::wmma::mem_col_major);  // out[column][row]
    __syncwarp();
    for (int e = threadIdx.x & 31; e < 256; e += 32) {
        const int i = e / 16;
        const int64_t r = r0 + e % 16;
        float scale;
        float* y = out_row(i, scale);
        if (y && r < n_rows) y[r] = scale * out[e];
    }
    __syncwarp();
}

}  // namespace regolith::cuda
