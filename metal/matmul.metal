// Matrix products: y[t][r] = sum_c W[r][c] x[t][c] (Backend::matmul), and the resident experts' products
// over the routing pairs grouped by expert (Backend::moe_experts, grouped by metal/moe.metal).
//
// One arithmetic for every output element, whatever kernel, tile, ntok or batch computes it (the matmul
// contract, core/backend.h): a threadgroup dequantizes a tile of weight rows to float in threadgroup memory
// (RgQuant<TYPE>::dequant32, bit-exact with the CPU), stages the float activations beside it, and each
// SIMD-group accumulates 8x8 float SIMD-group matrices, acc = W[8 rows][8 k] * X^T[8 k][8 tokens] + acc, over
// K in steps of 8 in increasing order from a zero accumulator (no split of K; a float row whose length is not
// a multiple of 8 is padded with zero columns, which leave the sum as it is). Padding rows and tokens are
// zeros whose results are never stored. So a decode and a prefill tile give the same bits, the experts'
// products equal the streamed path's matmul jobs, and a quantized matrix equals its dequantized F32 twin bit
// for bit (exact mode needs no path of its own).
//
// Kernels rg_matmul_<type> (a batch of jobs: a table of offsets, each job's tiles a range of threadgroups)
// and rg_moe_matmul_<type> (every active expert's rows times its grouped pairs), each with the decode or the
// prefill tile as its arguments say (a branch uniform over the dispatch).
// Tiles (threadgroups of 4 SIMD-groups, RG_MM_THREADS = 128 threads, which the SIMD-group layout assumes;
// threadgroup memory in floats, rows padded by 4):
//   decode (ntok <= 8): 32 rows x 8 tokens, K in chunks of 128: every thread dequantizes one 32-element part
//     per chunk (4 adjacent lanes read 4 adjacent parts of a row), each SIMD-group owns 8 rows; 21 KiB.
//     Decode is bound by the weight reads, so the tile keeps all 128 threads reading weights and is small
//     enough for a 248,320-row LM head to spread over every GPU core.
//   prefill: 32 rows x 32 tokens, K in chunks of 64; each SIMD-group owns 16 rows x 16 tokens (2 x 2
//     matrices: 4 multiplies per 4 loads). Every dequantized weight serves 32 tokens; 17 KiB (float
//     staging of 32 x 64 weights and 32 x 64 activations stays well under the 32 KiB limit).
// The output tile goes through threadgroup memory (transposed) so that y's rows are written coalesced and
// partial tiles (rows not a multiple of 32, ntok not a multiple of the tile) store only their valid part.
#include "compat.h"

#include "args.h"
#include "quants.h"

// A tile's shape: RT weight rows x NT tokens, K in chunks of KC; SIMD-groups SGR along rows x 4 / SGR along
// tokens.
template <int RT_, int NT_, int KC_, int SGR_>
struct RgMmTile {
    static constexpr int RT = RT_, NT = NT_, KC = KC_, SGR = SGR_, SGC = 4 / SGR_;
    static constexpr int LD = KC + 4;                           // floats per staged row
    static constexpr int MR = RT / SGR / 8, MC = NT / SGC / 8;  // a SIMD-group's 8x8 matrices
    static constexpr int FLOATS = (RT + NT) * LD;               // staged weights and activations
    static constexpr int SHMEM = FLOATS * 4 + 2 * NT * 4;       // + the tile's x / y row indices
};
typedef RgMmTile<RG_MM_ROWS, RG_MM_DECODE_TOKENS, RG_MM_DECODE_KC, 4> RgMmDecode;
typedef RgMmTile<RG_MM_ROWS, RG_MM_PREFILL_TOKENS, RG_MM_PREFILL_KC, 2> RgMmPrefill;
static_assert(RgMmDecode::SHMEM == RG_MM_SHMEM(RG_MM_DECODE_TOKENS, RG_MM_DECODE_KC), "decode tile memory");
static_assert(RgMmPrefill::SHMEM == RG_MM_SHMEM(RG_MM_PREFILL_TOKENS, RG_MM_PREFILL_KC),
              "prefill tile memory");

