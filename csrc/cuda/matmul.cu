// Matrix products y[t][r] = sum_c W[r][c] x[t][c] on the GPU, for every weight type the CPU has.
//
// Quantized weights: the tensor-core steps of cuda/qmma.cuh for every ntok (decode kernel: a block per 64
// rows and one tile of up to 16 tokens; prefill kernel: a block per 64 rows and 64 tokens), so a row's
// result does not depend on how many tokens share the product. Float weights (F32 / F16 / BF16): one warp
// per output row, an element per lane per step, coalesced, 8 tokens per block, in f32.
#include <cuda_fp16.h>
#include <mma.h>

#include <string>

#include "core/block_decode.h"
#include "core/types.h"
#include "cuda/kernels.cuh"
#include "cuda/qmma.cuh"

namespace regolith::cuda {

namespace {

constexpr int kMaxTok = 8;          // tokens per block (float weights)
constexpr int kRowsPerBlock = 4;    // warps per block, one row each (float weights)
constexpr int kFillBlocks = 512;    // decode blocks that keep the GPU's loads in flight (4 per SM of an H200)

__global__ void acts_f16_k(View x, HalfActs a) {
    const int64_t t = blockIdx.x, k = x.cols;
    const float* xr = x.row(t);
    __half* out = a.xh + t * a.ld;
    float mx = 0.0f;
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) mx = fmaxf(mx, fabsf(xr[c]));
    mx = block_max(mx);
    // the smallest power of two >= mx (1 for an all-zero row): x / s is exact and |x / s| <= 1
    int e = 0;
    const float m = frexpf(mx, &e);
    const float sc = mx > 0.0f && isfinite(mx) ? ldexpf(1.0f, m == 0.5f ? e - 1 : e) : 1.0f;
    const float inv = 1.0f / sc;
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) out[c] = __float2half(xr[c] * inv);
    if (threadIdx.x == 0) a.s[t] = sc;
}

// Decode: a block per 64 rows (a warp per 16), the ntok <= 16 tokens as one tile, and every segment of K (one
// block along y: it writes y) or segment blockIdx.y (it writes its sums to part [segments][ntok][rows], and
// sum_segments_k adds them).
template <class Dec>
__global__ void qmm_decode(Rows w, int64_t nb, HalfActs a, int64_t ntok, View y, float* part) {
    __shared__ __align__(32) __half wsm[4][kTileHalves];
    __shared__ __align__(32) __half tsm[kTileHalves];
    __shared__ __align__(32) float out[4][256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r0 = (int64_t(blockIdx.x) * 4 + warp) * 16;
    constexpr int per_chunk = kChunk / Dec::QK, per_seg = kSegment / Dec::QK;
    // this block's segments: all of them (one block along y), or segment blockIdx.y
    const int64_t seg = blockIdx.y, s_lo = gridDim.y == 1 ? 0 : seg;
    const int64_t s_hi = gridDim.y == 1 ? (nb + per_seg - 1) / per_seg : seg + 1;
    AccFrag total[1], acc[1];
    nvcuda::wmma::fill_fragment(total[0], 0.0f);
    for (int64_t sg = s_lo; sg < s_hi; ++sg) {
        const int64_t b_end = (sg + 1) * per_seg < nb ? (sg + 1) * per_seg : nb;
        nvcuda::wmma::fill_fragment(acc[0], 0.0f);
        for (int64_t b0 = sg * per_seg; b0 < b_end; b0 += per_chunk) {
            const int nblk = int(b_end - b0 < per_chunk ? b_end - b0 : per_chunk);
            __syncthreads();  // the previous chunk's products are done with the staged rows
            stage_tokens(a, 16, [&](int i) { return i < ntok ? int64_t(i) : int64_t(-1); }, b0 * Dec::QK,
                         nblk * Dec::QK, tsm, threadIdx.x, 128);
            if (r0 < w.rows) stage_weights<Dec>(w, r0, b0, nblk, wsm[warp], lane, 32);
            __syncthreads();
            if (r0 < w.rows) mma_chunk<1>(wsm[warp], tsm, nblk * Dec::QK, 1, acc);
        }
        add_frag(total[0], acc[0]);
    }
    if (r0 >= w.rows) return;
    store_tile(total[0], out[warp], r0, w.rows, [&](int i, float& sc) -> float* {
        if (i >= ntok) return nullptr;
        if (part) {
            sc = 1.0f;
            return part + (seg * ntok + i) * w.rows;
        }
        sc = a.s[i];
        return y.row(i);
    });
}

// y[t][r] = s[t] * (((0 + part[0][t][r]) + part[1][t][r]) + ...).
__global__ void sum_segments_k(const float* part, int64_t n_seg, int64_t ntok, int64_t rows, const float* s, View y) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= ntok * rows) return;
    float total = 0.0f;
    for (int64_t g = 0; g < n_seg; ++g) total += part[g * ntok * rows + i];
    y.row(i / rows)[i % rows] = s[i / rows] * total;
}

