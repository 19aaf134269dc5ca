// Matrix products y[t][r] = sum_c W[r][c] x[t][c] on the GPU, for every weight type the CPU has.
//
// Decode (ntok <= 8): one warp per output row, its lanes taking the row's blocks in turn; each block is
// decoded by the shared BlockDecoder (core/block_decode.h, the CPU's definition of the format) and dotted
// with every token's float activations, then the warp sums. Float weights (F32 / F16 / BF16) are read
// 4 elements per lane per step, coalesced.
// Prefill (ntok > 8) with quantized weights: chunks of rows are dequantized to f16 and multiplied with the
// activations rounded to f16 on the tensor cores (WMMA 16x16x16, f32 accumulation); float weights take the
// decode kernel 8 tokens at a time.
#include <cuda_fp16.h>
#include <mma.h>

#include <string>

#include "core/block_decode.h"
#include "core/types.h"
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

constexpr int kMaxTok = 8;
constexpr int kRowsPerBlock = 4;  // warps per block, one row each

template <class Dec>
__global__ void mmv_quant(View w, View x, View y, int ntok) {
    using Block = typename Dec::Block;
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    if (r >= w.rows) return;
    const int64_t nb = w.cols / Dec::QK;
    const Block* blocks = w.row<const Block>(r);
    float acc[kMaxTok] = {};
    int8_t q[Dec::QK];
    float scale[Dec::NG], bias[Dec::NG];
    for (int64_t b = lane; b < nb; b += 32) {
        Dec::decode(blocks[b], q, scale, Dec::HAS_BIAS ? bias : nullptr);
        for (int g = 0; g < Dec::NG; ++g) {
            const float s = scale[g], o = Dec::HAS_BIAS ? bias[g] : 0.0f;
            const int64_t c0 = b * Dec::QK + g * Dec::G;
#pragma unroll
            for (int t = 0; t < kMaxTok; ++t) {
                if (t >= ntok) break;
                const float* xt = x.row(t) + c0;
                float sum = 0.0f;
                for (int i = 0; i < Dec::G; ++i) sum += (s * float(q[g * Dec::G + i]) + o) * xt[i];
                acc[t] += sum;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
        if (t >= ntok) break;
        const float v = warp_sum(acc[t]);
        if (lane == 0) y.row(t)[r] = v;
    }
}

__device__ inline float load_float(const uint8_t* row, int64_t c, uint32_t type) {
    if (type == RG_TYPE_F32) return reinterpret_cast<const float*>(row)[c];
    const uint16_t h = reinterpret_cast<const uint16_t*>(row)[c];
    if (type == RG_TYPE_F16) return __half2float(__ushort_as_half(h));
    return __uint_as_float(uint32_t(h) << 16);  // BF16
}

__global__ void mmv_float(View w, View x, View y, int ntok) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    if (r >= w.rows) return;
    const uint8_t* row = w.row<const uint8_t>(r);
    float acc[kMaxTok] = {};
    for (int64_t c = lane; c < w.cols; c += 32) {
        const float wc = load_float(row, c, w.type);
#pragma unroll
        for (int t = 0; t < kMaxTok; ++t) {
            if (t >= ntok) break;
            acc[t] += wc * x.row(t)[c];
        }
    }
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
        if (t >= ntok) break;
        const float v = warp_sum(acc[t]);
        if (lane == 0) y.row(t)[r] = v;
    }
}

// Rows [r0, r0 + n) of w to f16, [n_pad][cols] (rows past n zero). One thread per block.
template <class Dec>
__global__ void dequant_f16(View w, int64_t r0, int64_t n, int64_t n_pad, __half* out) {
    using Block = typename Dec::Block;
    const int64_t nb = w.cols / Dec::QK;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_pad * nb) return;
    const int64_t r = i / nb, b = i % nb;
    __half* dst = out + r * w.cols + b * Dec::QK;
    if (r >= n) {
        for (int k = 0; k < Dec::QK; ++k) dst[k] = __float2half(0.0f);
        return;
    }
    int8_t q[Dec::QK];
    float scale[Dec::NG], bias[Dec::NG];
    Dec::decode(w.row<const Block>(r0 + r)[b], q, scale, Dec::HAS_BIAS ? bias : nullptr);
    for (int k = 0; k < Dec::QK; ++k) {
        const float v = scale[k / Dec::G] * float(q[k]) + (Dec::HAS_BIAS ? bias[k / Dec::G] : 0.0f);
        dst[k] = __float2half(v);
    }
}

// x [ntok][cols] f32 -> [m_pad][cols] f16 (rows past ntok zero).
__global__ void to_f16(View x, int64_t m_pad, __half* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= m_pad * x.cols) return;
    const int64_t t = i / x.cols, c = i % x.cols;
    out[i] = __float2half(t < x.rows ? x.row(t)[c] : 0.0f);
}

