// The qwen4_exp (Qwen3.8-Flash-Next) text model on the Backend op interface: embeddings, hc residual
// streams, Gated DeltaNet / QSA mixers, PLE layers, sparse MoE, the final hyper-connection mixer and the LM
// head. Weights are views into the GGUF mapping; all decoding state lives in a Qwen4ExpWindow.
//
// The same engine runs the family's models without qwen4_exp's additions: Qwen3.5 MoE and Qwen3-Next
// (llama.cpp's `qwen35moe`, `qwen3next`): pre-norm residuals (HyperConnection::pre_norm), gated full
// attention with a KV cache (GatedAttention) instead of QSA, no PLE, and the Gated DeltaNet's output gate
// SiLU (qwen3next's value heads in grouped order, its alpha and beta one matrix: model/gated_delta_net.h).
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
#include "model/gated_attention.h"
#include "model/gated_delta_net.h"
#include "model/hyper_connection.h"
#include "model/language_model.h"
#include "model/moe.h"
#include "model/ple.h"
#include "model/qsa_attention.h"
#include "model/qwen4exp_mtp.h"
#include "model/weights.h"

namespace regolith {

struct Qwen4ExpConfig {
    std::string arch;     // general.architecture: "qwen4exp", "qwen35moe" or "qwen3next"
    bool hyper = true;    // hyper-connections (qwen4exp); else pre-norm residuals (hc = 1)
    int64_t n_layer = 0;  // main layers: block_count - nextn_predict_layers
    int64_t n_nextn = 0;  // nextn_predict_layers: MTP blocks after the main layers (0 or 1)
    int64_t hidden = 0;
    int64_t vocab = 0;
    int64_t context_length = 0;
    int64_t hc = 0;
    int64_t hc_rank = 0;
    float eps = 1e-6f;
    std::vector<bool> recurrent;  // per layer: Gated DeltaNet (true) or attention (QSA; gated full attention)
    std::vector<int64_t> ple_layers;  // layers with a PLE n-gram addend (0-based)
    MoeShape moe;
    // The Gated DeltaNet output gate: llama.cpp's qwen4exp graph uses sigmoid; transformers uses the
    // checkpoint's output_gate_type (or hidden_act). regolith's converter records it in
    // qwen4exp.ssm.gate_activation; files without the key get llama.cpp's sigmoid. Qwen3.5's is SiLU.
    GdnGateAct gdn_gate = GdnGateAct::Sigmoid;

    static Qwen4ExpConfig from_gguf(const GgufSet& file);
};

// How a model's routed experts (ExpertLoadOptions) and PLE table are reached.
struct Qwen4ExpLoadOptions : ExpertLoadOptions {
    // The PLE table: the packed ple.bin at `ple_path`, else the GGUF's per_layer_token_embd.weight.
    std::string ple_path;
    PleReadOptions ple;
};

class Qwen4ExpWindow;

// Image input for Qwen4ExpWindow::eval_multimodal: the rows of a call whose input embedding is given (the
// vision tower's features) instead of looked up by token id, and every token's M-RoPE position.
struct MultimodalRows {
    const float* embd = nullptr;    // [n_rows][hidden]
    const int64_t* rows = nullptr;  // [n_rows] indices into the call's tokens
    int64_t n_rows = 0;
    const int64_t* pos3 = nullptr;  // [n][3] (t, h, w) positions of the call's tokens
};

class Qwen4ExpModel {
public:
    // Maps and validates a qwen4exp, qwen35moe or qwen3next GGUF: `files` as GgufSet takes them (the model's shards, then side files
    // such as the PLE table or the MTP head). Throws GGUFError / ModelFormatError.
    explicit Qwen4ExpModel(const std::vector<std::vector<std::string>>& files, const Qwen4ExpLoadOptions& options = {},
                           Backend& backend = cpu_backend());

    Backend& backend() const { return backend_; }
    ~Qwen4ExpModel();

    const Qwen4ExpConfig& config() const { return config_; }
    const GgufSet& file() const { return file_; }
    bool has_mtp() const { return mtp_ != nullptr; }
    const MtpHead* mtp() const { return mtp_.get(); }
    // The expert arena (null when the experts are resident) and the PLE tables (one per PLE layer).
    ExpertArena* arena() const { return arena_.get(); }
    std::vector<PleTable*> ple_tables() const;
    // Changes cache-aware routing for every layer (MoCE needs an arena to have an effect).
    void set_moce(const MoceOptions& moce);
    // A window of up to max_ctx tokens whose attention caches (QSA layers and the MTP head: QsaState; full
    // attention layers: KvCache) are of `cache_type`; throws Error where the backend has no kernels for it.
    std::unique_ptr<ModelWindow> new_window(int64_t max_ctx, uint32_t cache_type = RG_TYPE_F32) const;
    // Throws Error, as new_window would, where this model's windows cannot have caches of `cache_type`.
    void check_cache_type(uint32_t cache_type) const;

private:
    friend class Qwen4ExpWindow;
    struct Layer {
        HyperConnection attn_hc, ffn_hc;
        std::optional<GatedDeltaNet> gdn;
        std::optional<QsaAttention> qsa;
        std::optional<GatedAttention> attn;
        SparseMoe moe;
        std::unique_ptr<PleLayer> ple;  // on PLE layers: the n-gram addend to the streams
    };

