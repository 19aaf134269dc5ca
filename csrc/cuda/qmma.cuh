// Products of quantized matrices on the tensor cores, for every ntok: the one way the CUDA backend computes
// a quantized y[t][r] = W[r] . x[t], so that the result depends on row r and token t only (the Backend's
// matmul contract): decode (ntok <= 16), prefill and the MoE products all run these same steps.
//
// - Activations: each token row x[t] is scaled by a power of two s[t] (the smallest >= max |x[t]|, so no
//   value overflows half precision and the scaling is exact) and rounded to f16: xh [rows][K] (acts_f16).
// - Weights: 16 rows at a time, K in chunks of kChunk elements, decoded by the shared BlockDecoder
//   (core/block_decode.h) to scale * q + bias rounded to f16. The types decoded 32 elements a task
//   (kLaneDecode) are decoded by the decode kernel's lanes from global memory straight into their tensor-core
//   fragments; the others (and the prefill / MoE tiles) are copied to shared memory with aligned 16-byte
//   loads and decoded there, 32 elements a lane (decode_part) where the type has parts, a block a lane
//   otherwise.
// - y[t][r] = s[t] * the sum over segments of kSegment elements, in order, of the segment's sum over k steps
//   of 16, in order (the order of K in a step: kLaneDecode below), of the tensor-core product mma.m16n8k16
//   (f16 inputs, f32 accumulation).
//   An output element of that product depends on its row and column only, not on where in the tile they
//   sit or on the tile's other rows and columns (checked by the conformance suite's "48 tokens at once =
//   1 and 5 at a time" cases), so kernels may tile tokens as they like.
#pragma once

#include <cuda/atomic>
#include <cuda_fp16.h>

#include "core/block_decode.h"
#include "cuda/common.cuh"

