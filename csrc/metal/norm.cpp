// Norms (metal/norm.metal): a threadgroup per row.
#include "metal/metal_backend.h"

namespace regolith::metal {

void MetalBackend::do_rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    const View vx = view(x), vw = view(w), vy = view(y);
    RgNormArgs a{};
    a.x = vx.shape, a.w = vw.shape, a.y = vy.shape, a.eps = eps, a.has_w = w ? 1 : 0;
    launch("rg_rms_norm", uint32_t(x.rows), 1, simd_threads(x.cols), kGroupPartials,
           {bytes(a), vx.arg, w ? vw.arg : vx.arg, vy.arg});
}

void MetalBackend::do_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act,
                                     const Tensor& y) {
    const View vx = view(x), vz = view(z), vw = view(w), vy = view(y);
    RgNormArgs a{};
    a.x = vx.shape, a.z = vz.shape, a.w = vw.shape, a.y = vy.shape, a.eps = eps;
    a.act = act == Unary::Sigmoid ? 1 : 0;
    launch("rg_rms_norm_gated", uint32_t(x.rows), 1, simd_threads(x.cols), kGroupPartials,
           {bytes(a), vx.arg, vz.arg, vw.arg, vy.arg});
}

void MetalBackend::do_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                                 const Tensor& y) {
    const View vx = view(x), vw = view(w), vb = view(b), vy = view(y);
    RgNormArgs a{};
    a.x = vx.shape, a.w = vw.shape, a.b = vb.shape, a.y = vy.shape, a.eps = eps;
    launch("rg_layer_norm", uint32_t(x.rows), 1, simd_threads(x.cols), kGroupPartials,
           {bytes(a), vx.arg, vw.arg, vb.arg, vy.arg});
}

}  // namespace regolith::metal
