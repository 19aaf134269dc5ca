// Attention caches (metal/cache.metal): storing f32 rows in a cache's type, a SIMD-group per row.
#include "metal/metal_backend.h"

namespace regolith::metal {

namespace {

constexpr int64_t kStoreRowsPerGroup = 4;  // SIMD-groups (rows) per rg_store_rows threadgroup

}  // namespace

void MetalBackend::do_store_rows(const Tensor& x, const Tensor& dst, const Tensor& scale) {
    const View vx = view(x), vd = view(dst), vs = view(scale);
    if (x.rows == 0) return;
    RgStoreRowsArgs a{};
    a.x = vx.shape, a.dst = vd.shape, a.scale = vs.shape;
    launch("rg_store_rows", uint32_t((x.rows + kStoreRowsPerGroup - 1) / kStoreRowsPerGroup), 1,
           uint32_t(32 * kStoreRowsPerGroup), 0, {bytes(a), vx.arg, vd.arg, vs ? vs.arg : vd.arg});
}

}  // namespace regolith::metal