namespace regolith::cuda {

constexpr int kChunk = 256;           // K elements staged per step
constexpr int kChunkLd = kChunk + 8;  // row stride of staged f16 rows in shared memory (halves: 528 bytes, so
                                      // 8 rows' 16-byte pieces at one column fall in distinct banks)
// K is summed in segments of kSegment elements: each segment's products accumulate from zero, then the
// segments' sums are added in order (total = ((0 + seg 0) + seg 1) + ...), so a decode kernel may give the
// segments of few-row matrices to separate blocks and still compute what a kernel summing them in one
// block computes. A segment is kSegmentChunks chunks: one, so that a decode product of few rows has as many
// blocks as chunks (each warp's chain of dependent loads, decodes and products is what a decode waits for).
constexpr int kSegmentChunks = 1;
constexpr int kSegment = kSegmentChunks * kChunk;
__host__ __device__ constexpr bool segment_ends(int64_t c) { return (c + 1) % kSegmentChunks == 0; }
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

// x [rows][cols] f32 -> a.xh / a.s, rows [0, x.rows).
void acts_f16(cudaStream_t s, const View& x, const HalfActs& a);

// Exact products (exact_activations(), core/backend.h): w's rows dequantized to f32 in scratch, each value
// scale * q + bias with the CPU's two roundings (no fused multiply-add), so the products of the result are
// those of an F32 copy of w. at most max_bytes of f32 (an Error past it).
View dequantized(cudaStream_t s, const View& w, Scratch& scratch, size_t max_bytes);

// How a chunk of type Dec is staged: per row, kRowBytes of raw blocks, read as kGranules aligned 16-byte
// pieces (one more than the bytes need: the row's blocks may start anywhere in a piece) into kRawLd bytes
// of shared memory (4 banks past a multiple of 32: the 8 rows a quarter-warp reads fall in distinct banks);
// then decoded in tasks of kTaskElems elements.
template <class Dec>
struct Staging {
    using Block = typename Dec::Block;
    static constexpr int kPerChunk = kChunk / Dec::QK;  // blocks per chunk
    static constexpr int kRowBytes = kPerChunk * int(sizeof(Block));
    static constexpr int kGranules = (kRowBytes + 15) / 16 + 1;
    static constexpr int kRawLd = (kGranules * 16 + 111) / 128 * 128 + 16;
    static constexpr bool kParts = has_decode_part<Dec>::value;
    static constexpr int kTaskElems = kParts ? 32 : Dec::QK;
    // whole small blocks are read from shared memory as aligned words into registers (fewer, wider loads
    // than the decoder's byte and halfword reads of a block at any address)
    static constexpr bool kWordLoad = !kParts && sizeof(Block) <= 64;
    static_assert(Dec::QK <= kChunk && kChunk % Dec::QK == 0, "whole blocks per chunk");
};

// The order of K in the tensor-core steps. A chunk is summed in steps of 16 elements; in the lane-decoded
// types (kLaneDecode: those whose 32-element tasks decode on their own, a part or a block) step ks = 8 h + s
// takes, at the fragment positions 2t, 2t + 1, 2t + 8, 2t + 9 of lane t = 0..3 of each row (the PTX layout
// below), elements 4 s + 0, 1, 2, 3 of the chunk's task t + 4 h: so a decode lane multiplies the codes of its
// own two tasks, decoded in registers straight into its fragments, with no shared memory. A chunk of at
// most 4 tasks (a short last chunk of K) takes 8 steps, others 16, the tasks past its end zero. The other
// types take step ks = elements [16 ks, + 16) in order. Every kernel takes the same steps (prefill stages
// its tiles at mma_column), so a product's bits do not depend on which kernel computed it.
template <class Dec>
constexpr bool kLaneDecode = Staging<Dec>::kTaskElems == 32;

// The steps' tasks of a chunk of `elems` elements (lane-decoded types): 4 or 8.
__host__ __device__ constexpr int lane_tasks(int elems) { return elems <= 4 * 32 ? 4 : 8; }

// The 16-element steps of a chunk of `elems` elements (a multiple of the type's block).
template <class Dec>
__host__ __device__ constexpr int chunk_steps(int elems) {
    return kLaneDecode<Dec> ? 2 * lane_tasks(elems) : elems / 16;
}

// The column of a staged f16 tile (16 per step) that element e of a lane-decoded chunk sits at.
__host__ __device__ constexpr int mma_column(int e) {
    return 16 * (8 * ((e >> 5) >> 2) + ((e >> 2) & 7)) + 2 * ((e >> 5) & 3) + (e & 1) + 8 * ((e >> 1) & 1);
}

// Stores elements e .. e + 7 (e a multiple of 8) of a lane-decoded chunk, 4 words of f16 pairs, at their
// columns of the staged row `row`.
__device__ inline void store_mma_columns(__half* row, int e, const uint4& h) {
    const int c0 = mma_column(e), c1 = mma_column(e + 4);
    *reinterpret_cast<uint32_t*>(row + c0) = h.x;
    *reinterpret_cast<uint32_t*>(row + c0 + 8) = h.y;
    *reinterpret_cast<uint32_t*>(row + c1) = h.z;
    *reinterpret_cast<uint32_t*>(row + c1 + 8) = h.w;
}

// The first byte of row r's blocks from b0 on.
__device__ inline const uint8_t* chunk_start(const Rows& w, int64_t r, int64_t b0, int block_bytes) {
    return w.base + r * w.stride + b0 * block_bytes;
}

// Piece g of row rr's raw chunk (rows r0 + rr of w, nblk blocks from b0): the aligned 16 bytes at
// (start & ~15) + 16 g, or zeros past the row's bytes or the matrix. A piece may extend past the row's
// last byte, never past its buffer: buffers are allocated in multiples of 256 bytes (CudaBackend::alloc).
template <class Dec>
__device__ inline uint4 raw_piece(const Rows& w, int64_t r0, int64_t b0, int nblk, int rr, int g) {
    using S = Staging<Dec>;
    const int64_t r = r0 + rr;
    if (r >= w.rows) return uint4{0, 0, 0, 0};
    const uint8_t* start = chunk_start(w, r, b0, int(sizeof(typename S::Block)));
    const uintptr_t first = reinterpret_cast<uintptr_t>(start) & ~uintptr_t(15);
    const uintptr_t piece = first + 16 * uintptr_t(g);
    if (piece >= reinterpret_cast<uintptr_t>(start) + uintptr_t(nblk) * sizeof(typename S::Block)) return uint4{0, 0, 0, 0};
    return __ldg(reinterpret_cast<const uint4*>(piece));
}

// A block at any address p, read as the aligned words that hold its bytes (none past its last byte's word:
// the block may end its buffer) and shifted into place in registers; from device memory through the
// read-only cache where GLOBAL, else from shared memory.
template <class Block, bool GLOBAL>
__device__ inline Block block_words(const uint8_t* p) {
    constexpr int kWords = int(sizeof(Block) + 3) / 4;
    const auto* a = reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
    const unsigned off = unsigned(reinterpret_cast<uintptr_t>(p) & 3);
    const auto word = [&](int i) {
        if constexpr (GLOBAL) return __ldg(a + i);
        else return a[i];
    };
    uint32_t w[kWords + 1];
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = word(i);
    w[kWords] = off + sizeof(Block) > 4u * kWords ? word(kWords) : 0u;
    union {
        uint32_t u[kWords];
        Block b;
    } out;
#pragma unroll
    for (int i = 0; i < kWords; ++i) out.u[i] = __funnelshift_r(w[i], w[i + 1], off * 8);
    return out.b;
}

// 8 codes q times scale sc as f16: f16(sc * q + bias), one rounding of the f32 value, as 4 words of f16
// pairs (codes 0-1, 2-3, 4-5, 6-7). Where sc is an f16 value and there is no bias, the product is exact in
// f32, so the f16 product (HMUL2 of q and sc as f16, one rounding) is the same number: computed that way,
// without the int-to-float and float-to-half conversions.
template <bool HAS_BIAS>
__device__ inline uint4 codes_half8(const int8_t* q, float sc, float o) {
    __half2 h[4];
    const __half hs = __float2half_rn(sc);
    if (!HAS_BIAS && __half2float(hs) == sc) {
        uint32_t b[2];
        memcpy(b, q, 8);
        const __half2 s2 = __half2half2(hs), off = __float2half2_rn(1152.0f);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            // bytes 2j, 2j + 1 as the f16 values 1024 + (q + 128), then minus 1152: q exactly
            const uint32_t u = b[j >> 1] ^ 0x80808080u;
            const uint32_t f = __byte_perm(u, 0x64646464u, (j & 1) ? 0x7372 : 0x7170);
            h[j] = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&f), off), s2);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(sc * float(q[2 * j]) + o, sc * float(q[2 * j + 1]) + o);
    }
    uint4 out;
    memcpy(&out, h, 16);
    return out;
}

