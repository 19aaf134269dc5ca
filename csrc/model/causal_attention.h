// The dense decoder models' attention cache (model/dense_lm.h): keys and values of one layer per position,
// in backend buffers laid out for Backend::attention (keys [n_head_kv][cap][head_dim], values transposed
// [n_head_kv][head_dim][cap]). Storage grows geometrically up to max_ctx tokens, in multiples of 16
// positions; positions past size() hold zeros (the attention's aligned key ranges give them probability 0).
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffers.h"
#include "model/window_state.h"

namespace regolith {

// How a cache stores keys and values. F16 is llama.cpp's default cache and computes as ggml's f16 products
// do: the query and the attention probabilities are rounded to f16 before their products (f32 sums).
// F32 keeps every value in float32. Q8_0 and I8 (int8 rows with an f32 scale) quantize each head's key and
// value rows (Backend::store_rows) and compute as an F32 cache holding the dequantized values would.
enum class KvType { F16, F32, Q8_0, I8 };

// The tensor type of a cache type (RG_TYPE_F16, ...).
uint32_t kv_tensor_type(KvType type);
// The cache type of a tensor type (RG_TYPE_F32, F16, Q8_0, I8); throws Error for another.
KvType kv_type_of(uint32_t tensor_type);

class KvCache {
public:
    KvCache(Backend& be, int64_t n_head_kv, int64_t head_dim, int64_t max_ctx, KvType type);

    int64_t size() const { return n_; }
    int64_t max_ctx() const { return max_ctx_; }
    KvType type() const { return type_; }
    uint64_t bytes() const;  // backend memory held (its capacity's)
    // Keeps the first n tokens (0 <= n <= size()).
    void truncate(int64_t n);
    // Makes room for ntok more tokens (Error beyond max_ctx) and returns this cache as the sequence of a step
    // appending them at rows [t0, t0 + ntok) of its activations; the caller then runs kv_append and
    // attention, and commit(ntok).
    KvSeq append_seq(int64_t t0, int64_t ntok);
    void commit(int64_t ntok) { n_ += ntok; }

    // Saving and restoring: positions [from, to) as tensor views in the cache's element type, keys
    // [n_head_kv][to - from][head_dim] then values [n_head_kv][head_dim][to - from]; Q8_0 / I8: values as
    // rows [n_head_kv][to - from][head_dim], then for I8 the key and value row scales [n_head_kv][n].
    void state_tensors(int64_t from, int64_t to, std::vector<Tensor>& out) const;
    // Holds n >= size() positions, the new ones to be filled through state_tensors (Error beyond max_ctx).
    void grow(int64_t n);

    // Suffix cache reuse (ModelWindow::append_moved): positions [src, src + n) of a saved state of this
    // cache's layout holding `total` positions (`saved`: the bytes of state_tensors(0, total)'s spans, in
    // order) into `dst`, the host spans of state_tensors(to, to + n) (HostStateParts': any split of the
    // same bytes), each key turned by to - src positions: the NEOX pairs (j, j + freq.size()) of its leading
    // 2 * freq.size() dims by (to - src) * freq[j] radians, then stored again in the cache's type. Values
    // are copied.
    void move_state(const uint8_t* saved, size_t saved_bytes, int64_t total, const std::vector<float>& freq,
                    int64_t src, int64_t to, int64_t n, const std::vector<StateSpan>& dst) const;

private:
    void reserve(int64_t n);

    Backend* be_;
    int64_t n_head_kv_, head_dim_, max_ctx_;
    KvType type_;
    int64_t cap_ = 0;
    int64_t n_ = 0;
    OwnedTensor k_;   // [n_head_kv * cap][head_dim]
    OwnedTensor vt_;  // [n_head_kv * head_dim][cap] (F16 / F32)
    OwnedTensor v_;   // [n_head_kv * cap][head_dim] (Q8_0 / I8)
    OwnedTensor k_scale_, v_scale_;  // [n_head_kv * cap][1] F32 (I8)
};

}  // namespace regolith
