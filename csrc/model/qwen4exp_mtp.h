// qwen4_exp's multi-token-prediction (MTP) head, one depth, as /work/notes/mtp_spec.md (docs/qwen4exp.md#mtp)
// defines it: for the main model's final hidden state h_t and the next token x = x_{t+1},
//   z = eh_proj [enorm(embed(x)); hnorm(h_t)],  s = z repeated over the hc streams,
//   s = one QSA decoder layer (hyper-connections, QSA attention at RoPE position t+1, sparse MoE; no PLE),
//   o = nextn.output_hc mixer(s),  logits(x_{t+2}) = lm_head(shared_head_norm(o)).
// Drafting k > 1 tokens feeds o of step k back as h with the token drafted at step k.
// Qwen3.5 MoE and Qwen3-Next heads (llama.cpp's qwen35moe / qwen3next graph_mtp, vLLM's Qwen3NextMTP): no
// hyper-connections, so z is the residual stream of one pre-norm decoder layer (gated full attention with
// a KV cache, sparse MoE), o = shared_head_norm(stream) and logits = lm_head(o); o (after the norm) is what
// drafting feeds back.
// GGUF: llama.cpp's nextn convention, the head is block L = n_layer (block_count = n_layer + 1,
// nextn_predict_layers = 1): blk.L.nextn.{eh_proj,enorm,hnorm,shared_head_norm,output_hc_*} and the decoder
// layer's usual blk.L.* tensors. Embedding and LM head are the main model's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/buffers.h"
#include "model/gated_attention.h"
#include "model/hyper_connection.h"
#include "model/moe.h"
#include "model/qsa_attention.h"
#include "model/weights.h"

namespace regolith {

// The head's attention state: QSA (qwen4exp) or a KV cache (qwen35moe, qwen3next).
struct MtpCache {
    std::optional<QsaState> qsa;
    std::optional<KvCache> kv;

    int64_t size() const { return qsa ? qsa->size() : kv->size(); }
    int64_t max_ctx() const { return qsa ? qsa->max_ctx() : kv->max_ctx(); }
    void truncate(int64_t n) { qsa ? qsa->truncate(n) : kv->truncate(n); }
};

class MtpHead {
public:
    // Block `layer` of a qwen4exp GGUF (hc > 1 streams: hyper-connections and QSA) or of a qwen35moe /
    // qwen3next one (hc == 1); tok_embd / output are the main model's; with an `arena` the routed experts stream
    // through it (its layer `layer`), as the main layers' do. Throws ModelFormatError.
    MtpHead(const ModelWeights& w, int64_t layer, int64_t hc, int64_t hc_rank, float eps, const MoeShape& moe,
            const Tensor& tok_embd, const Tensor& output, ExpertArena* arena);

    int64_t hidden() const { return hidden_; }
    int64_t vocab() const { return output_.rows; }
    // Throws Error, as new_state would, where the backend has no kernels for caches of `cache_type`.
    void check_cache_type(Backend& be, uint32_t cache_type) const;
    MtpCache new_state(Backend& be, int64_t max_ctx, uint32_t cache_type = RG_TYPE_F32) const;
    // Pairs (h[t], tokens[t]) at RoPE positions[t] -> o[t] (qwen4exp: before shared_head_norm; the others:
    // after it); the pairs join `state`. h, o: [ntok][hidden]; tokens, positions: host [ntok].
    void forward(Workspace& ws, const Tensor& h, const int32_t* tokens, const int64_t* positions, MtpCache& state,
                 const Tensor& o) const;
    // logits: [ntok][vocab] = lm_head(shared_head_norm(o)) (qwen4exp), lm_head(o) (the others).
    void logits(Workspace& ws, const Tensor& o, const Tensor& logits) const;
    // The greedy next token after o [1][hidden]: the argmax of its logits.
    int32_t next_token(Workspace& ws, const Tensor& o) const;