// Decodes elements [e_lo, e_hi) of the raw chunk of ROWS rows (raw [ROWS][kRawLd], rows r0.. of w, nblk
// blocks from b0; e_lo and e_hi multiples of the type's task) into f16 rows tile [ROWS][ld], tasks shared by
// `threads` threads numbered `tid`: element e at column e - e_lo, or, for the lane-decoded types, the whole
// chunk at column mma_column(e), with zeros where lane_steps' steps take elements past the chunk's. Rows
// past the matrix are left as they are (their products are never stored).
template <class Dec, int ROWS>
__device__ inline void decode_chunk(const Rows& w, int64_t r0, int64_t b0, int nblk, const uint8_t* raw, __half* tile,
                                    int tid, int threads, int ld = kChunkLd, int e_lo = 0, int e_hi = kChunk) {
    using S = Staging<Dec>;
    using Block = typename S::Block;
    constexpr int QK = Dec::QK, TE = S::kTaskElems, NGT = TE / Dec::G;
    const int elems = nblk * QK, hi = e_hi < elems ? e_hi : elems, p0 = e_lo / TE;
    // the lane-decoded types' steps also take the zero tasks up to lane_tasks
    const int per_row = (kLaneDecode<Dec> ? lane_tasks(elems) * 32 : hi - e_lo) / TE;
    for (int task = tid; task < ROWS * per_row; task += threads) {
        const int rr = task % ROWS, part = p0 + task / ROWS;
        if (r0 + rr >= w.rows) continue;
        uint4 h[TE / 8];
        if (part * TE >= hi) {
#pragma unroll
            for (int i = 0; i < TE / 8; ++i) h[i] = uint4{0, 0, 0, 0};
        } else {
            const int off = int(reinterpret_cast<uintptr_t>(chunk_start(w, r0 + rr, b0, int(sizeof(Block)))) & 15);
            const int blk = part * TE / QK, c = (part * TE % QK) / 32;
            const uint8_t* at = raw + rr * S::kRawLd + off + blk * int(sizeof(Block));
            int8_t q[TE];
            float scale[NGT], bias[NGT];
            if constexpr (S::kParts) {
                Dec::decode_part(*reinterpret_cast<const Block*>(at), c, q, scale, Dec::HAS_BIAS ? bias : nullptr);
            } else if constexpr (S::kWordLoad) {
                const Block b = block_words<Block, false>(at);
                Dec::decode(b, q, scale, Dec::HAS_BIAS ? bias : nullptr);
            } else {
                Dec::decode(*reinterpret_cast<const Block*>(at), q, scale, Dec::HAS_BIAS ? bias : nullptr);
            }
#pragma unroll
            for (int i = 0; i < TE; i += 8)
                h[i / 8] = codes_half8<Dec::HAS_BIAS>(q + i, scale[i / Dec::G], Dec::HAS_BIAS ? bias[i / Dec::G] : 0.0f);
        }
        __half* row = tile + rr * ld;
        if constexpr (kLaneDecode<Dec>) {
#pragma unroll
            for (int i = 0; i < TE / 8; ++i) store_mma_columns(row, part * TE + 8 * i, h[i]);
        } else {
#pragma unroll
            for (int i = 0; i < TE / 8; ++i) *reinterpret_cast<uint4*>(row + part * TE - e_lo + 8 * i) = h[i];
        }
    }
}

