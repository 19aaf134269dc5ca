// Causal grouped-query attention over a per-window KV cache, the mixer of the dense decoder models
// (model/dense_lm.h). Both products (q·K and p·V) are Backend matmuls over views into the cache; the mask,
// softmax and the sliding window are applied by position in between.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "model/window_state.h"

namespace regolith {

// How a cache stores keys and values. F16 is llama.cpp's default cache and computes as ggml's f16 products
// do: the query and the attention probabilities are rounded to f16 before their products (f32 sums).
// F32 keeps every value in float32.
enum class KvType { F16, F32 };

struct AttentionShape {
    int64_t n_head = 0;
    int64_t n_head_kv = 0;  // divides n_head; query head h reads kv head h / (n_head / n_head_kv)
    int64_t head_dim = 0;   // key and value length
    int64_t window = 0;     // sliding window: a query at position p sees keys p-window+1..p; 0: all keys
    float scale = 1.0f;     // applied to q·k before the softmax
};

// The keys and values of one attention layer for positions 0..size()-1 (cache index == position).
// Storage grows geometrically up to max_ctx tokens.
class KvCache {
public:
    KvCache(int64_t n_head_kv, int64_t head_dim, int64_t max_ctx, KvType type);

    int64_t size() const { return n_; }
    int64_t max_ctx() const { return max_ctx_; }
    KvType type() const { return type_; }
    // Keeps the first n tokens (0 <= n <= size()).
    void truncate(int64_t n);
    // Appends ntok tokens; k, v: [ntok][n_head_kv][head_dim]. Throws Error beyond max_ctx.
    void append(const float* k, const float* v, int64_t ntok);
    // Keys of kv head `head` at positions [lo, hi): a [hi - lo][head_dim] matrix.
    WeightView keys(int64_t head, int64_t lo, int64_t hi) const;
    // Values of kv head `head` at positions [lo, hi), transposed: a [head_dim][hi - lo] matrix.
    WeightView values_t(int64_t head, int64_t lo, int64_t hi) const;

    // Saving and restoring: positions [from, to) as spans in the cache's element type, keys
    // [n_head_kv][to - from][head_dim] then values [n_head_kv][head_dim][to - from].
    void state_spans(int64_t from, int64_t to, std::vector<StateSpan>& out);
    // Holds n >= size() positions, the new ones to be filled through state_spans (Error beyond max_ctx).
    void grow(int64_t n);

private:
    void reserve(int64_t n);

    int64_t n_head_kv_, head_dim_, max_ctx_;
    KvType type_;
    int64_t elt_;  // bytes per element
    int64_t cap_ = 0;
    int64_t n_ = 0;
    std::vector<uint8_t> k_;   // [n_head_kv][cap][head_dim]
    std::vector<uint8_t> vt_;  // [n_head_kv][head_dim][cap]
};

// y[t] = attention of query t (at position cache.size() - ntok + t) over the cache's keys up to its own
// position. The cache must already hold the ntok tokens. q, y: [ntok][n_head][head_dim].
void causal_attention(Backend& backend, const AttentionShape& shape, const KvCache& cache, const float* q,
                      int64_t ntok, float* y);

}  // namespace regolith
