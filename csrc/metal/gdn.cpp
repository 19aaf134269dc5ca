// Gated DeltaNet (metal/gdn.metal): the causal conv and the delta-rule scan over up to RG_MAX_SEQS sequences
// per dispatch (seq_dispatch.h), the q / k norms and gates in one dispatch.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/errors.h"
#include "metal/seq_dispatch.h"

namespace regolith::metal {

void MetalBackend::do_ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs,
                               const Tensor& out) {
    const View vx = view(x), vw = view(w_t), vo = view(out);
    RgConvArgs a{};
    a.x = vx.shape, a.w = vw.shape, a.out = vo.shape;
    a.taps = w_t.rows, a.dilation = 1, a.hist = w_t.rows - 1, a.block = std::max<int64_t>(a.hist, 32);
    launch_conv(*this, "rg_ssm_conv", a, vx, vw, vo, seqs, n_seqs,
                [&](const ConvSeq& s) { return s.after ? view(s.after) : View{}; });
}

void MetalBackend::do_gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a,
                                  const Tensor& dt_bias, const GdnDims& d) {
    const View vq = view(qkv), vg = view(g), vb = view(beta), va = view(a), vd = view(dt_bias);
    constexpr uint32_t kThreads = 256;
    RgGdnPrepareArgs p{};
    p.qkv = vq.shape, p.g = vg.shape, p.beta = vb.shape, p.a = va.shape, p.dt = vd.shape;
    p.n_k = d.n_k_heads, p.n_v = d.n_v_heads, p.k_dim = d.k_dim;
    p.norm_groups = uint32_t((qkv.rows * 2 * d.n_k_heads + kThreads / 32 - 1) / (kThreads / 32));
    const uint32_t gate_groups = uint32_t((g.rows * d.n_v_heads + kThreads - 1) / kThreads);
    launch("rg_gdn_prepare", p.norm_groups + gate_groups, 1, kThreads, 0,
           {bytes(p), vq.arg, vg.arg, vb.arg, va.arg, vd.arg});
}

void MetalBackend::do_gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs,
                               int64_t n_seqs, const GdnDims& d, int64_t chunk, const Tensor& out) {
    (void)chunk;  // the kernel takes the tokens in order: the CPU's chunked scan is the same recurrence
    // 8 SIMD-groups over the k rows: R rows each, a power of two (the kernel's register array).
    constexpr int64_t kGroups = RG_GDN_SCAN_GROUPS;
    int64_t r = 1;
    while (r * kGroups < d.k_dim) r *= 2;
    if (r > 32) throw Error("metal gdn_scan: key heads of at most 256, not " + std::to_string(d.k_dim));
    const std::string kernel = "rg_gdn_scan_r" + std::to_string(r);
    const View vq = view(qkv), vg = view(g), vb = view(beta), vo = view(out);
    RgGdnScanArgs a{};
    a.qkv = vq.shape, a.g = vg.shape, a.beta = vb.shape, a.out = vo.shape;
    a.n_k = d.n_k_heads, a.n_v = d.n_v_heads, a.k_dim = d.k_dim, a.v_dim = d.v_dim;
    a.grouped = d.grouped ? 1 : 0;
    a.col_blocks = uint32_t((d.v_dim + 31) / 32);
    const uint32_t shmem =
        uint32_t(2 * 3 * kGroups * 32 * sizeof(float));  // 2 x [3][kGroups][32] partial sums
    SeqBindings sb;
    const auto flush = [&] {
        if (a.n_seqs == 0) return;
        const KernelArg& u = vq.arg;
        launch(kernel.c_str(), uint32_t(d.n_v_heads) * a.col_blocks, a.n_seqs, uint32_t(32 * kGroups), shmem,
               {bytes(a), vq.arg, vg.arg, vb.arg, vo.arg, sb.arg(0, u), sb.arg(1, u), sb.arg(2, u),
                sb.arg(3, u), sb.arg(4, u), sb.arg(5, u), sb.arg(6, u), sb.arg(7, u)});
        a.n_seqs = 0;
        sb.clear();
    };
    for (int64_t i = 0; i < n_seqs; ++i) {
        const GdnSeq& s = seqs[i];
        if (s.ntok == 0) continue;
        const View st = view(s.state), af = s.after ? view(s.after) : View{};
        if (a.n_seqs == RG_MAX_SEQS || !sb.fits({&st, &af})) flush();
        RgSeqSlot& q = a.seqs[a.n_seqs++];
        q.t0 = s.t0, q.ntok = s.ntok, q.first = 0;
        q.state = sb.place(st), q.after = sb.place(af);
    }
    flush();
}

}  // namespace regolith::metal