// c += a b: the tensor cores' 16 x 8 x 16 product, f16 inputs and f32 accumulation, in the PTX fragment
// layout (lane l = 4 g + t: a = A rows g, g + 8 x columns 2t, 2t + 1, 2t + 8, 2t + 9; b = B columns g x rows
// 2t, 2t + 1, 2t + 8, 2t + 9; c = C rows g, g + 8 x columns 2t, 2t + 1).
__device__ inline void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The A fragment of rows [0, 16) x columns [k, k + 16) of an f16 tile [16][ld] in shared memory.
__device__ inline void load_a(const __half* tile, int ld, int k, uint32_t (&a)[4]) {
    const int lane = threadIdx.x & 31;
    const __half* p = tile + (lane & 15) * ld + k + (lane >> 4) * 8;
    const unsigned addr = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
}

// The B fragments of two 8-token tiles, tokens [0, 16) x columns [k, k + 16) of a token-major f16 tile
// [16][kChunkLd] in shared memory: b0 for tokens 0..7, b1 for 8..15.
__device__ inline void load_b2(const __half* tile, int k, uint32_t (&b0)[2], uint32_t (&b1)[2]) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    const __half* p = tile + ((m >> 1) * 8 + (lane & 7)) * kChunkLd + k + (m & 1) * 8;
    const unsigned addr = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(b0[0]), "=r"(b0[1]), "=r"(b1[0]), "=r"(b1[1])
                 : "r"(addr));
}