// Prefill: a block per 64 rows x 64 tokens; warp (wr, wt) takes rows 16 wr .. and tokens 32 wt .. (2 tiles).
constexpr int kPrefillRows = 64, kPrefillTok = 64;
constexpr size_t kPrefillSmem = size_t(4 + 4) * kTileHalves * sizeof(__half) + 8 * 256 * sizeof(float);

template <class Dec>
__global__ void qmm_prefill(Rows w, int64_t nb, HalfActs a, int64_t ntok, View y) {
    extern __shared__ __align__(32) uint8_t smem[];
    __half* wsm = reinterpret_cast<__half*>(smem);  // [4][kTileHalves]
    __half* tsm = wsm + 4 * kTileHalves;              // [4][kTileHalves]: 64 tokens
    float* out = reinterpret_cast<float*>(tsm + 4 * kTileHalves);  // [8][256]
    const int warp = threadIdx.x >> 5, wr = warp >> 1, wt = warp & 1;
    const int64_t rb = int64_t(blockIdx.x) * kPrefillRows, r0 = rb + 16 * wr;
    const int64_t tb = int64_t(blockIdx.y) * kPrefillTok, t0 = tb + 32 * wt;
    const int nt = t0 >= ntok ? 0 : (ntok - t0 >= 17 ? 2 : 1);
    AccFrag total[2], acc[2];
    nvcuda::wmma::fill_fragment(total[0], 0.0f);
    nvcuda::wmma::fill_fragment(total[1], 0.0f);
    constexpr int per_chunk = kChunk / Dec::QK, per_seg = kSegment / Dec::QK;
    for (int64_t s0 = 0; s0 < nb; s0 += per_seg) {
        const int64_t b_end = s0 + per_seg < nb ? s0 + per_seg : nb;
        nvcuda::wmma::fill_fragment(acc[0], 0.0f);
        nvcuda::wmma::fill_fragment(acc[1], 0.0f);
        for (int64_t b0 = s0; b0 < b_end; b0 += per_chunk) {
            const int nblk = int(b_end - b0 < per_chunk ? b_end - b0 : per_chunk);
            __syncthreads();
            stage_tokens(a, kPrefillTok, [&](int i) { return tb + i < ntok ? tb + i : int64_t(-1); }, b0 * Dec::QK,
                         nblk * Dec::QK, tsm, threadIdx.x, 256);
            for (int g = 0; g < 4; ++g)
                stage_weights<Dec>(w, rb + 16 * g, b0, nblk, wsm + g * kTileHalves, threadIdx.x, 256);
            __syncthreads();
            if (r0 < w.rows) mma_chunk<2>(wsm + wr * kTileHalves, tsm + 2 * wt * kTileHalves, nblk * Dec::QK, nt, acc);
        }
        add_frag(total[0], acc[0]);
        add_frag(total[1], acc[1]);
    }
    if (r0 >= w.rows) return;
    for (int j = 0; j < nt; ++j)
        store_tile(total[j], out + warp * 256, r0, w.rows, [&](int i, float& sc) -> float* {
            const int64_t t = t0 + 16 * j + i;
            if (t >= ntok) return nullptr;
            sc = a.s[t];
            return y.row(t);
        });
}

