// load_gdn_layer: GdnShape / GdnWeights of one layer from llama.cpp's qwen4exp (qwen35-family) GGUF layout.
#include <string>

#include "core/errors.h"
#include "core/gguf.h"
#include "model/gated_delta_net.h"
#include "model/metadata.h"
#include "model/weights.h"

namespace regolith {

GdnLayer load_gdn_layer(const GgufFile& f, int64_t layer, GdnGateAct gate_act) {
    return with_context("Gated DeltaNet layer " + std::to_string(layer) + ": ", [&] {
        const std::string a = meta::require_string(f, "general.architecture") + ".";
        GdnLayer out;
        out.owned.reserve(4);
        GdnShape& s = out.shape;
        s.hidden = meta::require_positive_int(f, a + "embedding_length");
        s.conv_kernel = meta::require_positive_int(f, a + "ssm.conv_kernel");
        s.k_dim = meta::require_positive_int(f, a + "ssm.state_size");
        s.n_k_heads = meta::require_positive_int(f, a + "ssm.group_count");
        s.n_v_heads = meta::require_positive_int(f, a + "ssm.time_step_rank");
        const int64_t inner = meta::require_positive_int(f, a + "ssm.inner_size");
        s.eps = meta::require_float(f, a + "attention.layer_norm_rms_epsilon");
        s.gate_act = gate_act;
        if (s.n_v_heads % s.n_k_heads != 0)
            throw ModelFormatError(a + "ssm.time_step_rank (value heads, " + std::to_string(s.n_v_heads) +
                                   ") must be a multiple of ssm.group_count (key heads, " +
                                   std::to_string(s.n_k_heads) + ")");
        if (inner % s.n_v_heads != 0)
            throw ModelFormatError(a + "ssm.inner_size (" + std::to_string(inner) +
                                   ") must be a multiple of ssm.time_step_rank (" + std::to_string(s.n_v_heads) +
                                   ")");
        s.v_dim = inner / s.n_v_heads;

        const ModelWeights wt(f);
        const std::string p = "blk." + std::to_string(layer) + ".";
        GdnWeights& w = out.weights;
        w.qkv = wt.matrix(p + "attn_qkv.weight", s.conv_dim(), s.hidden);
        w.gate = wt.matrix(p + "attn_gate.weight", s.value_dim(), s.hidden);
        w.alpha = wt.matrix(p + "ssm_alpha.weight", s.n_v_heads, s.hidden);
        w.beta = wt.matrix(p + "ssm_beta.weight", s.n_v_heads, s.hidden);
        w.out = wt.matrix(p + "ssm_out.weight", s.hidden, s.value_dim());
        w.conv1d = wt.f32_or_convert(p + "ssm_conv1d.weight", {s.conv_kernel, s.conv_dim()}, out.owned);
        w.a = wt.f32_or_convert(p + "ssm_a", {s.n_v_heads}, out.owned);
        w.dt_bias = wt.f32_or_convert(p + "ssm_dt.bias", {s.n_v_heads}, out.owned);
        w.norm = wt.f32_or_convert(p + "ssm_norm.weight", {s.v_dim}, out.owned);
        return out;
    });
}

}  // namespace regolith