// warp_product's f16 tile holds kWarpTileK<Dec> elements of each of its 16 rows at a time: half a chunk
// where the type's decode tasks fit in half (a warp then needs about half the shared memory, so twice the
// warps fit an SM: the decode products are latency-bound), else the whole chunk. Its row stride is 8 halves
// more (16 bytes: the 8 rows an ldmatrix phase reads fall in distinct banks). The products are the same
// steps in the same order either way.
template <class Dec>
constexpr int kWarpTileK = Staging<Dec>::kTaskElems <= kChunk / 2 ? kChunk / 2 : kChunk;
template <class Dec>
constexpr int kWarpTileLd = kWarpTileK<Dec> + 8;

// A lane's A-fragment words of row r (of w) for task j (elements [32 j, + 32)) of the chunk of nblk blocks
// from b0, decoded from device memory: f[2 s] the f16 pair of the task's elements 4 s, 4 s + 1 and
// f[2 s + 1] of 4 s + 2, 4 s + 3, for the steps s < 8 that take the task (mma_column's order); zeros for a
// row past the matrix or a task past the chunk.
template <class Dec>
__device__ inline void lane_task(const Rows& w, int64_t r, int64_t b0, int nblk, int j, uint32_t (&f)[16]) {
    using Block = typename Dec::Block;
    constexpr int QK = Dec::QK, NGT = 32 / Dec::G;
    if (r >= w.rows || 32 * j >= nblk * QK) {
#pragma unroll
        for (int i = 0; i < 16; ++i) f[i] = 0;
        return;
    }
    const uint8_t* at = chunk_start(w, r, b0 + 32 * j / QK, int(sizeof(Block)));
    int8_t q[32];
    float scale[NGT], bias[NGT];
    if constexpr (Staging<Dec>::kParts) {
        Dec::decode_part(*reinterpret_cast<const Block*>(at), (32 * j % QK) / 32, q, scale,
                         Dec::HAS_BIAS ? bias : nullptr);
    } else {
        const Block b = block_words<Block, true>(at);
        Dec::decode(b, q, scale, Dec::HAS_BIAS ? bias : nullptr);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint4 h = codes_half8<Dec::HAS_BIAS>(q + 8 * i, scale[8 * i / Dec::G],
                                                   Dec::HAS_BIAS ? bias[8 * i / Dec::G] : 0.0f);
        f[4 * i] = h.x, f[4 * i + 1] = h.y, f[4 * i + 2] = h.z, f[4 * i + 3] = h.w;
    }
}

// warp_segments for the lane-decoded types: each lane decodes its rows' (lane / 4 and lane / 4 + 8) tasks
// lane % 4 and lane % 4 + 4 of a chunk into its fragments and reads its token's matching f16 activations
// (16-byte loads), with no shared memory and no barrier.
template <class Dec, int NT, class SegEnd>
__device__ inline void lane_segments(const Rows& w, int64_t r0, int64_t nb, int64_t c_lo, int64_t c_hi,
                                     const HalfActs& a, const int64_t (&tok)[NT], SegEnd seg_end) {
    using S = Staging<Dec>;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    for (int64_t c = c_lo; c < c_hi; ++c) {
        const int64_t b0 = c * S::kPerChunk;
        const int nblk = int(nb - b0 < S::kPerChunk ? nb - b0 : S::kPerChunk), elems = nblk * Dec::QK;
        const int64_t k0 = b0 * Dec::QK;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (h == 1 && lane_tasks(elems) == 4) break;
            const int j = t4 + 4 * h;
            uint32_t f0[16], f8[16], bf[NT][16];
            lane_task<Dec>(w, r0 + g, b0, nblk, j, f0);
            lane_task<Dec>(w, r0 + g + 8, b0, nblk, j, f8);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const bool live = tok[n] >= 0 && 32 * j < elems;
                const uint4* x = reinterpret_cast<const uint4*>(a.xh + (live ? tok[n] * a.ld + k0 + 32 * j : 0));
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint4 v = live ? x[i] : uint4{0, 0, 0, 0};
                    bf[n][4 * i] = v.x, bf[n][4 * i + 1] = v.y, bf[n][4 * i + 2] = v.z, bf[n][4 * i + 3] = v.w;
                }
            }