// One tile: weight rows [0, rows) at w (rows <= RT, w_stride bytes apart, `cols` elements) times the NT
// activation rows xrow[c] of x (-1: padding), into y[yrow[c] * y_ld + r] (-1: not stored). xrow / yrow are
// threadgroup memory written before the call (the first barrier here publishes them).
template <uint TYPE, class T>
inline void rg_mm_tile(device const uchar* w, int64_t w_stride, int rows, int64_t cols, device const float* x,
                       int64_t x_ld, device float* y, int64_t y_ld, threadgroup const int* xrow,
                       threadgroup const int* yrow, threadgroup float* sh, uint sgitg, uint tiitg, uint ntg) {
    typedef RgQuant<TYPE> Q;
    threadgroup float* ws = sh;                  // [RT][LD] weights
    threadgroup float* xs = sh + T::RT * T::LD;  // [NT][LD] activations
    const int sr = int(sgitg) % T::SGR * T::MR * 8, sc = int(sgitg) / T::SGR * T::MC * 8;
    simdgroup_float8x8 acc[T::MR][T::MC];
    for (int i = 0; i < T::MR; ++i)
        for (int j = 0; j < T::MC; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (int64_t k0 = 0; k0 < cols; k0 += T::KC) {
        // kn columns in this chunk (a multiple of 32 but at the end of a float row), zero-padded to kn8
        const int kn = int(min(int64_t(T::KC), cols - k0)), kn8 = (kn + 7) / 8 * 8;
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous chunk's readers are done
        for (int task = int(tiitg); task < T::RT * (T::KC / 32); task += int(ntg)) {
            const int r = task / (T::KC / 32), part = task % (T::KC / 32);
            if (32 * part >= kn) continue;
            float v[32];
            if (r < rows) {
                const int64_t k = k0 + 32 * part;
                device const uchar* block = w + r * w_stride + k / Q::QK * Q::BYTES;
                if (32 * part + 32 <= kn)
                    Q::dequant32(block, int(k % Q::QK) / 32, v);
                else
                    rg_dequant_head<TYPE>(block, int(k % Q::QK) / 32, kn - 32 * part, v);
            } else {
                for (int j = 0; j < 32; ++j) v[j] = 0.0f;
            }
            threadgroup float* d = ws + r * T::LD + 32 * part;
            for (int j = 0; j < 32; ++j) d[j] = v[j];
        }
        for (int i = int(tiitg); i < T::NT * T::KC; i += int(ntg)) {
            const int c = i / T::KC, kk = i % T::KC;
            if (kk >= kn8) continue;
            const int xr = xrow[c];
            xs[c * T::LD + kk] = xr >= 0 && kk < kn ? x[xr * x_ld + k0 + kk] : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int s = 0; s < kn8; s += 8) {
            simdgroup_float8x8 a[T::MR], b[T::MC];
            for (int i = 0; i < T::MR; ++i) simdgroup_load(a[i], ws + (sr + 8 * i) * T::LD + s, T::LD);
            for (int j = 0; j < T::MC; ++j)
                simdgroup_load(b[j], xs + (sc + 8 * j) * T::LD + s, T::LD, ulong2(0, 0), true);
            for (int i = 0; i < T::MR; ++i)
                for (int j = 0; j < T::MC; ++j)
                    simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    threadgroup float* out = sh;  // [NT][RT]: out[c][r] = acc element (row r, token c)
    for (int i = 0; i < T::MR; ++i)
        for (int j = 0; j < T::MC; ++j)
            simdgroup_store(acc[i][j], out + (sc + 8 * j) * T::RT + sr + 8 * i, T::RT, ulong2(0, 0), true);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = int(tiitg); i < T::NT * T::RT; i += int(ntg)) {
        const int c = i / T::RT, r = i % T::RT, yr = yrow[c];
        if (yr >= 0 && r < rows) y[yr * y_ld + r] = out[i];
    }
}

// A batch of products (RgMatmulArgs): threadgroup `tile` (x + y * groups_x) takes row tile tile % row_tiles
// and token tile tile / row_tiles of the job whose tiles hold it.
template <uint TYPE, class T>
inline void rg_matmul_tile(constant RgMatmulArgs& a, device const char* w, device const char* x,
                           device char* y, uint3 tgpig, uint3 tgpg, uint sgitg, uint tiitg, uint ntg,
                           threadgroup char* shmem) {
    const uint tile = tgpig.x + tgpig.y * tgpg.x;
    if (tile >= a.n_tiles) return;  // the whole threadgroup
    uint j = 0;
    while (j + 1 < a.n_jobs && tile >= a.jobs[j + 1].tile0) ++j;
    constant RgMatmulJob& job = a.jobs[j];
    const uint local = tile - job.tile0;
    const int64_t r0 = int64_t(local % job.row_tiles) * T::RT, t0 = int64_t(local / job.row_tiles) * T::NT;
    threadgroup float* sh = (threadgroup float*)shmem;
    threadgroup int* tok = (threadgroup int*)(sh + T::FLOATS);
    if (int(tiitg) < T::NT) {
        const int64_t t = t0 + tiitg;
        tok[tiitg] = tok[T::NT + tiitg] = t < int64_t(job.ntok) ? int(t) : -1;
    }
    rg_mm_tile<TYPE, T>((device const uchar*)(w + job.w_off) + r0 * job.w_stride, job.w_stride,
                        int(min(int64_t(T::RT), int64_t(job.rows) - r0)), job.cols,
                        (device const float*)(x + job.x_off), job.cols, (device float*)(y + job.y_off) + r0,
                        job.y_ld, tok, tok + T::NT, sh, sgitg, tiitg, ntg);
}

// The products of the resident experts over their grouped rows (RgMoeMatmulArgs; groups as rg_moe_group
// writes them: offset [n_expert + 1], active [1 + n_expert], order [pairs]). Threadgroup (x, y): row tile x
// of expert active[1 + y % slots] (none past active[0]) and its token tiles y / slots, + tok_tiles, ...
// Grouped row i (offset[e] <= i < offset[e + 1]) reads x row order[i] / k (k = 0: row i) and writes y row i.
template <uint TYPE, class T>
inline void rg_moe_matmul_tiles(constant RgMoeMatmulArgs& a, device const char* w, device const char* x,
                                device char* y, device const int* groups, uint3 tgpig, uint sgitg, uint tiitg,
                                uint ntg, threadgroup char* shmem) {
    const int64_t ne = a.n_expert;
    device const int* offset = groups;
    device const int* active = groups + ne + 1;
    device const int* order = groups + 2 * (ne + 1);
    const uint slot = tgpig.y % a.slots, tt = tgpig.y / a.slots;
    if (int(slot) >= active[0]) return;  // the whole threadgroup
    const int64_t e = active[1 + slot], p0 = offset[e], p1 = offset[e + 1];
    const int64_t r0 = int64_t(tgpig.x) * T::RT;
    threadgroup float* sh = (threadgroup float*)shmem;
    threadgroup int* tok = (threadgroup int*)(sh + T::FLOATS);
    for (int64_t b = p0 + int64_t(tt) * T::NT; b < p1; b += int64_t(a.tok_tiles) * T::NT) {
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous tile's stores have read tok
        if (int(tiitg) < T::NT) {
            const int64_t i = b + tiitg;
            tok[tiitg] = i < p1 ? (a.k ? order[i] / int(a.k) : int(i)) : -1;
            tok[T::NT + tiitg] = i < p1 ? int(i) : -1;
        }
        rg_mm_tile<TYPE, T>((device const uchar*)w + (e * a.n + r0) * a.w_stride, a.w_stride,
                            int(min(int64_t(T::RT), a.n - r0)), a.cols, (device const float*)x, a.x_ld,
                            (device float*)y + r0, a.y_ld, tok, tok + T::NT, sh, sgitg, tiitg, ntg);
    }
}

// The kernels: rg_matmul_<type> (RgMatmulArgs) and rg_moe_matmul_<type> (RgMoeMatmulArgs, groups), each with
// the decode or the prefill tile as the arguments say (a uniform branch).
template <uint TYPE>
kernel void rg_matmul(constant RgMatmulArgs& a [[buffer(0)]], device const char* w [[buffer(1)]],
                      device const char* x [[buffer(2)]], device char* y [[buffer(3)]], RG_THREAD_IDS) {
    if (a.decode)
        rg_matmul_tile<TYPE, RgMmDecode>(a, w, x, y, tgpig, tgpg, sgitg, tiitg, ntg, shmem);
    else
        rg_matmul_tile<TYPE, RgMmPrefill>(a, w, x, y, tgpig, tgpg, sgitg, tiitg, ntg, shmem);
}

template <uint TYPE>
kernel void rg_moe_matmul(constant RgMoeMatmulArgs& a [[buffer(0)]], device const char* w [[buffer(1)]],
                          device const char* x [[buffer(2)]], device char* y [[buffer(3)]],
                          device const int* groups [[buffer(4)]], RG_THREAD_IDS) {
    if (a.decode)
        rg_moe_matmul_tiles<TYPE, RgMmDecode>(a, w, x, y, groups, tgpig, sgitg, tiitg, ntg, shmem);
    else
        rg_moe_matmul_tiles<TYPE, RgMmPrefill>(a, w, x, y, groups, tgpig, sgitg, tiitg, ntg, shmem);
}

// Every weight type of RG_METAL_WEIGHT_TYPES (metal/quants.h); the host names them rg_matmul_ /
// rg_moe_matmul_ + metal_type_name() (csrc/metal/types.h).
#define RG_MATMUL_KERNELS(type, name)                   \
    RG_INSTANTIATE("rg_matmul_" #name, rg_matmul, type) \
    RG_INSTANTIATE("rg_moe_matmul_" #name, rg_moe_matmul, type)
RG_METAL_WEIGHT_TYPES(RG_MATMUL_KERNELS)
#undef RG_MATMUL_KERNELS
