// Gated DeltaNet: the linear-attention mixer of qwen4exp (transformers `Qwen4ExpTextGatedDeltaNet`).
//
//   qkv = W_qkv x  → causal depthwise conv1d (state: the last kernel-1 inputs) → SiLU → q | k | v
//   q, k L2-normalised per head (q also scaled by k_dim^-1/2); v head h reads k head h % n_k_heads
//   g = a * softplus(alpha x + dt_bias)   (a = -exp(A_log), as the GGUF stores it);  beta = sigmoid(beta x)
//   S_h ← S_h * exp(g);  S_h ← S_h + k (beta (v - S_h^T k))^T;  o = S_h^T q       (S_h: [k_dim][v_dim] fp32)
//   y = W_out (rms_norm(o) * norm * act(W_gate x))   per v head; act = sigmoid (llama.cpp) or silu
//
// Head order is the GGUF's: llama.cpp's Qwen3.5 / qwen4exp converter reorders value heads from HF's grouped
// order (v head i*r + j serves k head i, r = n_v/n_k) to tiled order (GGUF head j*n_k + i), in every tensor
// with a value-head axis (V rows of qkv and conv1d, gate rows, alpha/beta rows, a, dt_bias, out columns).
// Its qwen3next converter keeps HF's grouped order (GdnShape::grouped) and writes alpha and beta as one
// matrix, ssm_ba, whose rows are per key head [beta of its r value heads, alpha of them].
// Outputs are unchanged by the order; the recurrent state is stored in GGUF head order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/buffers.h"
#include "model/weights.h"

namespace regolith {

class GgufSet;

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
    bool grouped = false;     // value heads in HF's grouped order (qwen3next), else tiled

    int64_t key_dim() const { return n_k_heads * k_dim; }
    int64_t value_dim() const { return n_v_heads * v_dim; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels: q | k | v
    int64_t conv_state() const { return (conv_kernel - 1) * conv_dim(); }
    int64_t recurrent_state() const { return n_v_heads * k_dim * v_dim; }
    GdnDims dims() const { return {n_k_heads, n_v_heads, k_dim, v_dim, grouped}; }
};

// The tensors of one layer (ggml ne order in brackets; a matrix row is one ne[0] run).
struct GdnWeights {
    Tensor qkv;      // attn_qkv    [hidden, conv_dim]
    Tensor gate;     // attn_gate   [hidden, value_dim]  (z)
    Tensor alpha;    // ssm_alpha   [hidden, n_v_heads]
    Tensor beta;     // ssm_beta    [hidden, n_v_heads]
    Tensor ba;       // ssm_ba      [hidden, 2 * n_v_heads] instead of alpha and beta (qwen3next)
    Tensor out;      // ssm_out     [value_dim, hidden]
    Tensor conv_t;   // ssm_conv1d  [kernel, conv_dim] transposed at load: [kernel][conv_dim], oldest tap first
    Tensor a;        // ssm_a       [n_v_heads] = -exp(A_log)
    Tensor dt_bias;  // ssm_dt.bias [n_v_heads]
    Tensor norm;     // ssm_norm    [v_dim] (plain gamma, no +1)
};

// Decoding states of one layer, one per row: the states of several sequences, or a window's checkpoint
// slots (row s: the state after the first s tokens of the last eval).
struct GdnStates {
    OwnedTensor conv;       // [n][(kernel-1) * conv_dim]: the last kernel-1 conv inputs, oldest first
    OwnedTensor recurrent;  // [n][n_v_heads * k_dim * v_dim] fp32, GGUF head order

    GdnStates(Backend& be, const GdnShape& s, int64_t n);
    int64_t size() const { return recurrent.t.rows; }
    void zero(Backend& be) const;
    // Row `to` of this set becomes row `from` of `src` (same layer shape).
    void copy_row(Backend& be, const GdnStates& src, int64_t from, int64_t to) const;
};

// One sequence's rows in a forward over several: row `row` of `states` advanced by rows [t0, t0 + ntok) of
// x, with optional per-token states `after` (as forward's).
struct GdnRows {
    const GdnStates* states = nullptr;
    int64_t row = 0;
    int64_t t0 = 0, ntok = 0;
    const GdnStates* after = nullptr;
};

class GatedDeltaNet {
public:
    static constexpr int64_t kChunk = 64;  // prefill chunk length (tokens)

    // Layer `layer` of a qwen4exp GGUF: reads `<arch>.ssm.*`, `<arch>.embedding_length`,
    // `<arch>.attention.layer_norm_rms_epsilon` and the blk.<layer>.{attn_qkv, attn_gate, ssm_*} tensors.
    // Throws ModelFormatError naming the key or tensor that is missing or mis-shaped.
    GatedDeltaNet(const ModelWeights& w, int64_t layer, GdnGateAct gate_act = GdnGateAct::Sigmoid);

    const GdnShape& shape() const { return shape_; }

    // x: [ntok][hidden] -> y: [ntok][hidden]; advances row `row` of `states` by ntok tokens. ntok == 1 runs the
    // recurrent step; ntok > 1 the chunked scan (same result within fp32 rounding). With `after` (slots of this
    // shape), its rows 1..ntok receive the states following each token and the scan runs the recurrent step
    // token by token, computing exactly what ntok single-token calls would (speculative verification rolls
    // back to any of them).
    void forward(Workspace& ws, const Tensor& x, const GdnStates& states, int64_t row, const Tensor& y,
                 const GdnStates* after = nullptr) const;
    // The same over the rows of several sequences, each with its own state (and its own choice of recurrent
    // step or chunked scan by its ntok): each sequence's output is what forward on its rows alone gives.
    void forward(Workspace& ws, const Tensor& x, const std::vector<GdnRows>& seqs, const Tensor& y) const;

private:
    GdnShape shape_;
    GdnWeights w_;
};

}  // namespace regolith