#pragma unroll
            for (int st = 0; st < 8; ++st) {
                const uint32_t af[4] = {f0[2 * st], f8[2 * st], f0[2 * st + 1], f8[2 * st + 1]};
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const uint32_t b2[2] = {bf[n][2 * st], bf[n][2 * st + 1]};
                    mma16816(acc[n], af, b2);
                }
            }
        }
        if (segment_ends(c) || c + 1 == c_hi) {
            seg_end(c, acc);
#pragma unroll
            for (int j = 0; j < NT; ++j)
                for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
        }
    }
}

// warp_segments for the types that are not lane-decoded: one warp's product of 16 weight rows (r0.. of w)
// with up to 8 NT tokens whose f16 rows this lane reads
// for its fragment column: tok[j] = the xh row of token 8 j + lane / 4, or -1 (a zero column). K chunks
// [c_lo, c_hi) (chunk c = blocks [c kPerChunk, +kPerChunk) clipped to nb), summed per segment: at the end of
// each segment (or of chunk c_hi - 1) seg_end(c, sums) takes its sums. raw / tile: the warp's shared memory
// ([16][kRawLd] bytes, [16][kWarpTileLd] halves). The next chunk's raw pieces are loaded while this one is
// decoded and multiplied.
template <class Dec, int NT, class SegEnd>
__device__ inline void staged_segments(const Rows& w, int64_t r0, int64_t nb, int64_t c_lo, int64_t c_hi,
                                       const HalfActs& a, const int64_t (&tok)[NT], uint8_t* raw, __half* tile,
                                       SegEnd seg_end) {
    using S = Staging<Dec>;
    constexpr int kLoads = (16 * S::kGranules + 31) / 32;  // raw pieces per lane
    const int lane = threadIdx.x & 31, t4 = lane & 3;
    uint4 pieces[kLoads];
    const auto load = [&](int64_t c) {
        const int64_t b0 = c * S::kPerChunk;
        const int nblk = int(nb - b0 < S::kPerChunk ? nb - b0 : S::kPerChunk);
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
            const int idx = lane + 32 * i;
            pieces[i] = idx < 16 * S::kGranules
                            ? raw_piece<Dec>(w, r0, b0, nblk, idx / S::kGranules, idx % S::kGranules)
                            : uint4{0, 0, 0, 0};
        }
    };
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    if (c_lo < c_hi) load(c_lo);
    for (int64_t c = c_lo; c < c_hi; ++c) {
        const int64_t b0 = c * S::kPerChunk;
        const int nblk = int(nb - b0 < S::kPerChunk ? nb - b0 : S::kPerChunk), elems = nblk * Dec::QK;
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
            const int idx = lane + 32 * i;
            if (idx < 16 * S::kGranules)
                *reinterpret_cast<uint4*>(raw + (idx / S::kGranules) * S::kRawLd + (idx % S::kGranules) * 16) = pieces[i];
        }
        __syncwarp();
        if (c + 1 < c_hi) load(c + 1);
        // the chunk's B fragments, loaded before the decode so their latency hides behind it
        const int64_t k0 = b0 * Dec::QK;
        uint32_t bf[NT][kChunk / 16][2];
#pragma unroll
        for (int ks = 0; ks < kChunk / 16; ++ks)
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                bf[j][ks][0] = bf[j][ks][1] = 0;
                if (16 * ks < elems && tok[j] >= 0) {
                    const __half* x = a.xh + tok[j] * a.ld + k0 + 16 * ks + 2 * t4;
                    bf[j][ks][0] = *reinterpret_cast<const uint32_t*>(x);
                    bf[j][ks][1] = *reinterpret_cast<const uint32_t*>(x + 8);
                }
            }
        constexpr int TK = kWarpTileK<Dec>, TLD = kWarpTileLd<Dec>;