// y[t][r0 + n] = A[t] . B[n] for t < M, n < N: A [m_pad][K], B [n_pad][K] f16 row-major. Each warp one 16x16
// tile of the output, K in steps of 16.
__global__ void gemm_f16(const __half* A, const __half* B, int64_t K, int64_t M, int64_t N, int64_t m_pad,
                         int64_t n_pad, View y, int64_t r0) {
    using namespace nvcuda;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t tm = (int64_t(blockIdx.y) * 2 + (warp >> 1)) * 16, tn = (int64_t(blockIdx.x) * 2 + (warp & 1)) * 16;
    __shared__ float tile[4][16 * 16];
    if (tm >= m_pad || tn >= n_pad) return;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int64_t k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
        wmma::load_matrix_sync(a, A + tm * K + k, unsigned(K));
        wmma::load_matrix_sync(b, B + tn * K + k, unsigned(K));
        wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(tile[warp], acc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
        const int64_t t = tm + i / 16, n = tn + i % 16;
        if (t < M && n < N) y.row(t)[r0 + n] = tile[warp][i];
    }
}

template <class F>
void dispatch(uint32_t type, F&& f) {
    switch (type) {
#define RG_CASE_(T) \
    case T:         \
        return f(BlockDecoder<T>{});
        RG_FOR_EACH_QUANT_TYPE(RG_CASE_)
#undef RG_CASE_
        default:
            throw Error("CUDA matmul: no kernel for type " + std::string(type_traits(type)->name));
    }
}

bool float_type(uint32_t t) { return t == RG_TYPE_F32 || t == RG_TYPE_F16 || t == RG_TYPE_BF16; }

void decode_product(cudaStream_t s, const MatmulView& j) {
    const unsigned blocks = grid(j.w.rows, kRowsPerBlock);
    for (int64_t t0 = 0; t0 < j.x.rows; t0 += kMaxTok) {
        const int nt = int(std::min<int64_t>(kMaxTok, j.x.rows - t0));
        View x = j.x, y = j.y;
        x.base += t0 * x.stride, y.base += t0 * y.stride;
        x.rows = y.rows = nt;
        if (float_type(j.w.type)) {
            mmv_float<<<blocks, 32 * kRowsPerBlock, 0, s>>>(j.w, x, y, nt);
        } else {
            dispatch(j.w.type, [&](auto dec) {
                mmv_quant<decltype(dec)><<<blocks, 32 * kRowsPerBlock, 0, s>>>(j.w, x, y, nt);
            });
        }
        RG_LAUNCHED("matmul (decode)");
    }
}

// Rows of W per dequantized chunk: bounds the f16 scratch (8192 x 4096 x 2 bytes = 64 MB).
constexpr int64_t kChunkElements = int64_t(8192) * 4096;

void prefill_product(cudaStream_t s, const MatmulView& j, Scratch& scratch) {
    const int64_t M = j.x.rows, K = j.w.cols, m_pad = (M + 15) / 16 * 16;
    const int64_t chunk = std::max<int64_t>(16, kChunkElements / K / 16 * 16);
    const int64_t n_chunk = std::min<int64_t>(chunk, (j.w.rows + 15) / 16 * 16);
    auto* base = static_cast<__half*>(scratch.get(size_t((m_pad + n_chunk) * K) * sizeof(__half), s));
    __half* A = base;
    __half* B = base + m_pad * K;
    to_f16<<<grid(m_pad * K, 256), 256, 0, s>>>(j.x, m_pad, A);
    RG_LAUNCHED("matmul (activations to f16)");
    for (int64_t r0 = 0; r0 < j.w.rows; r0 += n_chunk) {
        const int64_t n = std::min(n_chunk, j.w.rows - r0), n_pad = (n + 15) / 16 * 16;
        dispatch(j.w.type, [&](auto dec) {
            using D = decltype(dec);
            const int64_t work = n_pad * (K / D::QK);
            dequant_f16<D><<<grid(work, 128), 128, 0, s>>>(j.w, r0, n, n_pad, B);
        });
        RG_LAUNCHED("matmul (dequantize)");
        const dim3 g(unsigned((n_pad / 16 + 1) / 2), unsigned((m_pad / 16 + 1) / 2));
        gemm_f16<<<g, 128, 0, s>>>(A, B, K, M, n, m_pad, n_pad, j.y, r0);
        RG_LAUNCHED("matmul (tensor cores)");
    }
}

}  // namespace

void matmul(cudaStream_t s, const MatmulView* jobs, int n_jobs, Scratch& scratch) {
    for (int i = 0; i < n_jobs; ++i) {
        const MatmulView& j = jobs[i];
        if (j.x.rows <= kMaxTok || float_type(j.w.type) || j.w.cols % 16 != 0)
            decode_product(s, j);
        else
            prefill_product(s, j, scratch);
    }
}

}  // namespace regolith::cuda
