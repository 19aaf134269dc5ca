// The PLE layer's gate (a threadgroup per token and stream) and dilated causal conv (metal/ple.metal).
#include <algorithm>
#include <cmath>

#include "metal/seq_dispatch.h"

namespace regolith::metal {

void MetalBackend::do_ple_gate(const Tensor& key, const Tensor& query, const Tensor& value,
                               const Tensor& norm_key, const Tensor& norm_query, const Tensor& norm_conv,
                               int64_t hc, float eps, const Tensor& gated, const Tensor& normed) {
    const View vk = view(key), vq = view(query), vv = view(value), vnk = view(norm_key),
               vnq = view(norm_query), vnc = view(norm_conv), vg = view(gated), vn = view(normed);
    RgPleGateArgs a{};
    a.key = vk.shape, a.query = vq.shape, a.value = vv.shape, a.norm_key = vnk.shape,
    a.norm_query = vnq.shape;
    a.norm_conv = vnc.shape, a.gated = vg.shape, a.normed = vn.shape;
    a.hc = hc, a.hidden = value.cols, a.eps = eps;
    a.inv_sqrt_hidden = float(1.0 / std::sqrt(double(value.cols)));
    const uint32_t threads = simd_threads(value.cols);
    const uint32_t shmem = 32 * sizeof(float) + 32 * 2 * sizeof(float);  // rg_group_sum's, the dot's pairs
    launch("rg_ple_gate", uint32_t(key.rows * hc), 1, threads, shmem,
           {bytes(a), vk.arg, vq.arg, vv.arg, vnk.arg, vnq.arg, vnc.arg, vg.arg, vn.arg});
}

void MetalBackend::do_ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation,
                               const PleConvSeq* seqs, int64_t n_seqs, const Tensor& out) {
    const View vx = view(normed), vw = view(w), vo = view(out);
    RgConvArgs a{};
    a.x = vx.shape, a.w = vw.shape, a.out = vo.shape;
    a.taps = w.cols, a.dilation = dilation, a.hist = (w.cols - 1) * dilation;
    a.block = std::max<int64_t>(a.hist, 32);
    launch_conv(*this, "rg_ple_conv", a, vx, vw, vo, seqs, n_seqs, [](const PleConvSeq&) { return View{}; });
}

}  // namespace regolith::metal
