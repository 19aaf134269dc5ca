// Matrix products y[t][r] = sum_c W[r][c] x[t][c] on the GPU, for every weight type the CPU has.
//
// Quantized weights: the tensor-core steps of cuda/qmma.cuh for every ntok (decode kernel: a warp per 16 rows
// and the ntok <= 16 tokens read from the f16 activations directly; prefill kernel: a block per 64 rows and
// 64 tokens staged in shared memory), so a row's result does not depend on how many tokens share the
// product. Float weights (F32 / F16 / BF16): a block per output row and 8 tokens, in f32 (cuda/float_dot.cuh).
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/block_decode.h"
#include "core/types.h"
#include "cuda/float_dot.cuh"
#include "cuda/kernels.cuh"
#include "cuda/qmma.cuh"

namespace regolith::cuda {

namespace {

constexpr int64_t kDecodeTokens = 16;  // products of at most this many tokens take the decode kernel
constexpr int kActsThreads = 1024;  // acts_f16: threads per token row
constexpr size_t kExactMaxBytes = size_t(4) << 30;  // exact products: dequantized weights per matrix

// The inputs of one activation launch: input i's rows are the launch's blocks [row0, + x.rows).
constexpr int kMaxActs = 32;
struct ActsJob {
    View x;
    HalfActs a;
    int32_t row0;
};
struct ActsJobs {
    ActsJob job[kMaxActs];
    int n;
};

// x / s[t] to f16 with s[t] the smallest power of two >= max |x[t]| (1 for an all-zero row): exact, |x / s| <= 1.
// A block per row of the table's inputs (each row on its own: converting inputs together or apart gives the
// same bits).
__global__ void acts_f16_k(ActsJobs jobs) {
    pdl_begin();
    int i = 0;
    while (i + 1 < jobs.n && int(blockIdx.x) >= jobs.job[i + 1].row0) ++i;
    const View& x = jobs.job[i].x;
    const HalfActs& a = jobs.job[i].a;
    const int64_t t = int64_t(blockIdx.x) - jobs.job[i].row0, k = x.cols;
    const float* xr = x.row(t);
    __half* out = a.xh + t * a.ld;
    const bool vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(xr) % 16 == 0;
    float mx = 0.0f;
    if (vec) {
#pragma unroll 4
        for (int64_t c = 4 * threadIdx.x; c < k; c += 4 * blockDim.x) {
            const float4 v = *reinterpret_cast<const float4*>(xr + c);
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
    } else {
        for (int64_t c = threadIdx.x; c < k; c += blockDim.x) mx = fmaxf(mx, fabsf(xr[c]));
    }
    mx = block_max(mx);
    int e = 0;
    const float m = frexpf(mx, &e);
    const float sc = mx > 0.0f && isfinite(mx) ? ldexpf(1.0f, m == 0.5f ? e - 1 : e) : 1.0f;
    const float inv = 1.0f / sc;
    if (vec) {
#pragma unroll 4
        for (int64_t c = 4 * threadIdx.x; c < k; c += 4 * blockDim.x) {
            const float4 v = *reinterpret_cast<const float4*>(xr + c);
            __half2 h[2] = {__floats2half2_rn(v.x * inv, v.y * inv), __floats2half2_rn(v.z * inv, v.w * inv)};
            *reinterpret_cast<uint2*>(out + c) = *reinterpret_cast<const uint2*>(h);
        }
    } else {
        for (int64_t c = threadIdx.x; c < k; c += blockDim.x) out[c] = __float2half(xr[c] * inv);
    }
    if (threadIdx.x == 0) a.s[t] = sc;
}

// One product of a decode launch: y = W x for rows w and the ntok rows of x's f16 form a, split into n_seg
// segments of K (one: no split) whose sums go to part [n_seg][ntok][rows]; each of its tiles of 64 rows has
// per_tile = ceil(n_seg / spb) blocks of spb segments (one block without a split), the launch's blocks
// [block0, + tiles per_tile), tile-major, which count themselves in counters [counter0, + tiles).
struct DecodeJob {
    Rows w;
    View y;
    float* part;
    HalfActs a;
    int32_t ntok, n_seg, spb, tiles, block0, counter0;
};

// The products of one decode launch: every job has the weight type and K (nb blocks), each its own input
// (a MoE layer's experts: each its rows of the packed activations), so one kernel computes them all (before,
// a launch each, in series). The table is a kernel parameter (at most 4 KiB).
constexpr int kMaxDecodeJobs = 32;
static_assert(kMaxDecodeJobs * kFillBlocks <= kSegmentCounters, "a counter for every split tile of a launch");
struct DecodeJobs {
    DecodeJob job[kMaxDecodeJobs];
    int n;
};
static_assert(sizeof(DecodeJobs) <= 4096 && sizeof(ActsJobs) <= 4096, "kernel parameters of at most 4 KiB");

// Decode: a warp per 16 rows (4 per block), the ntok <= 8 NT tokens as NT fragment tiles, and every chunk of K
// (no split: the block writes y) or the chunks of its spb segments (it writes each segment's sums to part, and
// the tile's last block adds them: last_of_segments). Without a split, no block-wide barrier: warps return as
// they finish.
template <class Dec, int NT>
__global__ void __launch_bounds__(kDecodeThreads, (kDecodeMinBlocks<Dec, NT>))
    qmm_decode(DecodeJobs jobs, int64_t nb, unsigned* counters) {
    pdl_begin();
    extern __shared__ __align__(16) uint8_t smem[];
    int k = 0;
    while (k + 1 < jobs.n && int64_t(blockIdx.x) >= jobs.job[k + 1].block0) ++k;
    const DecodeJob& j = jobs.job[k];
    const Rows& w = j.w;
    const HalfActs& a = j.a;
    const int64_t ntok = j.ntok;
    float* part = j.n_seg > 1 ? j.part : nullptr;
    const int64_t local = int64_t(blockIdx.x) - j.block0, tile = local % j.tiles, seg0 = local / j.tiles * j.spb;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r0 = (tile * 4 + warp) * 16;
    if (r0 < w.rows) {
        uint8_t* raw = smem + warp * decode_smem_bytes<Dec>();
        __half* tile_sm = reinterpret_cast<__half*>(raw + 16 * Staging<Dec>::kRawLd);
        int64_t tok[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) tok[t] = 8 * t + lane / 4 < ntok ? 8 * t + lane / 4 : -1;
        if (part) {
            int64_t c_lo, c_hi;
            segment_chunks(chunks<Dec>(nb), seg0, j.spb, c_lo, c_hi);
            const auto seg_end = [&](int64_t c, const float(&acc)[NT][4]) {
                const int64_t seg = c / kSegmentChunks;
                store_total<NT>(acc, r0, w.rows, [&](int i, int64_t r, float v) {
                    if (i < ntok) part[(seg * ntok + i) * w.rows + r] = v;
                });
            };
            warp_segments<Dec, NT>(w, r0, nb, c_lo, c_hi, a, tok, raw, tile_sm, seg_end);
        } else {
            float total[NT][4];
            warp_product<Dec, NT>(w, r0, nb, 0, chunks<Dec>(nb), a, tok, raw, tile_sm, total);
            store_total<NT>(total, r0, w.rows, [&](int i, int64_t r, float v) {
                if (i < ntok) j.y.row(i)[r] = a.s[i] * v;
            });
            return;
        }
    } else if (!part) {
        return;
    }
    if (!last_of_segments(counters + j.counter0 + tile, (j.n_seg + j.spb - 1) / j.spb)) return;
    // y[t][r] = s[t] * (((0 + part[0][t][r]) + part[1][t][r]) + ...) for the tile's 64 rows
    const int64_t rb = tile * 64;
    for (int64_t i = threadIdx.x; i < 64 * ntok; i += blockDim.x) {
        const int64_t t = i / 64, r = rb + i % 64;
        if (r >= w.rows) continue;
        j.y.row(t)[r] = a.s[t] * sum_segments(part + t * w.rows + r, ntok * w.rows, j.n_seg);
    }
}

// Prefill: a block per 64 rows x 64 tokens; warp (wr, wt) takes rows 16 wr .. and tokens 32 wt .. (4 tiles
// of 8). Shared memory: the raw chunk [64][kRawLd], its f16 rows [64][kChunkLd], the tokens [64][kChunkLd].
constexpr int kPrefillRows = 64, kPrefillTok = 64;

template <class Dec>
constexpr size_t prefill_smem_bytes() {
    return size_t(kPrefillRows) * Staging<Dec>::kRawLd + size_t(kPrefillRows + kPrefillTok) * kChunkLd * sizeof(__half);
}

template <class Dec>
__global__ void qmm_prefill(Rows w, int64_t nb, HalfActs a, int64_t ntok, View y) {
    pdl_begin();
    using S = Staging<Dec>;
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t* raw = smem;
    __half* wsm = reinterpret_cast<__half*>(raw + kPrefillRows * S::kRawLd);
    __half* tsm = wsm + kPrefillRows * kChunkLd;
    const int warp = threadIdx.x >> 5, wr = warp >> 1, wt = warp & 1;
    const int64_t rb = int64_t(blockIdx.x) * kPrefillRows, tb = int64_t(blockIdx.y) * kPrefillTok;
    const int64_t t0 = tb + 32 * wt;
    const int nt = t0 >= ntok ? 0 : int((ntok - t0 + 7) / 8 < 4 ? (ntok - t0 + 7) / 8 : 4);  // live 8-token tiles
    float total[4][4], acc[4][4];
    for (int j = 0; j < 4; ++j)
        for (int e = 0; e < 4; ++e) total[j][e] = 0.0f, acc[j][e] = 0.0f;
    const int64_t nc = chunks<Dec>(nb);
    for (int64_t c = 0; c < nc; ++c) {
        const int64_t b0 = c * S::kPerChunk;
        const int nblk = int(nb - b0 < S::kPerChunk ? nb - b0 : S::kPerChunk), elems = nblk * Dec::QK;
        __syncthreads();  // the previous chunk's products are done with the staged rows
        for (int i = threadIdx.x; i < kPrefillRows * S::kGranules; i += blockDim.x)
            *reinterpret_cast<uint4*>(raw + (i / S::kGranules) * S::kRawLd + (i % S::kGranules) * 16) =
                raw_piece<Dec>(w, rb, b0, nblk, i / S::kGranules, i % S::kGranules);
        // the lane-decoded types' steps take whole tasks, zero past the chunk's elements (mma_column's order)
        const int cols = 16 * chunk_steps<Dec>(elems), vecs = cols / 8;
        for (int v = threadIdx.x; v < kPrefillTok * vecs; v += blockDim.x) {
            const int i = v / vecs, col = (v % vecs) * 8;
            const int64_t t = tb + i;
            const uint4 x = t < ntok && col < elems ? *reinterpret_cast<const uint4*>(a.xh + t * a.ld + b0 * Dec::QK + col)
                                                    : uint4{0, 0, 0, 0};
            if constexpr (kLaneDecode<Dec>)
                store_mma_columns(tsm + i * kChunkLd, col, x);
            else
                *reinterpret_cast<uint4*>(tsm + i * kChunkLd + col) = x;
        }
        __syncthreads();
        decode_chunk<Dec, kPrefillRows>(w, rb, b0, nblk, raw, wsm, threadIdx.x, blockDim.x);
        __syncthreads();
        if (nt > 0 && rb + 16 * wr < w.rows) {
            for (int k = 0; k < cols; k += 16) {
                uint32_t af[4], bf[4][2];
                load_a(wsm + 16 * wr * kChunkLd, kChunkLd, k, af);
                load_b2(tsm + 32 * wt * kChunkLd, k, bf[0], bf[1]);
                if (nt > 2) load_b2(tsm + (32 * wt + 16) * kChunkLd, k, bf[2], bf[3]);
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (j < nt) mma16816(acc[j], af, bf[j]);
            }
        }
        if (segment_ends(c) || c + 1 == nc)
            for (int j = 0; j < 4; ++j)
                for (int e = 0; e < 4; ++e) total[j][e] += acc[j][e], acc[j][e] = 0.0f;
    }
    if (nt == 0) return;
    store_total<4>(total, rb + 16 * wr, w.rows, [&](int i, int64_t r, float v) {
        const int64_t t = t0 + i;
        if (t < ntok) y.row(t)[r] = a.s[t] * v;
    });
}

// Float weights: a block per output row r = blockIdx.x and tokens [8 by, +8) of the launch's (float_row_dot).
__global__ void mmv_float(View w, View x, View y) {
    pdl_begin();
    const int64_t r = blockIdx.x, t0 = int64_t(blockIdx.y) * kFloatTok;
    const int ntok = int(x.rows - t0 < kFloatTok ? x.rows - t0 : kFloatTok);
    const float v = float_row_dot(w.row<const uint8_t>(r), w.type, w.cols, ntok, [&](int t) { return x.row(t0 + t); });
    if (threadIdx.x < unsigned(ntok)) y.row(t0 + threadIdx.x)[r] = v;
}

void float_product(cudaStream_t s, const MatmulView& j) {
    launch(mmv_float, dim3(unsigned(j.w.rows), grid(j.x.rows, kFloatTok)), 128, 0, s, j.w, j.x, j.y);
    RG_LAUNCHED("matmul (float weights)");
}

// Segments of K on their own blocks where the rows alone make too few blocks to fill the GPU (decode).
int64_t product_segments(int64_t M, int64_t K, int64_t rows) {
    static_assert(kFillBlocks <= kSegmentCounters, "a counter for every tile of a split product");
    return M <= kDecodeTokens && grid(rows, 64) < kFillBlocks ? segments(K) : 1;
}

// Scratch of one quantized product's segment sums (decode products split in segments), bytes.
size_t part_bytes(const MatmulView& j) {
    const int64_t M = j.x.rows, K = j.w.cols, rows = j.w.rows, n_seg = product_segments(M, K, rows);
    return n_seg > 1 ? size_t(n_seg * M * rows) * 4 : 0;
}

bool same_view(const View& a, const View& b) {
    return a.base == b.base && a.rows == b.rows && a.cols == b.cols && a.stride == b.stride && a.type == b.type;
}

// y = W x for jobs [0, n) (decode, n <= kMaxDecodeJobs, one weight type and K, each x of at most
// kDecodeTokens rows) in one kernel, with job i's f16 activations a[i]; part: room for their segment sums
// (the sum of part_bytes).
void decode_products(cudaStream_t s, const MatmulView* const* js, const HalfActs* const* a, int n, uint8_t* part) {
    const int64_t K = js[0]->w.cols;
    int64_t units = 0;  // tiles times segments of the split jobs
    for (int i = 0; i < n; ++i) {
        const int64_t n_seg = product_segments(js[i]->x.rows, K, js[i]->w.rows);
        if (n_seg > 1) units += grid(js[i]->w.rows, 64) * n_seg;
    }
    const int64_t spb = segments_per_block(units);
    DecodeJobs jobs{};
    jobs.n = n;
    int64_t blocks = 0, counters = 0, M = 0;
    for (int i = 0; i < n; ++i) {
        const MatmulView& j = *js[i];
        const int64_t tiles = grid(j.w.rows, 64), n_seg = product_segments(j.x.rows, K, j.w.rows);
        const int64_t job_spb = n_seg > 1 ? std::min(spb, n_seg) : 1;
        jobs.job[i] = DecodeJob{Rows{j.w.base, j.w.rows, j.w.stride}, j.y, reinterpret_cast<float*>(part), *a[i],
                                int32_t(j.x.rows), int32_t(n_seg), int32_t(job_spb), int32_t(tiles), int32_t(blocks),
                                int32_t(counters)};
        part += part_bytes(j);
        blocks += tiles * ((n_seg + job_spb - 1) / job_spb);
        if (n_seg > 1) counters += tiles;
        M = std::max(M, j.x.rows);
    }
    dispatch_quant_type(js[0]->w.type, [&](auto dec) {
        using D = decltype(dec);
        constexpr size_t smem = 4 * decode_smem_bytes<D>();
        if (M <= 8)
            launch(qmm_decode<D, 1>, unsigned(blocks), kDecodeThreads, smem, s, jobs, K / D::QK, segment_counters());
        else
            launch(qmm_decode<D, 2>, unsigned(blocks), kDecodeThreads, smem, s, jobs, K / D::QK, segment_counters());
    });
    RG_LAUNCHED("matmul (tensor cores, decode)");
}

// y = W x, prefill, with x's f16 form `a` (acts_f16).
void prefill_product(cudaStream_t s, const MatmulView& j, const HalfActs& a) {
    const Rows w{j.w.base, j.w.rows, j.w.stride};
    dispatch_quant_type(j.w.type, [&](auto dec) {
        using D = decltype(dec);
        const dim3 g(grid(j.w.rows, kPrefillRows), grid(j.x.rows, kPrefillTok));
        launch(qmm_prefill<D>, g, 256, prefill_smem_bytes<D>(), s, w, j.w.cols / D::QK, a, j.x.rows, j.y);
    });
    RG_LAUNCHED("matmul (tensor cores)");
}

// out [rows][nb QK] = the blocks of w's rows as f32, a thread per block.
template <class Dec>
__global__ void dequant_rows_k(View w, int64_t nb, float* out) {
    pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= w.rows * nb) return;
    const int64_t r = i / nb, b = i % nb;
    const auto& blk = reinterpret_cast<const typename Dec::Block*>(w.row<const uint8_t>(r))[b];
    int8_t q[Dec::QK];
    float scale[Dec::NG], bias[Dec::NG];
    Dec::decode(blk, q, scale, Dec::HAS_BIAS ? bias : nullptr);
    float* y = out + r * nb * Dec::QK + b * Dec::QK;
    for (int j = 0; j < Dec::QK; ++j) {
        const float v = __fmul_rn(scale[j / Dec::G], float(q[j]));
        y[j] = Dec::HAS_BIAS ? __fadd_rn(v, bias[j / Dec::G]) : v;
    }
}

}  // namespace

unsigned* segment_counters() {
    static unsigned* counters = [] {
        unsigned* c = nullptr;
        RG_CUDA(cudaMalloc(&c, kSegmentCounters * sizeof(unsigned)));
        RG_CUDA(cudaMemset(c, 0, kSegmentCounters * sizeof(unsigned)));
        RG_CUDA(cudaDeviceSynchronize());
        return c;
    }();
    return counters;
}

void init_matmul_kernels() {
    segment_counters();
#define RG_INIT_(T)                                                                                  \
    {                                                                                                \
        using D = BlockDecoder<T>;                                                                   \
        allow_smem(qmm_decode<D, 1>, 4 * decode_smem_bytes<D>(), !kLaneDecode<D>);                   \
        allow_smem(qmm_decode<D, 2>, 4 * decode_smem_bytes<D>());                                    \
        allow_smem(qmm_prefill<D>, prefill_smem_bytes<D>());                                         \
    }
    RG_FOR_EACH_QUANT_TYPE(RG_INIT_)
#undef RG_INIT_
}

void acts_f16(cudaStream_t s, const View& x, const HalfActs& a) {
    if (x.rows == 0) return;
    ActsJobs jobs{};
    jobs.job[0] = ActsJob{x, a, 0};
    jobs.n = 1;
    launch(acts_f16_k, unsigned(x.rows), kActsThreads, 0, s, jobs);
    RG_LAUNCHED("matmul (activations to f16)");
}

View dequantized(cudaStream_t s, const View& w, Scratch& scratch, size_t max_bytes) {
    const size_t bytes = size_t(w.rows) * size_t(w.cols) * sizeof(float);
    if (bytes > max_bytes)
        throw Error("exact activations on cuda: " + std::to_string(bytes) + " bytes of dequantized weights, at most " +
                    std::to_string(max_bytes) + " (a verification mode for small models)");
    auto* out = static_cast<float*>(scratch.get(std::max<size_t>(bytes, 256), s));
    dispatch_quant_type(w.type, [&](auto dec) {
        using D = decltype(dec);
        const int64_t nb = w.cols / D::QK;
        launch(dequant_rows_k<D>, grid(w.rows * nb, 128), 128, 0, s, w, nb, out);
    });
    RG_LAUNCHED("matmul (exact: dequantize)");
    return View{reinterpret_cast<uint8_t*>(out), w.rows, w.cols, w.cols * int64_t(sizeof(float)), RG_TYPE_F32};
}

void matmul(cudaStream_t s, const MatmulView* jobs, int n_jobs, Scratch& scratch) {
    if (exact_activations()) {
        for (int i = 0; i < n_jobs; ++i) {
            const MatmulView& j = jobs[i];
            if (j.x.rows == 0) continue;
            float_product(s, float_type(j.w.type) ? j : MatmulView{dequantized(s, j.w, scratch, kExactMaxBytes), j.x, j.y});
        }
        return;
    }
    // The quantized jobs' distinct inputs, each converted to f16 once (one launch for up to kMaxActs of them),
    // then the products: prefill jobs a launch each; decode jobs of one weight type and K together, in
    // launches of up to kMaxDecodeJobs. Jobs are independent (the Backend's contract), so their order is free.
    // scratch: every distinct input's f16 form, then the segment sums of the largest decode launch (launches
    // on the stream run one after another).
    std::vector<View> inputs;
    std::vector<size_t> input_at;  // scratch offset of each distinct input's f16 form
    std::vector<int> input_of(size_t(n_jobs), -1);
    size_t acts = 0;
    for (int i = 0; i < n_jobs; ++i) {
        const MatmulView& j = jobs[i];
        if (j.x.rows == 0) continue;
        if (float_type(j.w.type)) {
            float_product(s, j);
            continue;
        }
        int k = 0;
        while (k < int(inputs.size()) && !same_view(inputs[size_t(k)], j.x)) ++k;
        if (k == int(inputs.size())) {
            inputs.push_back(j.x);
            input_at.push_back(acts);
            acts += half_acts_bytes(j.x.rows, j.x.cols);
        }
        input_of[size_t(i)] = k;
    }
    if (inputs.empty()) return;
    // decode launches: jobs grouped by weight type and K, in order of first appearance
    std::vector<std::vector<int>> launches;
    for (int i = 0; i < n_jobs; ++i) {
        if (input_of[size_t(i)] < 0 || jobs[i].x.rows > kDecodeTokens) continue;
        auto g = std::find_if(launches.begin(), launches.end(), [&](const std::vector<int>& l) {
            return int(l.size()) < kMaxDecodeJobs && jobs[l[0]].w.type == jobs[i].w.type && jobs[l[0]].w.cols == jobs[i].w.cols;
        });
        if (g == launches.end())
            launches.push_back({i});
        else
            g->push_back(i);
    }
    size_t parts = 0;
    for (const auto& g : launches) {
        size_t p = 0;
        for (int i : g) p += part_bytes(jobs[i]);
        parts = std::max(parts, p);
    }
    auto* base = static_cast<uint8_t*>(scratch.get(acts + parts, s));
    std::vector<HalfActs> half(inputs.size());
    for (size_t k = 0; k < inputs.size(); ++k) half[k] = half_acts_at(base + input_at[k], inputs[k].rows, inputs[k].cols);
    for (size_t k0 = 0; k0 < inputs.size(); k0 += kMaxActs) {
        ActsJobs aj{};
        int32_t rows = 0;
        for (size_t k = k0; k < std::min(inputs.size(), k0 + kMaxActs); ++k) {
            aj.job[aj.n++] = ActsJob{inputs[k], half[k], rows};
            rows += int32_t(inputs[k].rows);
        }
        launch(acts_f16_k, unsigned(rows), kActsThreads, 0, s, aj);
        RG_LAUNCHED("matmul (activations to f16)");
    }
    for (int i = 0; i < n_jobs; ++i)
        if (input_of[size_t(i)] >= 0 && jobs[i].x.rows > kDecodeTokens) prefill_product(s, jobs[i], half[size_t(input_of[size_t(i)])]);
    for (const auto& g : launches) {
        std::vector<const MatmulView*> js;
        std::vector<const HalfActs*> as;
        for (int i : g) js.push_back(jobs + i), as.push_back(&half[size_t(input_of[size_t(i)])]);
        decode_products(s, js.data(), as.data(), int(g.size()), base + acts);
    }
}

}  // namespace regolith::cuda
