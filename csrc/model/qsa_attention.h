// QSA indexed attention (qwen4exp "full_attention" layers), reference semantics: transformers 5.24
// Qwen4ExpTextAttention + Qwen4ExpTextQSAIndexer.
//
// Per query token at cache index i (it sees cache tokens 0..i):
//   - the visible tokens split into nb = (i+1) / r complete blocks of r = compress_ratio tokens and a tail
//     [nb*r, i] of fewer than r tokens (the tail holds the query itself);
//   - block b is scored by the indexer: s_b = sum_h relu(iq_h . bk_b) / sqrt(index_head_dim), where bk_b is
//     the mean of the block's raw indexer keys, RMS-normed, then rotated at the position of its first token;
//   - attention runs over the top min(budget / r, nb) blocks by score (ties: lower block index wins) plus the
//     whole tail; nothing else (no sink or local window) is kept.
// Output: o_proj(attn * sigmoid(gate)).
#pragma once

#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "model/window_state.h"

namespace regolith {

class GgufFile;

struct QsaShape {
    int64_t hidden = 0;          // embedding_length
    int64_t n_head = 0;          // attention.head_count
    int64_t n_head_kv = 0;       // attention.head_count_kv (divides n_head)
    int64_t head_dim = 0;        // attention.key_length == attention.value_length
    int64_t n_rot = 0;           // rope.dimension_count: leading dims rotated (NEOX pairs i, i + n_rot/2)
    // rope.dimension_sections (interleaved M-RoPE): rotary pair i takes the h position when i % 3 == 1 and
    // i < 3 * sections[1], the w position when i % 3 == 2 and i < 3 * sections[2], else the t position.
    int64_t rope_sections[3] = {11, 11, 10};
    float rope_base = 0.0f;      // rope.freq_base
    float eps = 0.0f;            // attention.layer_norm_rms_epsilon
    int64_t index_n_head = 0;    // attention.indexer.head_count
    int64_t index_head_dim = 0;  // attention.indexer.key_length (one indexer key head)
    int64_t index_budget = 0;    // attention.indexer.top_k: tokens taken from complete blocks
    int64_t compress_ratio = 0;  // attention.compress_ratios[layer]: tokens per block

    int64_t block_topk() const { return index_budget / compress_ratio; }
};

// The layer's GGUF tensors. Matrices are [rows][cols] = [out][in]; norm gammas already include the +1
// that the converter folds in (y = x / rms(x) * gamma).
struct QsaWeights {
    WeightView q;                        // attn_q:   [n_head * 2 * head_dim][hidden], per head q rows then gate rows
    WeightView k;                        // attn_k:   [n_head_kv * head_dim][hidden]
    WeightView v;                        // attn_v:   [n_head_kv * head_dim][hidden]
    WeightView o;                        // attn_output: [hidden][n_head * head_dim]
    const float* q_norm = nullptr;       // attn_q_norm: [head_dim]
    const float* k_norm = nullptr;       // attn_k_norm: [head_dim]
    WeightView index_q;                  // indexer.q_proj: [index_n_head * index_head_dim][hidden]
    WeightView index_k;                  // indexer.k_proj: [index_head_dim][hidden]
    const float* index_q_norm = nullptr;  // indexer.q_norm: [index_head_dim]
    const float* index_k_norm = nullptr;  // indexer.k_norm: [index_head_dim]
};

// What one QSA layer keeps between calls. Storage grows with the tokens held, up to max_ctx.
class QsaState {
public:
    QsaState(const QsaShape& shape, int64_t max_ctx);

    int64_t size() const { return n_; }
    int64_t max_ctx() const { return max_ctx_; }
    int64_t n_blocks() const { return n_ / shape_.compress_ratio; }  // complete blocks

    // Keeps the first n tokens (speculative rollback). n must be <= size().
    void truncate(int64_t n);

    // Saving and restoring: tokens [from, to) as f32 / int64 spans: keys [to-from][n_head_kv][head_dim],
    // values (same shape), raw indexer keys [to-from][index_head_dim], positions [to-from][3] (int64), then the
    // pooled keys of blocks [from/ratio, to/ratio) [.][index_head_dim].
    void state_spans(int64_t from, int64_t to, std::vector<StateSpan>& out);
    // Holds n >= size() tokens, the new ones to be filled through state_spans (throws Error beyond max_ctx).
    void grow(int64_t n);

private:
    friend class QsaAttention;
    void reserve_(int64_t n);

    QsaShape shape_;
    int64_t max_ctx_ = 0;
    int64_t n_ = 0;
    std::vector<float> k_;        // [n][n_head_kv][head_dim]  after k_norm and RoPE
    std::vector<float> v_;        // [n][n_head_kv][head_dim]
    std::vector<float> index_k_;  // [n][index_head_dim]       raw indexer keys (pooling precedes norm and RoPE)
    std::vector<float> block_k_;  // [n / ratio][index_head_dim] pooled, normed, rotated keys of complete blocks
    std::vector<int64_t> pos_;    // [n][3]                     M-RoPE positions (t, h, w)
};

class QsaAttention {
public:
    // Validates the shape against the weights (throws ModelFormatError).
    QsaAttention(const QsaShape& shape, const QsaWeights& weights, Backend& backend);

    const QsaShape& shape() const { return shape_; }
    QsaState new_state(int64_t max_ctx) const { return QsaState(shape_, max_ctx); }

    // y[t] = attention of token t over the state's tokens and tokens 0..t of this call; the tokens are
    // appended to the state. x: [ntok][hidden], positions: [ntok] (text: the same position on every M-RoPE
    // section), y: [ntok][hidden]. Throws Error when the state cannot hold ntok more tokens (the state is
    // then unchanged).
    void forward(const float* x, const int64_t* positions, int64_t ntok, QsaState& state, float* y) const;
    // forward with M-RoPE positions [ntok][3] (t, h, w): image tokens (transformers' get_rope_index).
    void forward_mrope(const float* x, const int64_t* pos3, int64_t ntok, QsaState& state, float* y) const;

private:
    void rope_(float* x, int64_t n_rows, int64_t row_stride, const int64_t* pos3) const;

    QsaShape shape_;
    QsaWeights w_;
    Backend& backend_;
    std::vector<float> inv_freq_;   // [n_rot / 2]
    std::vector<uint8_t> rope_axis_;  // [n_rot / 2]: 0 t, 1 h, 2 w (rope_sections)
};

// Shape and weights of QSA layer `layer` of a qwen4exp GGUF; the weights point into `file`, which must
// outlive them. Throws ModelFormatError naming the missing or malformed key or tensor.
QsaShape qsa_shape_from_gguf(const GgufFile& file, int64_t layer);
QsaWeights qsa_weights_from_gguf(const GgufFile& file, int64_t layer, const QsaShape& shape);

}  // namespace regolith
