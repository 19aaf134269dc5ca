#include "model/gated_attention.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"
#include "core/gguf_set.h"
#include "model/metadata.h"

namespace regolith {

GatedAttention::GatedAttention(const ModelWeights& wt, int64_t layer) {
    with_context("attention layer " + std::to_string(layer) + ": ", [&] {
        const GgufSet& f = wt.file();
        const std::string a = meta::require_string(f, "general.architecture") + ".";
        GatedAttentionShape& s = shape_;
        s.hidden = meta::require_positive_int(f, a + "embedding_length");
        s.n_head = meta::require_positive_int(f, a + "attention.head_count");
        s.n_head_kv = meta::require_positive_int(f, a + "attention.head_count_kv");
        s.head_dim = meta::require_positive_int(f, a + "attention.key_length");
        if (meta::get_int(f, a + "attention.value_length").value_or(s.head_dim) != s.head_dim)
            throw ModelFormatError(a + "attention.value_length must equal attention.key_length");
        if (s.n_head % s.n_head_kv != 0)
            throw ModelFormatError(a + "attention.head_count_kv must divide attention.head_count");
        s.n_rot = meta::get_int(f, a + "rope.dimension_count").value_or(s.head_dim);
        if (s.n_rot <= 0 || s.n_rot % 2 != 0 || s.n_rot > s.head_dim)
            throw ModelFormatError(a + "rope.dimension_count must be even and in 1..key_length, got " +
                                   std::to_string(s.n_rot));
        s.rope_base = meta::require_float(f, a + "rope.freq_base");
        if (auto sections = meta::get_int_array(f, a + "rope.dimension_sections"))
            for (size_t j = 0; j < 3 && j < sections->size(); ++j) s.rope_sections[j] = (*sections)[j];
        s.eps = meta::require_float(f, a + "attention.layer_norm_rms_epsilon");

        const std::string blk = "blk." + std::to_string(layer) + ".";
        q_ = wt.matrix(blk + "attn_q.weight", s.n_head * 2 * s.head_dim, s.hidden);
        k_ = wt.matrix(blk + "attn_k.weight", s.n_head_kv * s.head_dim, s.hidden);
        v_ = wt.matrix(blk + "attn_v.weight", s.n_head_kv * s.head_dim, s.hidden);
        o_ = wt.matrix(blk + "attn_output.weight", s.hidden, s.n_head * s.head_dim);
        q_norm_ = wt.f32_vector(blk + "attn_q_norm.weight", s.head_dim);
        k_norm_ = wt.f32_vector(blk + "attn_k_norm.weight", s.head_dim);
        return 0;
    });
    // inv_freq[i] = 1 / base^(2i / n_rot), in float32 as transformers computes it
    const GatedAttentionShape& s = shape_;
    const int64_t half = s.n_rot / 2;
    std::vector<float> freq(static_cast<size_t>(half));
    std::vector<int32_t> axis(freq.size());
    for (int64_t i = 0; i < half; ++i) {
        freq[size_t(i)] = 1.0f / std::pow(s.rope_base, float(2 * i) / float(s.n_rot));
        axis[size_t(i)] = i % 3 == 1 && i < 3 * s.rope_sections[1]   ? 1
                          : i % 3 == 2 && i < 3 * s.rope_sections[2] ? 2
                                                                     : 0;
    }
    freq_ = wt.store().upload(RG_TYPE_F32, 1, half, freq.data());
    axis_ = wt.store().upload(RG_TYPE_I32, 1, half, axis.data());
    freq_host_ = std::move(freq);
}

void GatedAttention::forward(Workspace& ws, const Tensor& x, const std::vector<AttentionRows>& seqs,
                             const Tensor& y) const {
    const GatedAttentionShape& s = shape_;
    const int64_t ntok = x.rows, H = s.n_head, KV = s.n_head_kv, D = s.head_dim;
    if (ntok == 0) return;
    for (const AttentionRows& r : seqs)
        if (r.cache->size() + r.ntok > r.cache->max_ctx())
            throw Error("attention context full: the cache holds " + std::to_string(r.cache->size()) + " of " +
                        std::to_string(r.cache->max_ctx()) + " tokens and cannot take " + std::to_string(r.ntok) +
                        " more; use a larger context or truncate the window");
    Backend& be = ws.backend();
    Workspace::Scope scope(ws);
    const Tensor qg = ws.f32(ntok, H * 2 * D);  // [ntok][H][2][D]: per head q, then gate
    const Tensor k = ws.f32(ntok, KV * D);      // [ntok][KV][D]
    const Tensor v = ws.f32(ntok, KV * D);
    const MatmulJob in[] = {{q_, x, qg}, {k_, x, k}, {v_, x, v}};
    be.matmul(in, 3);

    std::vector<int64_t> pos3(size_t(3 * ntok));
    for (const AttentionRows& r : seqs) std::copy_n(r.pos3, 3 * r.ntok, pos3.begin() + 3 * r.t0);
    const Tensor pos = ws.alloc(RG_TYPE_I64, ntok, 3);
    be.write(pos, pos3.data());
    const Tensor rot = ws.f32(ntok, s.n_rot);  // [ntok][cos | sin of each rotary pair]
    be.rope_table(pos, freq_, axis_, rot);
    const Tensor heads = qg.reshaped(ntok * H, 2 * D);
    const Tensor q = ws.f32(ntok, H * D);  // [ntok][H][D]
    be.rms_norm(heads.col_range(0, D), q_norm_, s.eps, q.reshaped(ntok * H, D));
    be.rope(q.reshaped(ntok * H, D), rot, H);
    const Tensor kh = k.reshaped(ntok * KV, D);
    be.rms_norm(kh, k_norm_, s.eps, kh);
    be.rope(kh, rot, KV);

    std::vector<KvSeq> kv;
    for (const AttentionRows& r : seqs) kv.push_back(r.cache->append_seq(r.t0, r.ntok));
    be.kv_append(k, v, kv.data(), int64_t(kv.size()), KV);
    const Tensor att = ws.f32(ntok, H * D);  // [ntok][H][D]
    be.attention(q, kv.data(), int64_t(kv.size()), {H, KV, D, 0, 1.0f / std::sqrt(float(D))}, att);
    for (const AttentionRows& r : seqs) r.cache->commit(r.ntok);
    const Tensor ah = att.reshaped(ntok * H, D);
    be.glu(heads.col_range(D, D), ah, Glu::Sigmoid, ah);
    be.matmul(o_, att, y);
}

}  // namespace regolith
