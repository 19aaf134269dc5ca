// Decoder-only transformers with dense attention on every layer (llama.cpp's gemma3, qwen2, qwen3, qwen3moe
// and gpt-oss graphs) on the Backend op interface: token embedding, per layer RMSNorm -> GQA attention with
// RoPE -> residual -> RMSNorm -> FFN -> residual, final RMSNorm and the LM head. The FFN is a gated MLP, or a
// sparse mixture of experts (qwen3moe, gpt-oss: SparseMoe, its routed experts resident or streamed through
// an ExpertArena as qwen4exp's are). gpt-oss adds attention sinks, an output bias, sliding-window layers
// that alternate with global ones and YaRN RoPE. What differs between architectures is data in DenseConfig, so llama-like
// architectures are a new from_gguf case. Weights are views into the GGUF mapping; the KV caches live in a
// DenseWindow.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/buffers.h"
#include "core/expert_arena.h"
#include "core/gguf_set.h"
#include "model/causal_attention.h"
#include "model/language_model.h"
#include "model/moe.h"
#include "model/weights.h"

namespace regolith {

enum class FfnActivation { Silu, GeluTanh };  // act(gate) * up

struct DenseConfig {
    std::string arch;  // general.architecture
    int64_t n_layer = 0;
    int64_t hidden = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;  // attention.key_length == attention.value_length
    int64_t n_ff = 0;  // the dense MLP's width (0 in MoE models, whose feed_forward_length is not used)
    int64_t vocab = 0;
    int64_t context_length = 0;
    int64_t n_rot = 0;           // rope.dimension_count: leading dims rotated, NEOX pairs (i, i + n_rot/2)
    float eps = 1e-6f;           // attention.layer_norm_rms_epsilon
    float rope_base = 10000.0f;  // rope.freq_base (global layers)
    float rope_scale = 1.0f;     // RoPE scaling on global layers: 1 / rope.scaling.factor (linear or YaRN)
    float rope_base_swa = 10000.0f;  // rope.freq_base_swa (sliding-window layers)
    bool swa_scaled = false;         // sliding-window layers scaled as global ones (gpt-oss), else never
    // YaRN (rope.scaling.type yarn) when yarn_orig_ctx > 0: frequencies interpolated by rope_scale below the
    // correction range of the beta_fast / beta_slow rotations at yarn_orig_ctx, kept above it, a linear ramp
    // between (its ends rounded out unless !yarn_truncate: gpt-oss's checkpoints, as transformers runs
    // them); q·k scaled by yarn_mscale^2 (the cos / sin factor of both).
    int64_t yarn_orig_ctx = 0;
    float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
    bool yarn_truncate = true;
    float yarn_mscale = 1.0f;
    int64_t sliding_window = 0;      // attention.sliding_window; 0: none
    std::vector<bool> swa;           // per layer: sliding-window attention
    float attn_scale = 1.0f;
    bool scale_query = false;  // attn_scale multiplies q before q·k (gemma3), else q·k (qwen2), as llama.cpp
    float embed_scale = 1.0f;  // token embeddings are multiplied by it (gemma3: sqrt(hidden))
    bool qk_norm = false;      // per-head RMSNorm of q and k before RoPE (attn_q_norm / attn_k_norm)
    bool post_norms = false;   // RMSNorm of the attention and FFN outputs before their residual adds
    FfnActivation act = FfnActivation::Silu;
    float final_softcap = 0.0f;  // logits = c * tanh(logits / c) when > 0
    MoeShape moe;                // every layer's FFN is sparse MoE when moe.n_expert > 0 (qwen3moe)

    static DenseConfig from_gguf(const GgufSet& file);
};

class DenseWindow;

class DenseModel {
public:
    // Maps and validates a gemma3, qwen2, qwen3, qwen3moe or gpt-oss GGUF (files: as GgufSet takes them); `experts`
    // says how a MoE model's routed experts are reached. Throws GGUFError / ModelFormatError naming the key or
    // tensor.
    explicit DenseModel(const std::vector<std::vector<std::string>>& files, const ExpertLoadOptions& experts = {},
                        Backend& backend = cpu_backend());
    ~DenseModel();

