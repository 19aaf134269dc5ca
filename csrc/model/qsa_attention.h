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

#include "core/buffers.h"
#include "model/weights.h"
#include "model/window_state.h"

namespace regolith {

class GgufSet;

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
    QsaDims dims() const {
        return {n_head, n_head_kv, head_dim, index_n_head, index_head_dim, compress_ratio, block_topk(), n_rot, eps};
    }
};

// The layer's tensors. Matrices are [rows][cols] = [out][in]; norm gammas already include the +1 that the
// converter folds in (y = x / rms(x) * gamma).
struct QsaWeights {
    Tensor q;             // attn_q:   [n_head * 2 * head_dim][hidden], per head q rows then gate rows
    Tensor k;             // attn_k:   [n_head_kv * head_dim][hidden]
    Tensor v;             // attn_v:   [n_head_kv * head_dim][hidden]
    Tensor o;             // attn_output: [hidden][n_head * head_dim]
    Tensor q_norm;        // attn_q_norm: [head_dim]
    Tensor k_norm;        // attn_k_norm: [head_dim]
    Tensor index_q;       // indexer.q_proj: [index_n_head * index_head_dim][hidden]
    Tensor index_k;       // indexer.k_proj: [index_head_dim][hidden]
    Tensor index_q_norm;  // indexer.q_norm: [index_head_dim]
    Tensor index_k_norm;  // indexer.k_norm: [index_head_dim]
};

// What one QSA layer keeps between calls, in backend buffers. Storage grows with the tokens held (doubling,
// the old rows copied by the backend), up to max_ctx. Keys, values, indexer keys and pooled block keys are
// stored in the cache type (F32, F16, Q8_0, or I8 with a per-row scale: Backend::store_rows).
class QsaState {
public:
    // Throws Error when the backend has no kernels for the cache type or Q8_0 rows would not be whole blocks
    // (check_cache_type).
    QsaState(Backend& be, const QsaShape& shape, int64_t max_ctx, uint32_t cache_type = RG_TYPE_F32);
    static void check_cache_type(const Backend& be, const QsaShape& shape, uint32_t cache_type);

    uint32_t cache_type() const { return type_; }
    uint64_t bytes() const;  // backend memory held (its capacity's)

    int64_t size() const { return n_; }
    int64_t max_ctx() const { return max_ctx_; }
    int64_t n_blocks() const { return n_ / shape_.compress_ratio; }  // complete blocks

    // Keeps the first n tokens (speculative rollback). n must be <= size().
    void truncate(int64_t n);

    // Saving and restoring: tokens [from, to) as tensor views, in file order: keys [to-from][n_head_kv]
    // [head_dim], values (same shape), raw indexer keys [to-from][index_head_dim], positions [to-from][3]
    // (int64), then the pooled keys of blocks [from/ratio, to/ratio) [.][index_head_dim], each cache in the
    // cache type; an I8 state then has the four caches' row scales (F32) in the same order.
    void state_tensors(int64_t from, int64_t to, std::vector<Tensor>& out) const;
    // Holds n >= size() tokens, the new ones to be filled through state_tensors (throws Error beyond max_ctx).
    void grow(int64_t n);
    // Suffix cache reuse (as KvCache::move_state): tokens [src, src + n) of a saved state of `total` tokens
    // (the bytes of state_tensors(0, total)) into `dst`, the host spans of state_tensors(to, to + n): keys
    // turned by to - src positions (freq: the rotary pairs'), values and indexer keys copied, positions
    // shifted; the block keys' rows are left zero for QsaAttention::pool.
    void move_state(const uint8_t* saved, size_t saved_bytes, int64_t total, const std::vector<float>& freq,
                    int64_t src, int64_t to, int64_t n, const std::vector<StateSpan>& dst) const;

private:
    friend class QsaAttention;
    void reserve(int64_t n);
    QsaSeq seq(int64_t t0, int64_t ntok) const;  // this state as the sequence of a step's rows [t0, t0 + ntok)

    Backend* be_;
    QsaShape shape_;
    int64_t max_ctx_ = 0;
    uint32_t type_ = RG_TYPE_F32;
    int64_t n_ = 0;
    int64_t cap_ = 0;
    OwnedTensor k_;        // [cap * n_head_kv][head_dim]  after k_norm and RoPE
    OwnedTensor v_;        // [cap * n_head_kv][head_dim]
    OwnedTensor index_k_;  // [cap][index_head_dim]       raw indexer keys (pooling precedes norm and RoPE)
    OwnedTensor block_k_;  // [cap / ratio][index_head_dim] pooled, normed, rotated keys of complete blocks
    OwnedTensor pos_;      // [cap][3] I64                M-RoPE positions (t, h, w)
    // I8 caches: the row scales of k_, v_, index_k_, block_k_ ([rows][1] F32); empty otherwise
    OwnedTensor k_scale_, v_scale_, index_k_scale_, block_k_scale_;
};

// One sequence's rows in a forward over several: rows [t0, t0 + ntok) of x continue `state`, at M-RoPE
// positions pos3 (host [ntok][3]).
struct QsaRows {
    QsaState* state = nullptr;
    const int64_t* pos3 = nullptr;
    int64_t t0 = 0, ntok = 0;
};

class QsaAttention {
public:
    // Layer `layer` of a qwen4exp GGUF; validates the shape against the weights (throws ModelFormatError).
    QsaAttention(const ModelWeights& w, int64_t layer);

    const QsaShape& shape() const { return shape_; }
    QsaState new_state(Backend& be, int64_t max_ctx, uint32_t cache_type = RG_TYPE_F32) const {
        return QsaState(be, shape_, max_ctx, cache_type);
    }

    // y[t] = attention of token t over the state's tokens and tokens 0..t of this call; the tokens are
    // appended to the state. x: [ntok][hidden], pos3: host [ntok][3] M-RoPE positions (t, h, w) (text: the
    // same position thrice; image tokens: transformers' get_rope_index), y: [ntok][hidden]. Throws Error when
    // the state cannot hold ntok more tokens (the state is then unchanged).
    void forward(Workspace& ws, const Tensor& x, const int64_t* pos3, QsaState& state, const Tensor& y) const;
    // The same over the rows of several sequences, each with its own state; throws, changing no state, when
    // one cannot hold its tokens.
    void forward(Workspace& ws, const Tensor& x, const std::vector<QsaRows>& seqs, const Tensor& y) const;
    // The rotary pairs' frequencies (host): a moved token's keys turn by shift * freq[j].
    const std::vector<float>& rope_freq() const { return freq_host_; }
    // Pools again the block keys of the blocks that tokens [from, state.size()) complete (after a move).
    void pool(Workspace& ws, QsaState& state, int64_t from) const;

private:
    QsaShape shape_;
    QsaWeights w_;
    std::vector<float> freq_host_;
    Tensor freq_;  // [1][n_rot / 2] F32: 1 / base^(2i / n_rot)
    Tensor axis_;  // [1][n_rot / 2] I32: 0 t, 1 h, 2 w (rope_sections)
};

// Shape of QSA layer `layer` of a qwen4exp GGUF. Throws ModelFormatError naming the missing or malformed key.
QsaShape qsa_shape_from_gguf(const GgufSet& file, int64_t layer);

}  // namespace regolith