#pragma unroll
        for (int h = 0; h < kChunk / TK; ++h) {
            if (h * TK >= elems) break;
            if (h > 0) __syncwarp();  // the previous part's fragments are loaded
            decode_chunk<Dec, 16>(w, r0, b0, nblk, raw, tile, lane, 32, TLD, h * TK, (h + 1) * TK);
            __syncwarp();
#pragma unroll
            for (int ks = 0; ks < TK / 16; ++ks) {
                if (h * TK + 16 * ks >= elems) break;
                uint32_t af[4];
                load_a(tile, TLD, 16 * ks, af);
#pragma unroll
                for (int j = 0; j < NT; ++j) mma16816(acc[j], af, bf[j][h * (TK / 16) + ks]);
            }
        }
        if (segment_ends(c) || c + 1 == c_hi) {
            seg_end(c, acc);
#pragma unroll
            for (int j = 0; j < NT; ++j)
                for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
        }
        __syncwarp();  // the tile and raw are rewritten next chunk
    }
}

// One warp's product of 16 weight rows (r0.. of w) with up to 8 NT tokens whose f16 rows this lane reads
// for its fragment column: tok[j] = the xh row of token 8 j + lane / 4, or -1 (a zero column). K chunks
// [c_lo, c_hi) (chunk c = blocks [c kPerChunk, +kPerChunk) clipped to nb), summed per segment: at the end of
// each segment (or of chunk c_hi - 1) seg_end(c, sums) takes its sums. raw / tile: the warp's shared memory
// (decode_smem_bytes: none for the lane-decoded types).
template <class Dec, int NT, class SegEnd>
__device__ inline void warp_segments(const Rows& w, int64_t r0, int64_t nb, int64_t c_lo, int64_t c_hi,
                                     const HalfActs& a, const int64_t (&tok)[NT], uint8_t* raw, __half* tile,
                                     SegEnd seg_end) {
    if constexpr (kLaneDecode<Dec>)
        lane_segments<Dec, NT>(w, r0, nb, c_lo, c_hi, a, tok, seg_end);
    else
        staged_segments<Dec, NT>(w, r0, nb, c_lo, c_hi, a, tok, raw, tile, seg_end);
}

// warp_segments with the segments' sums added in order into total.
template <class Dec, int NT>
__device__ inline void warp_product(const Rows& w, int64_t r0, int64_t nb, int64_t c_lo, int64_t c_hi,
                                    const HalfActs& a, const int64_t (&tok)[NT], uint8_t* raw, __half* tile,
                                    float (&total)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) total[j][e] = 0.0f;
    warp_segments<Dec, NT>(w, r0, nb, c_lo, c_hi, a, tok, raw, tile, [&](int64_t, const float (&acc)[NT][4]) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
            for (int e = 0; e < 4; ++e) total[j][e] += acc[j][e];
    });
}

// Chunks of a matrix of nb blocks per row (segment sg: chunks [kSegmentChunks sg, +kSegmentChunks)).
template <class Dec>
__host__ __device__ inline int64_t chunks(int64_t nb) {
    return (nb + Staging<Dec>::kPerChunk - 1) / Staging<Dec>::kPerChunk;
}

// The chunks [lo, hi) of nc of segments [seg, seg + n) (segment s: chunks [kSegmentChunks s, +kSegmentChunks)).
__device__ inline void segment_chunks(int64_t nc, int64_t seg, int64_t n, int64_t& lo, int64_t& hi) {
    lo = kSegmentChunks * seg;
    hi = lo + kSegmentChunks * n < nc ? lo + kSegmentChunks * n : nc;
}

