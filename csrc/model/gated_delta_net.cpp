#include "model/gated_delta_net.h"

#include <string>
#include <vector>

#include "core/errors.h"
#include "core/gguf_set.h"
#include "model/metadata.h"

namespace regolith {

GdnStates::GdnStates(Backend& be, const GdnShape& s, int64_t n)
    : conv(be, RG_TYPE_F32, n, s.conv_state()), recurrent(be, RG_TYPE_F32, n, s.recurrent_state()) {}

void GdnStates::zero(Backend& be) const {
    be.zero(conv.t);
    be.zero(recurrent.t);
}

void GdnStates::copy_row(Backend& be, const GdnStates& src, int64_t from, int64_t to) const {
    if (src.conv.t.cols != conv.t.cols || src.recurrent.t.cols != recurrent.t.cols)
        throw Error("Gated DeltaNet: states of different layer shapes");
    be.copy(src.conv.t.row_range(from, 1), conv.t.row_range(to, 1));
    be.copy(src.recurrent.t.row_range(from, 1), recurrent.t.row_range(to, 1));
}

GatedDeltaNet::GatedDeltaNet(const ModelWeights& wt, int64_t layer, GdnGateAct gate_act) {
    with_context("Gated DeltaNet layer " + std::to_string(layer) + ": ", [&] {
        const GgufSet& f = wt.file();
        const std::string a = meta::require_string(f, "general.architecture") + ".";
        GdnShape& s = shape_;
        s.hidden = meta::require_positive_int(f, a + "embedding_length");
        s.conv_kernel = meta::require_positive_int(f, a + "ssm.conv_kernel");
        s.k_dim = meta::require_positive_int(f, a + "ssm.state_size");
        s.n_k_heads = meta::require_positive_int(f, a + "ssm.group_count");
        s.n_v_heads = meta::require_positive_int(f, a + "ssm.time_step_rank");
        const int64_t inner = meta::require_positive_int(f, a + "ssm.inner_size");
        s.eps = meta::require_float(f, a + "attention.layer_norm_rms_epsilon");
        s.gate_act = gate_act;
        s.grouped = meta::require_string(f, "general.architecture") == "qwen3next";
        if (s.n_v_heads % s.n_k_heads != 0)
            throw ModelFormatError(a + "ssm.time_step_rank (value heads, " + std::to_string(s.n_v_heads) +
                                   ") must be a multiple of ssm.group_count (key heads, " +
                                   std::to_string(s.n_k_heads) + ")");
        if (inner % s.n_v_heads != 0)
            throw ModelFormatError(a + "ssm.inner_size (" + std::to_string(inner) +
                                   ") must be a multiple of ssm.time_step_rank (" + std::to_string(s.n_v_heads) +
                                   ")");
        s.v_dim = inner / s.n_v_heads;

        const std::string p = "blk." + std::to_string(layer) + ".";
        const int64_t K = s.conv_kernel, cd = s.conv_dim();
        GdnWeights& w = w_;
        w.qkv = wt.matrix(p + "attn_qkv.weight", cd, s.hidden);
        w.gate = wt.matrix(p + "attn_gate.weight", s.value_dim(), s.hidden);
        if (wt.has(p + "ssm_in.weight"))
            throw ModelFormatError(p + "ssm_in.weight: this file has the fused q/k/v/z projection of llama.cpp's "
                                   "first qwen3next converter; regolith reads the split attn_qkv and attn_gate "
                                   "that its converter writes now (convert the checkpoint again)");
        if (s.grouped) {
            w.ba = wt.matrix(p + "ssm_ba.weight", 2 * s.n_v_heads, s.hidden);
        } else {
            w.alpha = wt.matrix(p + "ssm_alpha.weight", s.n_v_heads, s.hidden);
            w.beta = wt.matrix(p + "ssm_beta.weight", s.n_v_heads, s.hidden);
        }
        w.out = wt.matrix(p + "ssm_out.weight", s.hidden, s.value_dim());
        // [kernel][conv_dim], so that the conv runs along contiguous channels.
        wt.tensor(p + "ssm_conv1d.weight", {K, cd});
        std::vector<float> conv(size_t(K * cd)), conv_t(conv.size());
        wt.to_f32(p + "ssm_conv1d.weight", K * cd, conv.data());
        for (int64_t c = 0; c < cd; ++c)
            for (int64_t i = 0; i < K; ++i) conv_t[size_t(i * cd + c)] = conv[size_t(c * K + i)];
        w.conv_t = wt.store().upload(RG_TYPE_F32, K, cd, conv_t.data());
        w.a = wt.f32_converted(p + "ssm_a", {s.n_v_heads});
        w.dt_bias = wt.f32_converted(p + "ssm_dt.bias", {s.n_v_heads});
        w.norm = wt.f32_converted(p + "ssm_norm.weight", {s.v_dim});
        return 0;
    });
}

void GatedDeltaNet::forward(Workspace& ws, const Tensor& x, const GdnStates& states, int64_t row, const Tensor& y,
                            const GdnStates* after) const {
    forward(ws, x, {GdnRows{&states, row, 0, x.rows, after}}, y);
}

void GatedDeltaNet::forward(Workspace& ws, const Tensor& x, const std::vector<GdnRows>& seqs, const Tensor& y) const {
    const GdnShape& s = shape_;
    const int64_t ntok = x.rows, K = s.conv_kernel, cd = s.conv_dim(), vd = s.value_dim(), nv = s.n_v_heads;
    if (ntok <= 0) return;
    for (const GdnRows& q : seqs) {
        if (q.states->conv.t.cols != s.conv_state() || q.states->recurrent.t.cols != s.recurrent_state())
            throw Error("GatedDeltaNet::forward: state was made for another layer shape");
        if (q.after && (q.after->conv.t.cols != s.conv_state() || q.after->recurrent.t.cols != s.recurrent_state() ||
                        q.after->size() < q.ntok + 1))
            throw Error("GatedDeltaNet::forward: the per-token states were made for another layer shape");
    }
    Backend& be = ws.backend();
    Workspace::Scope scope(ws);

    const Tensor qkv = ws.f32(ntok, cd);   // [ntok][conv_dim]
    const Tensor z = ws.f32(ntok, vd);     // [ntok][value_dim]
    const Tensor g = ws.f32(ntok, nv);     // [ntok][n_v]: alpha x, then log decay
    const Tensor beta = ws.f32(ntok, nv);  // [ntok][n_v]: beta x, then sigmoid
    if (w_.ba) {
        // per key head [beta of its r value heads, alpha of them]: split into grouped beta and alpha
        const int64_t r = nv / s.n_k_heads, groups = ntok * s.n_k_heads;
        const Tensor ba = ws.f32(ntok, 2 * nv);  // [ntok][n_k][2][r]
        const MatmulJob in[] = {{w_.qkv, x, qkv}, {w_.gate, x, z}, {w_.ba, x, ba}};
        be.matmul(in, 3);
        const Tensor heads = ba.reshaped(groups, 2 * r);
        be.copy(heads.col_range(0, r), beta.reshaped(groups, r));
        be.copy(heads.col_range(r, r), g.reshaped(groups, r));
    } else {
        const MatmulJob in[] = {{w_.qkv, x, qkv}, {w_.gate, x, z}, {w_.alpha, x, g}, {w_.beta, x, beta}};
        be.matmul(in, 4);
    }

    // Causal depthwise conv + SiLU over each state's history and its sequence's qkv rows.
    const Tensor conv = ws.f32(ntok, cd);  // [ntok][conv_dim]: q | k | v
    std::vector<ConvSeq> cseqs;
    std::vector<GdnSeq> gseqs;
    for (const GdnRows& q : seqs) {
        cseqs.push_back({q.states->conv.t.row_range(q.row, 1).reshaped(K - 1, cd),
                         q.after ? q.after->conv.t.row_range(1, q.ntok) : Tensor{}, q.t0, q.ntok});
        gseqs.push_back({q.states->recurrent.t.row_range(q.row, 1),
                         q.after ? q.after->recurrent.t.row_range(1, q.ntok) : Tensor{}, q.t0, q.ntok});
    }
    be.ssm_conv(qkv, w_.conv_t, cseqs.data(), int64_t(cseqs.size()), conv);
    be.gdn_prepare(conv, g, beta, w_.a, w_.dt_bias, s.dims());

    const Tensor core = ws.f32(ntok, vd);  // [ntok][n_v][v_dim]
    be.gdn_scan(conv, g, beta, gseqs.data(), int64_t(gseqs.size()), s.dims(), kChunk, core);

    // Gated RMSNorm per (token, head): rms_norm(o) * norm * act(z).
    const Tensor heads = core.reshaped(ntok * nv, s.v_dim);
    be.rms_norm_gated(heads, z.reshaped(ntok * nv, s.v_dim), w_.norm,  s.eps,
                      s.gate_act == GdnGateAct::Sigmoid ? Unary::Sigmoid : Unary::Silu, heads);
    be.matmul(w_.out, core, y);
}

}  // namespace regolith
