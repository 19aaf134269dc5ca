// Gated DeltaNet: the linear-attention mixer of qwen4exp (transformers `Qwen4ExpTextGatedDeltaNet`).
//
//   qkv = W_qkv x  → causal depthwise conv1d (state: the last kernel-1 inputs) → SiLU → q | k | v
//   q, k L2-normalised per head (q also scaled by k_dim^-1/2); v head h reads k head h % n_k_heads
//   g = a * softplus(alpha x + dt_bias)   (a = -exp(A_log), as the GGUF stores it);  beta = sigmoid(beta x)
//   S_h ← S_h * exp(g);  S_h ← S_h + k (beta (v - S_h^T k))^T;  o = S_h^T q       (S_h: [k_dim][v_dim] fp32)
//   y = W_out (rms_norm(o) * norm * act(W_gate x))   per v head; act = sigmoid (llama.cpp) or silu
//
// Head order is the GGUF's: llama.cpp's converter reorders value heads from HF's grouped order
// (v head i*r + j serves k head i, r = n_v/n_k) to tiled order (GGUF head j*n_k + i), in every tensor
// with a value-head axis (V rows of qkv and conv1d, gate rows, alpha/beta rows, a, dt_bias, out columns).
// Outputs are unchanged by that permutation; the recurrent state is stored in GGUF head order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ops.h"

namespace regolith {

class GgufFile;

enum class GdnGateAct { Sigmoid, Silu };

struct GdnShape {
    int64_t hidden = 0;
    int64_t n_k_heads = 0;    // ssm.group_count
    int64_t n_v_heads = 0;    // ssm.time_step_rank; a multiple of n_k_heads
    int64_t k_dim = 0;        // ssm.state_size: q/k head dim
    int64_t v_dim = 0;        // ssm.inner_size / n_v_heads
    int64_t conv_kernel = 0;  // ssm.conv_kernel
    float eps = 1e-6f;        // gated RMSNorm epsilon (attention.layer_norm_rms_epsilon)
    GdnGateAct gate_act = GdnGateAct::Sigmoid;

    int64_t key_dim() const { return n_k_heads * k_dim; }
    int64_t value_dim() const { return n_v_heads * v_dim; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels: q | k | v
};

// The GGUF tensors of one layer (ggml ne order in brackets; a WeightView row is one ne[0] run).
struct GdnWeights {
    WeightView qkv;    // attn_qkv    [hidden, conv_dim]
    WeightView gate;   // attn_gate   [hidden, value_dim]  (z)
    WeightView alpha;  // ssm_alpha   [hidden, n_v_heads]
    WeightView beta;   // ssm_beta    [hidden, n_v_heads]
    WeightView out;    // ssm_out     [value_dim, hidden]
    const float* conv1d = nullptr;   // ssm_conv1d [kernel, conv_dim]: conv1d[c * kernel + i], i = oldest first
    const float* a = nullptr;        // ssm_a      [n_v_heads] = -exp(A_log)
    const float* dt_bias = nullptr;  // ssm_dt.bias [n_v_heads]
    const float* norm = nullptr;     // ssm_norm   [v_dim] (plain gamma, no +1)
};

// The decoding state of one layer for one sequence.
struct GdnState {
    std::vector<float> conv;       // [kernel-1][conv_dim]: the last kernel-1 conv inputs, oldest first
    std::vector<float> recurrent;  // [n_v_heads][k_dim][v_dim] fp32, GGUF head order

    explicit GdnState(const GdnShape& s = {});
    void reset();                            // zeros, as at the start of a sequence
    void copy_from(const GdnState& other);  // same shape; no allocation (checkpoint / rollback)
};

class GatedDeltaNet {
public:
    static constexpr int64_t kChunk = 64;  // prefill chunk length (tokens)

    GatedDeltaNet(const GdnShape& shape, const GdnWeights& weights, Backend& backend);

    const GdnShape& shape() const { return shape_; }
    GdnState new_state() const { return GdnState(shape_); }

    // x: [ntok][hidden] → y: [ntok][hidden]; advances `state` by ntok tokens. ntok == 1 runs the recurrent
    // step; ntok > 1 the chunked scan (same result within fp32 rounding). Throws Error on a state of
    // another shape. With `after` ([ntok] states of this shape), after[t] receives the state following token
    // t and the scan runs the recurrent step token by token, computing exactly what ntok single-token calls
    // would (speculative verification rolls back to any of them).
    void forward(const float* x, int64_t ntok, GdnState& state, float* y, GdnState* after = nullptr) const;

private:
    GdnShape shape_;
    GdnWeights w_;
    Backend* backend_;
    std::vector<float> conv_t_;  // [kernel][conv_dim]: conv1d transposed
};

// Shape and weights of layer `layer` of a GGUF, with the small vectors converted to f32 where stored
// otherwise. Views point into `file`, which must outlive the result.
struct GdnLayer {
    GdnShape shape;
    GdnWeights weights;
    std::vector<std::vector<float>> owned;  // f32 copies of non-f32 conv1d / a / dt_bias / norm
};

// Reads `<arch>.ssm.*`, `<arch>.embedding_length`, `<arch>.attention.layer_norm_rms_epsilon` and the
// blk.<layer>.{attn_qkv, attn_gate, ssm_*} tensors. Throws ModelFormatError naming the key or tensor that is
// missing or mis-shaped.
GdnLayer load_gdn_layer(const GgufFile& file, int64_t layer, GdnGateAct gate_act = GdnGateAct::Sigmoid);

}  // namespace regolith
