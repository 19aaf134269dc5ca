// Matrix products (metal/matmul.metal). A batch's jobs are grouped by kernel (weight type; decode for ntok <=
// 8, else prefill) and by the buffers they read and write (a MoE layer's experts: slots of one arena, rows of
// one workspace), and each group is one dispatch per RG_MATMUL_MAX_JOBS jobs with a table of the jobs'
// offsets. Every job's bits are independent of the batch and of the kernel (matmul.metal's header), so the
// grouping is free to change them.
#include <algorithm>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/types.h"
#include "metal/metal_backend.h"
#include "metal/types.h"

namespace regolith::metal {

namespace {

constexpr int64_t kMaxTiles = int64_t(1) << 31;  // threadgroups of one dispatch (tile numbers are uint32)
constexpr uint32_t kGroupsX = 1u << 16;          // a dispatch's tiles as a grid of kGroupsX columns

// K is whole blocks (quantized types: every block is a multiple of 32 elements) or any length (F32 / F16 /
// BF16, whose rows may end inside a 32-element part).
void check_cols(const View& w) {
    const TypeTraits* t = type_traits(w.shape.type);
    if (!t || w.shape.cols % t->block_elems != 0 || w.shape.cols > UINT32_MAX)
        throw Error("metal matmul: a weight row of " + std::to_string(w.shape.cols) +
                    " elements is not whole blocks of its type");
}

bool decode(int64_t ntok) { return ntok <= RG_MM_DECODE_TOKENS; }

uint32_t tiles(int64_t n, int64_t tile) { return uint32_t((n + tile - 1) / tile); }

}  // namespace

// Products over views, as Backend::matmul's (the shared expert's down product on scratch rows, moe.cpp).
void encode_products(MetalBackend& be, const View* w, const View* x, const View* y, int64_t n) {
    std::vector<bool> done(size_t(n), false);
    std::vector<int64_t> group;
    for (int64_t i = 0; i < n; ++i) {
        if (done[size_t(i)]) continue;
        const bool dec = decode(x[i].shape.rows);
        const auto same = [&](int64_t j) {
            return w[j].shape.type == w[i].shape.type && decode(x[j].shape.rows) == dec &&
                   w[j].arg.buffer == w[i].arg.buffer && x[j].arg.buffer == x[i].arg.buffer &&
                   y[j].arg.buffer == y[i].arg.buffer;
        };
        group.clear();
        for (int64_t j = i; j < n; ++j)
            if (!done[size_t(j)] && same(j)) group.push_back(j), done[size_t(j)] = true;
        const int64_t nt = dec ? RG_MM_DECODE_TOKENS : RG_MM_PREFILL_TOKENS;
        const std::string kernel = "rg_matmul_" + metal_type_name(w[i].shape.type);
        const uint32_t shmem = dec ? RG_MM_SHMEM(RG_MM_DECODE_TOKENS, RG_MM_DECODE_KC)
                                   : RG_MM_SHMEM(RG_MM_PREFILL_TOKENS, RG_MM_PREFILL_KC);
        for (size_t g0 = 0; g0 < group.size();) {
            RgMatmulArgs a{};
            a.decode = dec ? 1 : 0;
            int64_t n_tiles = 0;
            size_t g1 = g0;
            for (; g1 < group.size() && g1 - g0 < RG_MATMUL_MAX_JOBS; ++g1) {
                const int64_t j = group[g1];
                const View &wj = w[j], &xj = x[j], &yj = y[j];
                check_cols(wj);
                const int64_t rows = wj.shape.rows, ntok = xj.shape.rows;
                const uint32_t row_tiles = tiles(rows, RG_MM_ROWS);
                const int64_t job_tiles = int64_t(row_tiles) * tiles(ntok, nt);
                if (rows > UINT32_MAX || ntok > INT32_MAX || yj.shape.stride / 4 > UINT32_MAX)
                    throw Error("metal matmul: a product of more than 2^32 rows or 2^31 tokens");
                if (n_tiles + job_tiles >= kMaxTiles) {
                    if (g1 == g0) throw Error("metal matmul: a product of more than 2^31 tiles");
                    break;
                }
                RgMatmulJob& jb = a.jobs[a.n_jobs++];
                jb.w_off = int64_t(wj.arg.offset), jb.x_off = int64_t(xj.arg.offset),
                jb.y_off = int64_t(yj.arg.offset);
                jb.w_stride = wj.shape.stride;
                jb.rows = uint32_t(rows), jb.cols = uint32_t(wj.shape.cols), jb.ntok = uint32_t(ntok);
                jb.y_ld = uint32_t(yj.shape.stride / 4);
                jb.tile0 = uint32_t(n_tiles), jb.row_tiles = row_tiles;
                n_tiles += job_tiles;
            }
            a.n_tiles = uint32_t(n_tiles);
            const View &w0 = w[group[g0]], &x0 = x[group[g0]], &y0 = y[group[g0]];
            const uint32_t gx = uint32_t(std::min<int64_t>(n_tiles, kGroupsX));
            be.launch(kernel.c_str(), gx, uint32_t((n_tiles + gx - 1) / gx), RG_MM_THREADS, shmem,
                      {MetalBackend::bytes(a), KernelArg{w0.arg.buffer, 0, nullptr, 0},
                       KernelArg{x0.arg.buffer, 0, nullptr, 0}, KernelArg{y0.arg.buffer, 0, nullptr, 0}});
            g0 = g1;
        }
    }
}

// The resident experts' products over the pairs grouped by rg_moe_group (moe.cpp): expert e's rows
// [e * n, (e + 1) * n) of the stacked w times its grouped rows (x row order[i] / k, or row i where k is 0),
// into y row i. ntok bounds the rows of one expert (its tokens), pairs the grouped rows.
void encode_expert_products(MetalBackend& be, const View& w, int64_t n, int64_t n_expert, const KernelArg& x,
                            int64_t x_ld, const KernelArg& y, int64_t y_ld, const KernelArg& groups,
                            int64_t k, int64_t ntok, int64_t pairs) {
    check_cols(w);
    const bool dec = decode(ntok);
    const int64_t nt = dec ? RG_MM_DECODE_TOKENS : RG_MM_PREFILL_TOKENS;
    RgMoeMatmulArgs a{};
    a.w_stride = w.shape.stride, a.n = n, a.cols = w.shape.cols, a.x_ld = x_ld, a.y_ld = y_ld;
    a.n_expert = uint32_t(n_expert), a.k = uint32_t(k);
    a.slots = uint32_t(std::min(n_expert, pairs));
    // Tiles of an expert past tok_tiles (an expert listed twice for a token) are taken by the same
    // threadgroups in turn.
    a.tok_tiles = tiles(ntok, nt);
    a.decode = dec ? 1 : 0;
    const std::string kernel = "rg_moe_matmul_" + metal_type_name(w.shape.type);
    const uint32_t shmem = dec ? RG_MM_SHMEM(RG_MM_DECODE_TOKENS, RG_MM_DECODE_KC)
                               : RG_MM_SHMEM(RG_MM_PREFILL_TOKENS, RG_MM_PREFILL_KC);
    be.launch(kernel.c_str(), tiles(n, RG_MM_ROWS), a.slots * a.tok_tiles, RG_MM_THREADS, shmem,
              {MetalBackend::bytes(a), w.arg, x, y, groups});
}

void MetalBackend::do_matmul(const regolith::MatmulJob* jobs, int64_t n_jobs) {
    std::vector<View> w, x, y;
    for (int64_t i = 0; i < n_jobs; ++i) {
        const MatmulJob& j = jobs[i];
        if (j.x.rows == 0 || j.w.rows == 0) continue;
        w.push_back(view(j.w)), x.push_back(view(j.x)), y.push_back(view(j.y));
    }
    encode_products(*this, w.data(), x.data(), y.data(), int64_t(w.size()));
}

}  // namespace regolith::metal
