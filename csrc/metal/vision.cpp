// The vision tower's ops (metal/vision.metal).
#include <algorithm>

#include "metal/metal_backend.h"

namespace regolith::metal {

namespace {

constexpr uint32_t kVisionTile = 32 * 33 * sizeof(float);  // rg_vision_qkv's v tile: 32 tokens x (32 + 1)

}  // namespace

void MetalBackend::do_add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w,
                                       const Tensor& x) {
    const View vt = view(table), vi = view(idx), vw = view(w), vx = view(x);
    RgInterpArgs a{};
    a.table = vt.shape, a.idx = vi.shape, a.w = vw.shape, a.x = vx.shape;
    const uint32_t threads = simd_threads(x.cols);
    const uint32_t groups = uint32_t(std::min<int64_t>(64, (x.cols + threads - 1) / threads));
    launch("rg_add_interpolated", groups, uint32_t(x.rows), threads, 0,
           {bytes(a), vt.arg, vi.arg, vw.arg, vx.arg});
}

void MetalBackend::do_vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q,
                                 const Tensor& k, const Tensor& vt) {
    const View vqkv = view(qkv), vtab = view(table), vq = view(q), vk = view(k), vv = view(vt);
    RgVisionQkvArgs a{};
    a.qkv = vqkv.shape, a.table = vtab.shape, a.q = vq.shape, a.k = vk.shape, a.vt = vv.shape,
    a.n_head = n_head;
    launch("rg_vision_qkv", uint32_t((qkv.rows + 31) / 32), uint32_t(n_head), 256, kVisionTile,
           {bytes(a), vqkv.arg, vtab.arg, vq.arg, vk.arg, vv.arg});
}

void MetalBackend::do_softmax_scaled(const Tensor& x, float scale) {
    const View vx = view(x);
    RgSoftmaxArgs a{};
    a.x = vx.shape, a.scale = scale;
    launch("rg_softmax_scaled", uint32_t(x.rows), 1, simd_threads(x.cols), kGroupPartials,
           {bytes(a), vx.arg});
}

}  // namespace regolith::metal