// Float weights: a warp per output row, tokens [8 by, +8) of the launch's.
__global__ void mmv_float(View w, View x, View y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5), t0 = int64_t(blockIdx.y) * kMaxTok;
    if (r >= w.rows) return;
    const int ntok = int(x.rows - t0 < kMaxTok ? x.rows - t0 : kMaxTok);
    const uint8_t* row = w.row<const uint8_t>(r);
    float acc[kMaxTok] = {};
    for (int64_t c = lane; c < w.cols; c += 32) {
        const float wc = load_float(row, c, w.type);
#pragma unroll
        for (int t = 0; t < kMaxTok; ++t) {
            if (t >= ntok) break;
            acc[t] += wc * x.row(t0 + t)[c];
        }
    }
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
        if (t >= ntok) break;
        const float v = warp_sum(acc[t]);
        if (lane == 0) y.row(t0 + t)[r] = v;
    }
}

void float_product(cudaStream_t s, const MatmulView& j) {
    mmv_float<<<dim3(grid(j.w.rows, kRowsPerBlock), grid(j.x.rows, kMaxTok)), 32 * kRowsPerBlock, 0, s>>>(j.w, j.x, j.y);
    RG_LAUNCHED("matmul (float weights)");
}

void quant_product(cudaStream_t s, const MatmulView& j, Scratch& scratch) {
    const int64_t M = j.x.rows, K = j.w.cols, rows = j.w.rows;
    // segments of K on their own blocks where the rows alone make too few blocks to fill the GPU
    const int64_t n_seg = M <= 16 && grid(rows, 64) < kFillBlocks ? segments(K) : 1;
    const size_t acts = half_acts_bytes(M, K);
    auto* base = static_cast<uint8_t*>(scratch.get(acts + (n_seg > 1 ? size_t(n_seg * M * rows) * 4 : 0), s));
    const HalfActs a = half_acts_at(base, M, K);
    float* part = n_seg > 1 ? reinterpret_cast<float*>(base + acts) : nullptr;
    acts_f16(s, j.x, a);
    const Rows w{j.w.base, rows, j.w.stride};
    dispatch_quant_type(j.w.type, [&](auto dec) {
        using D = decltype(dec);
        const int64_t nb = K / D::QK;
        if (M <= 16) {
            qmm_decode<D><<<dim3(grid(rows, 64), unsigned(n_seg)), 128, 0, s>>>(w, nb, a, M, j.y, part);
        } else {
            static const cudaError_t attr =
                cudaFuncSetAttribute(qmm_prefill<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPrefillSmem));
            RG_CUDA(attr);
            const dim3 g(grid(rows, kPrefillRows), grid(M, kPrefillTok));
            qmm_prefill<D><<<g, 256, kPrefillSmem, s>>>(w, nb, a, M, j.y);
        }
    });
    if (part) {
        sum_segments_k<<<grid(M * rows, 256), 256, 0, s>>>(part, n_seg, M, rows, a.s, j.y);
        RG_LAUNCHED("matmul (segment sums)");
    }
    RG_LAUNCHED("matmul (tensor cores)");
}

}  // namespace

void acts_f16(cudaStream_t s, const View& x, const HalfActs& a) {
    if (x.rows == 0) return;
    acts_f16_k<<<unsigned(x.rows), 256, 0, s>>>(x, a);
    RG_LAUNCHED("matmul (activations to f16)");
}

void matmul(cudaStream_t s, const MatmulView* jobs, int n_jobs, Scratch& scratch) {
    for (int i = 0; i < n_jobs; ++i) {
        const MatmulView& j = jobs[i];
        if (j.x.rows == 0) continue;
        if (float_type(j.w.type))
            float_product(s, j);
        else
            quant_product(s, j, scratch);
    }
}

}  // namespace regolith::cuda