    Backend& backend() const { return backend_; }
    const DenseConfig& config() const { return config_; }
    // The expert arena of a MoE model streaming its experts, else null.
    ExpertArena* arena() const { return arena_.get(); }
    // Changes cache-aware routing for every MoE layer (MoCE needs an arena to have an effect).
    void set_moce(const MoceOptions& moce);
    std::unique_ptr<ModelWindow> new_window(int64_t max_ctx, KvType kv_type = KvType::F16) const;

private:
    friend class DenseWindow;
    // Norm gammas as stored (llama.cpp's gemma converter already adds Gemma's +1); biases may be absent.
    struct Layer {
        Tensor attn_norm;                 // [hidden]
        Tensor q, k, v;                   // [n_head * D][hidden], [n_head_kv * D][hidden] twice
        Tensor o;                         // [hidden][n_head * D]
        Tensor q_bias, k_bias, v_bias, o_bias;
        Tensor sinks;                     // [1][n_head] (gpt-oss)
        Tensor q_norm, k_norm;            // [D]
        Tensor post_attn_norm;            // [hidden]
        Tensor ffn_norm;                  // [hidden]
        Tensor gate, up, down;            // [n_ff][hidden] twice, [hidden][n_ff]
        std::optional<SparseMoe> moe;     // instead of gate, up, down in MoE models
        Tensor post_ffn_norm;             // [hidden]
    };

    GgufSet file_;
    Backend& backend_;
    WeightStore store_;
    ModelWeights weights_;
    DenseConfig config_;
    std::unique_ptr<ExpertArena> arena_;
    bool lookahead_ = false;
    Tensor tok_embd_;     // [vocab][hidden]
    Tensor output_;       // [vocab][hidden] (token_embd when absent)
    Tensor output_bias_;  // [vocab]
    Tensor output_norm_;  // [hidden]
    Tensor rope_freq_, rope_freq_swa_, rope_axis_;  // [1][n_rot / 2]: global and sliding-window layers
    std::vector<float> rope_freq_host_, rope_freq_swa_host_;  // the same frequencies (suffix cache reuse)
    std::vector<Layer> layers_;
};

// One inference context: tokens in, logits out, continuing from the KV caches of earlier calls.
class DenseWindow final : public ModelWindow {
public:
    DenseWindow(const DenseModel& model, int64_t max_ctx, KvType kv_type);

    int64_t n_past() const override { return n_past_; }
    int64_t max_ctx() const override { return max_ctx_; }
    uint64_t attention_cache_bytes() const override;
    uint64_t scratch_peak_bytes() const override;
    int64_t vocab() const override { return model_.config_.vocab; }
    void reset() override;
    void eval(const int32_t* tokens, int64_t n, float* logits, bool all_logits) override;
    void eval_steps(const std::vector<WindowStep>& steps) override;
    // Always succeeds: the caches keep every position.
    bool truncate(int64_t n) override;
    void submit() override { be_.submit(); }
    void export_state(int64_t from, const StateFn& fn) override;
    void import_state(int64_t from, int64_t n, bool whole, const StateFn& fn) override;
    bool can_move() const override { return true; }
    void append_moved(const std::vector<StatePart>& saved, int64_t total, int64_t src, int64_t n,
                      const std::vector<int32_t>& recent) override;
    void truncate_attention(int64_t n, const std::vector<int32_t>&) override { truncate(n); }

private:
    // One forward pass of up to kChunk tokens per window; logits null: none wanted from that window.
    static void forward(const std::vector<WindowStep>& parts);
    void reset_locked();
    std::vector<TensorPart> state_parts(int64_t from, int64_t to);

    mutable std::mutex mutex_;
    const DenseModel& model_;
    Backend& be_;
    Workspace ws_;
    int64_t max_ctx_;
    KvType kv_type_;
    int64_t n_past_ = 0;
    std::vector<KvCache> kv_;  // per layer
};

}  // namespace regolith