// Segments a block of a split decode product takes: the fewest that keep its blocks (`units` tiles times
// segments in the launch) within one wave of kFillBlocks, so a warp streams its segments' chunks one after
// another (each loaded while the one before it is multiplied) instead of a wave of blocks per chunk.
constexpr int kFillBlocks = 512;  // decode blocks of one wave (4 an SM of an H200: kDecodeMinBlocks)
inline int64_t segments_per_block(int64_t units) {
    return units > kFillBlocks ? (units + kFillBlocks - 1) / kFillBlocks : 1;
}

// Split-K decode: the n_blocks blocks of one tile each write their segments' sums, and the last of them to
// finish adds the segments in order (so no second kernel). Each tile has a counter in segment_counters() (zero
// between kernels: the last block resets it). Call after the block's partial sums are written, from every
// thread of the block; true in the block that is last (its reads of the others' sums must bypass L1: __ldcg).
unsigned* segment_counters();
constexpr int64_t kSegmentCounters = 1 << 18;

// Ordering: the barrier puts every thread's writes before thread 0's count, an acquire-release add at device
// scope (release is cumulative: it publishes what the barrier ordered before it), and the second barrier puts
// the last block's reads after it; one fence for the block instead of one per thread.
__device__ inline bool last_of_segments(unsigned* counter, int64_t n_blocks) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> count(*counter);
        last = count.fetch_add(1u, ::cuda::memory_order_acq_rel) == unsigned(n_blocks - 1);
        if (last) count.store(0u, ::cuda::memory_order_relaxed);  // every block of the tile has counted
    }
    __syncthreads();
    return last;
}

// ((0 + part[0]) + part[1]) + ... + part[n_seg - 1], part[g] at p[g * stride], read past L1 (__ldcg). The
// loads are issued 8 at a time before the adds (a loop of load-then-add waits an L2 round trip per segment:
// 32 of them for K = 8192); the additions are the same, in the same order.
__device__ inline float sum_segments(const float* p, int64_t stride, int64_t n_seg) {
    constexpr int kBatch = 8;
    float sum = 0.0f;
    for (int64_t g0 = 0; g0 < n_seg; g0 += kBatch) {
        float v[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) v[i] = g0 + i < n_seg ? __ldcg(p + (g0 + i) * stride) : 0.0f;
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
            if (g0 + i < n_seg) sum += v[i];
    }
    return sum;
}

// The decode kernels (a warp per 16 rows, 4 warps a block) are latency-bound: they need warps in flight more
// than registers. Blocks an SM they are compiled for: 4 (at most 128 registers a thread; Q8_0 took 165, so
// 3 blocks an SM) for one 8-token tile, where ptxas spills at most a few words (sm_90: every type but TQ1_0
// and Q8_K, which would spill over 2 KB a thread); else 1 (registers as the compiler chooses).
constexpr int kDecodeThreads = 128;
template <class Dec, int NT>
constexpr int kDecodeMinBlocks = NT == 1 && Dec::TYPE != RG_TYPE_TQ1_0 && Dec::TYPE != RG_TYPE_Q8_K ? 4 : 1;

// Shared memory of one warp_product warp: its raw chunk, then its f16 tile (both multiples of 16 bytes).
template <class Dec>
constexpr size_t warp_smem_bytes() {
    return size_t(16 * Staging<Dec>::kRawLd) + size_t(16 * kWarpTileLd<Dec>) * sizeof(__half);
}

// Shared memory of one decode warp: warp_smem_bytes, or none for the lane-decoded types.
template <class Dec>
constexpr size_t decode_smem_bytes() {
    return kLaneDecode<Dec> ? 0 : warp_smem_bytes<Dec>();
}

// Stores a warp's total (NT 8-token tiles of 16 rows from r0): out(i, r, v) for token column i < 8 NT of
// the fragment and row r < n_rows.
template <int NT, class Out>
__device__ inline void store_total(const float (&total)[NT][4], int64_t r0, int64_t n_rows, Out out) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int64_t r = r0 + g + (e >> 1) * 8;
            if (r < n_rows) out(8 * j + 2 * t4 + (e & 1), r, total[j][e]);
        }
}

}  // namespace regolith::cuda