    GgufSet file_;
    Backend& backend_;
    WeightStore store_;
    ModelWeights weights_;
    Qwen4ExpConfig config_;
    std::unique_ptr<ExpertArena> arena_;
    bool lookahead_ = false;
    Tensor tok_embd_;  // [vocab, hidden]
    Tensor output_;    // [vocab, hidden] (token_embd when tied)
    HyperConnection out_hc_;
    std::vector<Layer> layers_;
    std::unique_ptr<MtpHead> mtp_;  // block n_layer, when the file has its nextn tensors
};

// One inference context: tokens in, logits out, continuing from the state of earlier calls.
class Qwen4ExpWindow final : public ModelWindow {
public:
    Qwen4ExpWindow(const Qwen4ExpModel& model, int64_t max_ctx, uint32_t cache_type);

    int64_t n_past() const override { return n_past_; }
    int64_t max_ctx() const override { return max_ctx_; }
    uint64_t attention_cache_bytes() const override;
    uint64_t scratch_peak_bytes() const override;
    int64_t vocab() const override;
    int64_t hidden() const { return model_.config_.hidden; }
    void reset() override;
    void eval(const int32_t* tokens, int64_t n, float* logits, bool all_logits) override;
    void eval_steps(const std::vector<WindowStep>& steps) override;
    // eval with images: rows `mm.rows` take `mm.embd` as their input embedding (their ids, the image token,
    // still feed PLE, as transformers does) and the tokens take their M-RoPE positions from mm.pos3.
    void eval_multimodal(const int32_t* tokens, int64_t n, const MultimodalRows& mm, float* logits, bool all_logits);
    // Gated DeltaNet and PLE states keep no history: truncate(n_past) succeeds, and so does any n within the
    // last eval after checkpoint() (from the per-token states it kept).
    bool truncate(int64_t n) override;
    void checkpoint() override;
    void submit() override { be_.submit(); }
    bool has_draft_head() const override { return model_.mtp_ != nullptr; }
    std::vector<int32_t> draft(int32_t next, int64_t n) override;
    int64_t catch_up_draft_head() override;
    int64_t draft_head_lag() const override;
    // Per layer in order: the PLE part (if any), then the Gated DeltaNet, QSA or KV cache part.
    void export_state(int64_t from, const StateFn& fn) override;
    void import_state(int64_t from, int64_t n, bool whole, const StateFn& fn) override;
    // Suffix cache reuse moves the attention layers' rows (full attention's KV; QSA's keys, values, indexer
    // keys and positions, its block keys pooled again), the Gated DeltaNet states and PLE's conv history kept
    // as they are (its n-gram context set from `recent`).
    bool can_move() const override { return true; }
    void append_moved(const std::vector<StatePart>& saved, int64_t total, int64_t src, int64_t n,
                      const std::vector<int32_t>& recent) override;
    void truncate_attention(int64_t n, const std::vector<int32_t>& recent) override;
    void adopt_recurrent(const std::vector<StatePart>& saved, const std::vector<int32_t>& recent) override;

private:
    // A step's share of this window: its tokens, images (single-window evals only), logits, rows in the step.
    struct Part {
        Qwen4ExpWindow* w;
        WindowStep step;
        const MultimodalRows* mm;
        int64_t t0 = 0;
    };
    void check(const int32_t* tokens, int64_t n, const MultimodalRows* mm) const;
    // Validates, runs the parts in one pass, and resets every window of the step if it fails there.
    static void eval_parts(std::vector<Part>& parts);
    static void forward(std::vector<Part>& parts);
    void reset_locked();
    void prepare_slots(int64_t n);  // rollback slots for an eval of n tokens; slot 0 = the current states
    std::vector<TensorPart> state_parts(int64_t from, int64_t to, bool whole);
    // PLE layers' n-gram contexts: the last ids of `recent`, padded in front as a new window's are.
    void set_ple_context(const std::vector<int32_t>& recent);

    mutable std::mutex mutex_;
    const Qwen4ExpModel& model_;
    Backend& be_;
    Workspace ws_;  // the scratch tensors of an eval
    int64_t max_ctx_;
    uint32_t cache_type_;
    int64_t n_past_ = 0;
    std::vector<std::optional<GdnStates>> gdn_;  // per layer, one row
    std::vector<std::optional<QsaState>> qsa_;
    std::vector<std::optional<KvCache>> kv_;
    std::vector<std::optional<PleState>> ple_;
    std::optional<MtpContext> mtp_;

    // Rollback slots of the last eval after checkpoint(): slot s holds the states after its first s tokens.
    struct Checkpoint {
        int64_t base = -1;                          // n_past at checkpoint(); -1: no rollback possible
        std::vector<std::optional<GdnStates>> gdn;  // [layer]: rows = slots
        std::vector<std::vector<PleState>> ple;     // [layer][slot]
    };
    bool armed_ = false;  // checkpoint() was called; the next eval fills the slots
    Checkpoint cp_;
};

}  // namespace regolith
