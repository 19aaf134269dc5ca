// Elementwise ops (metal/elementwise.metal): a thread per element, threadgroups (column stretch, row).
#include <algorithm>

#include "core/errors.h"
#include "metal/metal_backend.h"

namespace regolith::metal {

namespace {

// Threads and column threadgroups for rows of `cols` elements: whole SIMD-groups, at most 256 threads, and
// at most 64 threadgroups per row (each thread then loops over the row).
struct ColumnGrid {
    uint32_t groups, threads;
};
ColumnGrid column_grid(int64_t cols) {
    const uint32_t threads = simd_threads(cols);
    return {uint32_t(std::min<int64_t>(64, (cols + threads - 1) / threads)), threads};
}

const char* unary_kernel(Unary op) {
    switch (op) {
        case Unary::Silu:
            return "rg_unary_silu";
        case Unary::Sigmoid:
            return "rg_unary_sigmoid";
        case Unary::SiluDiv:
            return "rg_unary_silu_div";
        case Unary::TwoSigmoidDiv:
            return "rg_unary_two_sigmoid_div";
        case Unary::GeluTanhExp:
            return "rg_unary_gelu_tanh_exp";
        case Unary::GeluErf:
            return "rg_unary_gelu_erf";
        case Unary::Softcap:
            return "rg_unary_softcap";
        case Unary::Scale:
            return "rg_unary_scale";
    }
    throw Error("metal unary: unknown op " + std::to_string(int(op)));
}

}  // namespace

void MetalBackend::do_unary(const Tensor& x, Unary op, float p, const Tensor& y) {
    const View vx = view(x), vy = view(y);
    RgUnaryArgs a{};
    a.x = vx.shape, a.y = vy.shape, a.p = p;
    const ColumnGrid g = column_grid(x.cols);
    launch(unary_kernel(op), g.groups, uint32_t(x.rows), g.threads, 0, {bytes(a), vx.arg, vy.arg});
}

void MetalBackend::do_glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) {
    const View vg = view(gate), vu = view(up), vy = view(y);
    RgBinaryArgs a{};
    a.a = vg.shape, a.b = vu.shape, a.y = vy.shape;
    const ColumnGrid g = column_grid(gate.cols);
    const char* kernel = act == Glu::GeluTanh    ? "rg_glu_gelu_tanh"
                         : act == Glu::Sigmoid   ? "rg_glu_sigmoid"
                         : act == Glu::SwigluOai ? "rg_glu_swiglu_oai"
                                                 : "rg_glu_silu";
    launch(kernel, g.groups, uint32_t(gate.rows),
           g.threads, 0, {bytes(a), vg.arg, vu.arg, vy.arg});
}

void MetalBackend::do_add(const Tensor& x, const Tensor& z, const Tensor& y) {
    const View vx = view(x), vz = view(z), vy = view(y);
    RgBinaryArgs a{};
    a.a = vx.shape, a.b = vz.shape, a.y = vy.shape;
    if (z.rows == 1) a.b.stride = 0;  // one row added to every row
    const ColumnGrid g = column_grid(x.cols);
    launch("rg_add", g.groups, uint32_t(x.rows), g.threads, 0, {bytes(a), vx.arg, vz.arg, vy.arg});
}

void MetalBackend::do_hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) {
    const View vg = view(gate), vx = view(xn), vm = view(mixed);
    RgBinaryArgs a{};
    a.a = vg.shape, a.b = vx.shape, a.y = vm.shape, a.hc = hc;
    const ColumnGrid g = column_grid(mixed.cols);
    launch("rg_hc_mix", g.groups, uint32_t(mixed.rows), g.threads, 0, {bytes(a), vg.arg, vx.arg, vm.arg});
}

void MetalBackend::do_hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) {
    const View vo = view(out), vw = view(w), vs = view(streams);
    RgBinaryArgs a{};
    a.a = vo.shape, a.b = vw.shape, a.y = vs.shape, a.hc = hc;
    const ColumnGrid g = column_grid(out.cols);
    launch("rg_hc_write", g.groups, uint32_t(out.rows * hc), g.threads, 0,
           {bytes(a), vo.arg, vw.arg, vs.arg});
}

}  // namespace regolith::metal