    // Whether block `layer` of the file holds an MTP head (its nextn.eh_proj tensor).
    static bool present(const GgufSet& file, int64_t layer);

private:
    int64_t hidden_, hc_;
    float eps_;
    Tensor tok_embd_, output_;
    Tensor eh_proj_;    // [hidden][2 * hidden]: embedding half first
    Tensor enorm_;      // [hidden] (GGUF stores 1 + w)
    Tensor hnorm_;      // [hidden]
    Tensor head_norm_;  // [hidden]
    bool hyper_;  // hyper-connections and QSA (qwen4exp), else pre-norm residuals and gated attention
    HyperConnection attn_hc_, ffn_hc_, out_hc_;
    std::optional<QsaAttention> qsa_;
    std::optional<GatedAttention> attn_;
    SparseMoe moe_;
};

// What a window keeps for its MTP head: the main model's final hidden state (on the backend) and the id of
// every token it holds, and the head's attention state over the pairs it has consumed. Pair i is
// (hidden[i], tokens[i+1]) at RoPE position i + 1. Rows before known_from are unknown (a restored state):
// the head covers pairs [known_from, known_from + kv.size()).
struct MtpContext {
    // Rows per head evaluation when catching up: a quarter of generation's 512-token prefill chunk, so that
    // taking in a long prompt at its first draft holds no more scratch than the prompt's evaluation did (the
    // plan counts that): on the tiny MTP model, one evaluation of 1,199 pairs held 7.3 MB where the prompt's
    // 512-token chunks held 3.1 MB.
    static constexpr int64_t kCatchUpRows = 128;
    // Final hidden states held for the head: after an evaluation (bound()), once more than this many pairs
    // wait, a head that has taken pairs in takes them in then, and one that has taken none in (it has not
    // drafted) keeps only the latest this many for its first draft, costing nothing while nothing drafts; the
    // rows more than this many tokens back that it has taken in are let go. So a window holds 14 MiB of them
    // at Flash-Next's width however long its context (every row, f32, was 1 GiB of a 128k-token window: 8 KiB
    // a token). A truncation to within them keeps the head's context; one further back restarts the head after
    // it (forget()).
    static constexpr int64_t kHeldRows = 1024;
    // Rows let go at a time (the rest move to the buffer's start).
    static constexpr int64_t kCompactRows = 256;
    // The buffer's rows: the held ones, those not yet let go and a 512-token prefill chunk's (the memory plan's
    // MTP_BUFFER_ROWS). A longer evaluation grows it for a moment.
    static constexpr int64_t kBufferRows = kHeldRows + kCompactRows + 512;

    Backend* be;
    int64_t width;                // hidden size
    int64_t max_ctx;
    OwnedTensor hidden;           // [capacity][width]: row r holds token base + r's final hidden state
    int64_t base = 0;             // the first token whose hidden state is held (rows below: let go or unknown)
    std::vector<int32_t> tokens;  // [n_past]
    int64_t known_from = 0;
    MtpCache kv;

    MtpContext(Backend& be, const MtpHead& head, int64_t max_ctx, uint32_t cache_type);
    int64_t size() const { return int64_t(tokens.size()); }
    void append(const int32_t* ids, const Tensor& rows);  // rows [n][width]
    void truncate(int64_t n);      // keep the first n tokens
    void forget(int64_t n);        // n tokens whose ids and hidden states are unknown (a restored state)
    // After an evaluation: when more than kHeldRows pairs wait, take them in (or, with none taken in yet, drop
    // the oldest), and let go of the rows no longer needed.
    void bound(Workspace& ws, const MtpHead& head);
    // A buffer of `rows` (at most max_ctx) holding the n rows from row `from` of the old one first.
    void resize(int64_t rows, int64_t from, int64_t n);
    // Runs the head over the pairs the held tokens determine that it has not consumed (all but the last
    // token's, which needs the next token), kCatchUpRows at a time: what a draft does first. Returns how many.
    int64_t catch_up(Workspace& ws, const MtpHead& head);
    // How many pairs catch_up would take in now.
    int64_t lag() const { return std::max<int64_t>(0, size() - 1 - known_from - kv.size()); }
    // Up to n greedy draft tokens after the held tokens and `next` (the token evaluated next), after a
    // catch-up of whatever pairs are pending.
    std::vector<int32_t> draft(Workspace& ws, const MtpHead& head, int32_t next, int64_t n);
};

}  // namespace regolith
