// Rotary embeddings (metal/rope.metal): a thread per rotary pair, threadgroups (pair stretch, row).
#include <algorithm>

#include "metal/metal_backend.h"

namespace regolith::metal {

namespace {

// Threadgroups per row to cover `pairs` pairs with simd_threads(pairs) threads each.
uint32_t pair_groups(int64_t pairs) {
    return uint32_t((pairs + simd_threads(pairs) - 1) / simd_threads(pairs));
}

}  // namespace

void MetalBackend::do_rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis,
                                 const Tensor& table) {
    const View vp = view(pos), vf = view(freq), va = view(axis), vt = view(table);
    RgRopeArgs a{};
    a.pos = vp.shape, a.freq = vf.shape, a.axis = va.shape, a.table = vt.shape;
    const int64_t half = freq.cols;
    launch("rg_rope_table", pair_groups(half), uint32_t(pos.rows), simd_threads(half), 0,
           {bytes(a), vp.arg, vf.arg, va.arg, vt.arg});
}

void MetalBackend::do_rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) {
    const View vx = view(x), vt = view(table);
    RgRopeArgs a{};
    a.table = vt.shape, a.x = vx.shape, a.rows_per_pos = rows_per_pos;
    const int64_t half = table.cols / 2;
    launch("rg_rope", pair_groups(half), uint32_t(x.rows), simd_threads(half), 0, {bytes(a), vt.arg, vx.arg});
}

}  // namespace regolith::metal
