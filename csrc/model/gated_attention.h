// Gated full attention: the full-attention layers of Qwen3-Next and Qwen3.5 (transformers
// `Qwen3NextAttention` / `Qwen3_5MoeAttention`; llama.cpp's qwen3next / qwen35moe graphs):
//   [q | gate] = W_q x per head;  q = rope(rms_norm(q) * q_norm),  k = rope(rms_norm(W_k x) * k_norm),  v = W_v x
//   y = W_o (softmax(q k^T / sqrt(head_dim)) v * sigmoid(gate))          (causal, GQA)
// RoPE rotates the leading rope.dimension_count dims of each head (NEOX pairs); Qwen3.5's interleaved M-RoPE
// sections pick each pair's position axis (text tokens have the same position on all three). Keys and values
// live in a KvCache (model/causal_attention.h) as the dense models' do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/buffers.h"
#include "model/causal_attention.h"
#include "model/weights.h"

namespace regolith {

class GgufSet;

struct GatedAttentionShape {
    int64_t hidden = 0;     // embedding_length
    int64_t n_head = 0;     // attention.head_count
    int64_t n_head_kv = 0;  // attention.head_count_kv (divides n_head)
    int64_t head_dim = 0;   // attention.key_length == attention.value_length
    int64_t n_rot = 0;      // rope.dimension_count: leading dims rotated (NEOX pairs i, i + n_rot/2)
    // rope.dimension_sections (interleaved M-RoPE, as QsaShape's); absent: every pair takes the t position
    int64_t rope_sections[3] = {0, 0, 0};
    float rope_base = 0.0f;  // rope.freq_base
    float eps = 0.0f;        // attention.layer_norm_rms_epsilon
};

// One sequence's rows in a forward over several: rows [t0, t0 + ntok) of x continue `cache`, at M-RoPE
// positions pos3 (host [ntok][3]).
struct AttentionRows {
    KvCache* cache = nullptr;
    const int64_t* pos3 = nullptr;
    int64_t t0 = 0, ntok = 0;
};

class GatedAttention {
public:
    // Layer `layer` of a qwen3next / qwen35moe GGUF (the architecture's keys); validates the shape against
    // the weights (throws ModelFormatError).
    GatedAttention(const ModelWeights& w, int64_t layer);

    const GatedAttentionShape& shape() const { return shape_; }
    KvCache new_cache(Backend& be, int64_t max_ctx, KvType type) const {
        return KvCache(be, shape_.n_head_kv, shape_.head_dim, max_ctx, type);
    }
    // The rotary pairs' frequencies (host): a text token's keys turn by shift * freq[j] when it moves
    // (every M-RoPE axis of a text token moves alike).
    const std::vector<float>& rope_freq() const { return freq_host_; }
    // y [ntok][hidden] for x [ntok][hidden]: each sequence's rows attend over its cache and its earlier rows
    // of this call, and are appended to its cache. Throws Error, changing no cache, when one cannot hold its
    // rows.
    void forward(Workspace& ws, const Tensor& x, const std::vector<AttentionRows>& seqs, const Tensor& y) const;

private:
    GatedAttentionShape shape_;
    Tensor q_, k_, v_, o_;    // [n_head * 2 * head_dim][hidden] (per head q rows, then gate rows), ...
    Tensor q_norm_, k_norm_;  // [head_dim], the converter's 1 + w
    Tensor freq_;             // [1][n_rot / 2] F32: 1 / base^(2i / n_rot)
    Tensor axis_;             // [1][n_rot / 2] I32: 0 t, 1 h, 2 w
    std::vector<float> freq_host_;
};

}  // namespace regolith
