#include "model/dense_lm.h"

#include <algorithm>
#include <cmath>
#include <variant>

#include "core/errors.h"
#include "model/expert_file.h"
#include "model/lm_head.h"
#include "model/metadata.h"
#include "model/state_move.h"

namespace regolith {

namespace {

// Tokens per forward pass: bounds the activations ([chunk][n_ff] floats) while keeping prefill matmuls
// large enough to amortise each weight panel's decode.
constexpr int64_t kChunk = 512;

// RoPE inverse frequencies of pairs i < n_rot / 2: 1 / base^(2i / n_rot), times `scale` (linear), or YaRN's
// blend of the scaled and unscaled ones (transformers' _compute_yarn_parameters) when c.yarn_orig_ctx > 0.
std::vector<float> rope_inv_freq(const DenseConfig& c, float base, float scale, bool yarn) {
    const int64_t half = c.n_rot / 2;
    std::vector<float> freq(static_cast<size_t>(half));
    if (!yarn) {
        for (int64_t i = 0; i < half; ++i)
            freq[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(c.n_rot)) * scale;
        return freq;
    }
    // the pair index at which a frequency makes `rotations` turns over the original context
    const auto corr = [&](double rotations) {
        return double(c.n_rot) * std::log(double(c.yarn_orig_ctx) / (rotations * 2.0 * 3.14159265358979323846)) / (2.0 * std::log(double(base)));
    };
    double lo = corr(c.yarn_beta_fast), hi = corr(c.yarn_beta_slow);
    if (c.yarn_truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0), hi = std::min(hi, double(c.n_rot - 1));
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < half; ++i) {
        const float extrap = 1.0f / std::pow(base, float(2 * i) / float(c.n_rot));
        const float interp = extrap * scale;
        const float ramp = std::clamp(float((double(i) - lo) / (hi - lo)), 0.0f, 1.0f);  // 0: unscaled
        freq[size_t(i)] = interp * ramp + extrap * (1.0f - ramp);
    }
    return freq;
}
}  // namespace

DenseConfig DenseConfig::from_gguf(const GgufSet& f) {
    DenseConfig c;
    c.arch = meta::get_string(f, "general.architecture").value_or("<missing>");
    if (c.arch != "gemma3" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "qwen3moe" && c.arch != "gpt-oss")
        throw ModelFormatError("architecture '" + c.arch +
                               "' is not supported by the dense loader (gemma3, qwen2, qwen3, qwen3moe, gpt-oss)");
    const bool gemma = c.arch == "gemma3", oss = c.arch == "gpt-oss", moe = c.arch == "qwen3moe" || oss;
    const auto key = [&](const char* suffix) { return c.arch + "." + suffix; };
    c.n_layer = meta::require_positive_int(f, key("block_count"));
    // Every layer has tensors, so a count beyond the file's tensors is a lie (and must not size anything).
    if (c.n_layer > int64_t(f.tensors().size()))
        throw ModelFormatError(key("block_count") + " " + std::to_string(c.n_layer) + " exceeds the file's " +
                               std::to_string(f.tensors().size()) + " tensors");
    c.hidden = meta::require_positive_int(f, key("embedding_length"));
    c.n_head = meta::require_positive_int(f, key("attention.head_count"));
    c.n_head_kv = meta::get_int(f, key("attention.head_count_kv")).value_or(c.n_head);
    c.head_dim = meta::get_int(f, key("attention.key_length")).value_or(c.hidden / c.n_head);
    c.n_ff = moe ? 0 : meta::require_positive_int(f, key("feed_forward_length"));
    c.context_length = meta::get_int(f, key("context_length")).value_or(0);
    c.n_rot = meta::get_int(f, key("rope.dimension_count")).value_or(c.head_dim);
    c.eps = meta::require_float(f, key("attention.layer_norm_rms_epsilon"));
    c.rope_base = meta::get_float(f, key("rope.freq_base")).value_or(10000.0f);
    if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0)
        throw ModelFormatError(key("attention.head_count_kv") + " must be positive and divide head_count");
    if (c.head_dim <= 0 || meta::get_int(f, key("attention.value_length")).value_or(c.head_dim) != c.head_dim)
        throw ModelFormatError(key("attention.key_length") + " must be positive and equal value_length");
    if (c.n_rot <= 0 || c.n_rot % 2 != 0 || c.n_rot > c.head_dim)
        throw ModelFormatError(key("rope.dimension_count") + " must be even and in 1..key_length");

    // RoPE scaling as llama.cpp reads it: linear (the default type) with an optional factor, or YaRN.
    const std::string scaling = meta::get_string(f, key("rope.scaling.type")).value_or("linear");
    if (scaling != "linear" && scaling != "none" && scaling != "yarn")
        throw ModelFormatError(key("rope.scaling.type") + " '" + scaling + "' is not supported (none, linear, yarn)");
    const auto factor = meta::get_float(f, key("rope.scaling.factor"));
    const float scale_linear = factor ? *factor : meta::get_float(f, key("rope.scale_linear")).value_or(0.0f);
    if (scaling != "none" && scale_linear != 0.0f) {
        if (!(scale_linear > 0.0f) || !std::isfinite(scale_linear))
            throw ModelFormatError(key("rope.scaling.factor") + " must be positive");
        c.rope_scale = 1.0f / scale_linear;
    }
    if (scaling == "yarn" && c.rope_scale < 1.0f) {
        // llama.cpp's defaults: the training context, beta_fast 32, beta_slow 1, attention factor
        // (1 + 0.1 ln factor) * rope.scaling.attn_factor
        c.yarn_orig_ctx = meta::get_int(f, key("rope.scaling.original_context_length")).value_or(c.context_length);
        if (c.yarn_orig_ctx <= 0)
            throw ModelFormatError(key("rope.scaling.original_context_length") + " must be positive for YaRN");
        c.yarn_beta_fast = meta::get_float(f, key("rope.scaling.yarn_beta_fast")).value_or(32.0f);
        c.yarn_beta_slow = meta::get_float(f, key("rope.scaling.yarn_beta_slow")).value_or(1.0f);
        c.yarn_mscale = (1.0f + 0.1f * std::log(scale_linear)) *
                        meta::get_float(f, key("rope.scaling.attn_factor")).value_or(1.0f);
        // gpt-oss's configs say truncate: false (transformers' default is true), which the GGUF does not keep
        c.yarn_truncate = !oss;
    }

    c.swa.assign(size_t(c.n_layer), false);
    c.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
    c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3moe";
    if (moe) {
        // llama.cpp's qwen3moe graph: softmax over every expert, the top expert_used_count renormalised, no
        // shared expert. Its graph always renormalises; regolith's converter records transformers'
        // norm_topk_prob in expert_weights_norm (which llama.cpp ignores), files without the key renormalise.
        MoeShape& m = c.moe;
        m.hidden = c.hidden;
        m.n_expert = meta::require_positive_int(f, key("expert_count"));
        m.n_used = meta::require_positive_int(f, key("expert_used_count"));
        if (m.n_used > m.n_expert)
            throw ModelFormatError(key("expert_used_count") + " exceeds " + key("expert_count"));
        m.ff_expert = meta::require_positive_int(f, key("expert_feed_forward_length"));
        m.norm_topk_prob = meta::get_bool(f, key("expert_weights_norm")).value_or(true);
        const float scale = meta::get_float(f, key("expert_weights_scale")).value_or(0.0f);
        if (scale != 0.0f && scale != 1.0f)
            throw ModelFormatError(key("expert_weights_scale") + " is not supported (" + c.arch +
                                   " weights are unscaled)");
        if (oss) {
            // llama.cpp's gpt-oss graph: the softmax of the top-k biased logits (the renormalised top-k of
            // the softmax), biased expert products, the clamped SwiGLU
            m.norm_topk_prob = true;
            m.act = Glu::SwigluOai;
            m.biases = true;
        }
    }
    if (gemma) {
        c.embed_scale = std::sqrt(float(c.hidden));
        c.qk_norm = c.post_norms = true;
        c.act = FfnActivation::GeluTanh;
        c.scale_query = true;
        // llama.cpp's rule: Gemma 3 27B (62 layers) scales by hidden / n_head (its query_pre_attn_scalar,
        // which the GGUF does not record), every other size by key_length.
        if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(float(c.hidden / c.n_head));
        c.final_softcap = meta::get_float(f, key("final_logit_softcapping")).value_or(0.0f);
    }
    if (gemma || oss) {
        c.sliding_window = oss ? meta::require_positive_int(f, key("attention.sliding_window"))
                               : meta::get_int(f, key("attention.sliding_window")).value_or(0);
        if (c.sliding_window < 0) throw ModelFormatError(key("attention.sliding_window") + " must not be negative");
        if (c.sliding_window > 0) {
            // llama.cpp: a per-layer bool array, or every n-th layer global (n = the key's value, default 6)
            const std::string pkey = key("attention.sliding_window_pattern");
            const GgufValue* pv = f.find(pkey);
            if (pv && std::holds_alternative<GgufArray>(static_cast<const GgufVariant&>(*pv))) {
                const auto pattern = *meta::get_int_array(f, pkey, c.n_layer, /*allow_bool=*/true);
                for (int64_t il = 0; il < c.n_layer; ++il) c.swa[size_t(il)] = pattern[size_t(il)] != 0;
            } else {
                // gemma3: every 6th layer global; gpt-oss: every 2nd
                const int64_t n = meta::get_int(f, pkey).value_or(oss ? 2 : 6);
                if (n < 0) throw ModelFormatError(pkey + " must not be negative");
                for (int64_t il = 0; il < c.n_layer; ++il) c.swa[size_t(il)] = n == 0 || il % n < n - 1;
            }
            // gpt-oss: the global layers' base and scaling unless the file says otherwise (llama.cpp)
            c.rope_base_swa = meta::get_float(f, key("rope.freq_base_swa")).value_or(oss ? c.rope_base : 10000.0f);
            c.swa_scaled = oss;
        }
    }
    // YaRN's attention factor multiplies both q and k: q·k by its square
    c.attn_scale *= c.yarn_mscale * c.yarn_mscale;

    const GgufTensor* emb = f.find_tensor("token_embd.weight");
    if (!emb) throw ModelFormatError("missing tensor 'token_embd.weight'");
    c.vocab = int64_t(emb->ne[1]);
    return c;
}

DenseModel::DenseModel(const std::vector<std::vector<std::string>>& files, const ExpertLoadOptions& experts,
                       Backend& backend)
    : file_(files), backend_(backend), store_(file_, backend), weights_(store_), config_(DenseConfig::from_gguf(file_)) {
    with_context(config_.arch + ": ", [&] {
        const DenseConfig& c = config_;
        if (c.moe.n_expert > 0) {
            arena_ = open_expert_arena(file_, c.n_layer, c.n_layer, c.moe, experts, backend_);
            lookahead_ = arena_ && experts.lookahead;
        } else if (!experts.experts_path.empty() || experts.arena.slots > 0) {
            throw Error("a " + c.arch + " model has no routed experts to stream");
        }
        const int64_t h = c.hidden, qd = c.n_head * c.head_dim, kvd = c.n_head_kv * c.head_dim;
        const auto vec = [&](const std::string& name, int64_t n) { return weights_.f32_converted(name, {n}); };
        const auto opt_vec = [&](const std::string& name, int64_t n) {
            return weights_.has(name) ? vec(name, n) : Tensor{};
        };
        // RoPE frequencies in float32: the global layers' scaled, the sliding-window layers' as gpt-oss's
        // global ones or unscaled
        const int64_t half = c.n_rot / 2;
        const bool yarn = c.yarn_orig_ctx > 0;
        const std::vector<float> freq = rope_inv_freq(c, c.rope_base, c.rope_scale, yarn);
        const std::vector<float> freq_swa = c.swa_scaled ? rope_inv_freq(c, c.rope_base_swa, c.rope_scale, yarn)
                                                         : rope_inv_freq(c, c.rope_base_swa, 1.0f, false);
        const std::vector<int32_t> axis(static_cast<size_t>(half), 0);  // every pair turns by the (text) position
        rope_freq_ = store_.upload(RG_TYPE_F32, 1, half, freq.data());
        rope_freq_swa_ = store_.upload(RG_TYPE_F32, 1, half, freq_swa.data());
        rope_freq_host_ = freq, rope_freq_swa_host_ = freq_swa;
        rope_axis_ = store_.upload(RG_TYPE_I32, 1, half, axis.data());
        tok_embd_ = weights_.matrix("token_embd.weight", c.vocab, h);
        output_ = weights_.has("output.weight") ? weights_.matrix("output.weight", c.vocab, h) : tok_embd_;
        output_bias_ = opt_vec("output.bias", c.vocab);
        output_norm_ = vec("output_norm.weight", h);
        layers_.resize(size_t(c.n_layer));
        for (int64_t il = 0; il < c.n_layer; ++il) {
            const std::string p = "blk." + std::to_string(il) + ".";
            Layer& L = layers_[size_t(il)];
            L.attn_norm = vec(p + "attn_norm.weight", h);
            L.q = weights_.matrix(p + "attn_q.weight", qd, h);
            L.k = weights_.matrix(p + "attn_k.weight", kvd, h);
            L.v = weights_.matrix(p + "attn_v.weight", kvd, h);
            L.o = weights_.matrix(p + "attn_output.weight", h, qd);
            L.q_bias = opt_vec(p + "attn_q.bias", qd);
            L.k_bias = opt_vec(p + "attn_k.bias", kvd);
            L.v_bias = opt_vec(p + "attn_v.bias", kvd);
            L.o_bias = opt_vec(p + "attn_output.bias", h);
            if (c.arch == "gpt-oss") L.sinks = vec(p + "attn_sinks.weight", c.n_head);
            if (c.qk_norm) {
                L.q_norm = vec(p + "attn_q_norm.weight", c.head_dim);
                L.k_norm = vec(p + "attn_k_norm.weight", c.head_dim);
            }
            // gpt-oss names its pre-FFN norm post_attention_norm
            L.ffn_norm = vec(p + (c.arch == "gpt-oss" ? "post_attention_norm.weight" : "ffn_norm.weight"), h);
            if (c.moe.n_expert > 0) {
                L.moe = SparseMoe::load(weights_, int(il), c.moe, !arena_);
                if (arena_) L.moe->stream_from(arena_.get(), il);
                L.moe->set_moce(experts.moce);
            } else {
                L.gate = weights_.matrix(p + "ffn_gate.weight", c.n_ff, h);
                L.up = weights_.matrix(p + "ffn_up.weight", c.n_ff, h);
                L.down = weights_.matrix(p + "ffn_down.weight", h, c.n_ff);
            }
            if (c.post_norms) {
                L.post_attn_norm = vec(p + "post_attention_norm.weight", h);
                L.post_ffn_norm = vec(p + "post_ffw_norm.weight", h);
            }
        }
    });
}

DenseModel::~DenseModel() = default;

void DenseModel::set_moce(const MoceOptions& moce) {
    for (Layer& L : layers_)
        if (L.moe) L.moe->set_moce(moce);
}

std::unique_ptr<ModelWindow> DenseModel::new_window(int64_t max_ctx, KvType kv_type) const {
    return std::make_unique<DenseWindow>(*this, max_ctx, kv_type);
}

DenseWindow::DenseWindow(const DenseModel& model, int64_t max_ctx, KvType kv_type)
    : model_(model), be_(model.backend_), ws_(model.backend_), max_ctx_(max_ctx), kv_type_(kv_type) {
    if (max_ctx <= 0) throw Error("window: max_ctx must be positive");
    reset_locked();
}

uint64_t DenseWindow::scratch_peak_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ws_.held_peak();
}

uint64_t DenseWindow::attention_cache_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t n = 0;
    for (const KvCache& kv : kv_) n += kv.bytes();
    return n;
}

void DenseWindow::reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    reset_locked();
}

void DenseWindow::reset_locked() {
    const DenseConfig& c = model_.config_;
    n_past_ = 0;
    kv_.clear();
    for (int64_t il = 0; il < c.n_layer; ++il) kv_.emplace_back(be_, c.n_head_kv, c.head_dim, max_ctx_, kv_type_);
}

bool DenseWindow::truncate(int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n < 0 || n > n_past_)
        throw Error("window: cannot truncate to " + std::to_string(n) + " of " + std::to_string(n_past_) + " tokens");
    for (KvCache& kv : kv_) kv.truncate(n);
    n_past_ = n;
    return true;
}

std::vector<TensorPart> DenseWindow::state_parts(int64_t from, int64_t to) {
    std::vector<TensorPart> parts;
    const StateDtype dtype = kv_state_dtype(kv_tensor_type(kv_type_));
    for (size_t il = 0; il < kv_.size(); ++il) {
        std::vector<Tensor> ts;
        kv_[il].state_tensors(from, to, ts);
        TensorPart& p = parts.emplace_back(TensorPart{StateKind::Kv, uint32_t(il), dtype, {}});
        for (const Tensor& t : ts) p.items.push_back({t, {}});
    }
    return parts;
}

void DenseWindow::export_state(int64_t from, const StateFn& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (from < 0 || from > n_past_)
        throw Error("window: cannot save from token " + std::to_string(from) + " of " +
                    std::to_string(n_past_));
    HostStateParts host(be_, state_parts(from, n_past_));
    host.download();
    fn(host.parts());
}

void DenseWindow::import_state(int64_t from, int64_t n, bool /*whole: the caches are all positional*/,
                               const StateFn& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_state_import(from, n, n_past_, max_ctx_);
    try {
        for (KvCache& kv : kv_) kv.grow(n);
        HostStateParts host(be_, state_parts(from, n));
        fn(host.parts());
        host.upload();
        n_past_ = n;
    } catch (...) {
        reset_locked();
        throw;
    }
}

void DenseWindow::append_moved(const std::vector<StatePart>& saved, int64_t total, int64_t src, int64_t n,
                               const std::vector<int32_t>& /*recent: no n-gram state*/) {
    std::lock_guard<std::mutex> lock(mutex_);
    const DenseConfig& c = model_.config_;
    check_move(total, src, n, n_past_, max_ctx_);
    const StateDtype dtype = kv_state_dtype(kv_tensor_type(kv_type_));
    if (saved.size() != kv_.size())
        throw Error("window: a saved state of " + std::to_string(saved.size()) + " parts for " +
                    std::to_string(kv_.size()) + " layers");
    std::vector<const StatePart*> from;
    for (size_t il = 0; il < kv_.size(); ++il) from.push_back(&saved_part(saved, StateKind::Kv, uint32_t(il), dtype));
    if (n == 0) return;
    try {
        for (KvCache& kv : kv_) kv.grow(n_past_ + n);
        HostStateParts host(be_, state_parts(n_past_, n_past_ + n));
        for (size_t il = 0; il < kv_.size(); ++il) {
            const std::vector<float>& freq = c.swa[il] ? model_.rope_freq_swa_host_ : model_.rope_freq_host_;
            const StateSpan& sp = from[il]->spans[0];
            kv_[il].move_state(sp.data, sp.bytes, total, freq, src, n_past_, n, host.parts()[il].spans);
        }
        host.upload();
        n_past_ += n;
    } catch (...) {
        reset_locked();
        throw;
    }
}

void DenseWindow::eval(const int32_t* tokens, int64_t n, float* logits, bool all_logits) {
    eval_steps({WindowStep{this, tokens, n, logits, all_logits}});
}

void DenseWindow::eval_steps(const std::vector<WindowStep>& steps) {
    std::vector<WindowStep> live;  // the steps with tokens, their windows as DenseWindow
    std::vector<std::mutex*> mutexes;
    for (const WindowStep& s : steps) {
        auto* w = dynamic_cast<DenseWindow*>(s.window);
        if (!w || &w->model_ != &model_) throw Error("eval_windows: the windows belong to different models");
        if (s.n > 0) live.push_back(s), mutexes.push_back(&w->mutex_);
    }
    StepLocks locks(std::move(mutexes));
    const int64_t vocab = model_.config_.vocab;
    int64_t longest = 0;
    for (const WindowStep& s : live) {
        const auto* w = static_cast<const DenseWindow*>(s.window);
        for (int64_t i = 0; i < s.n; ++i)
            if (s.tokens[i] < 0 || s.tokens[i] >= vocab)
                throw Error("token id " + std::to_string(s.tokens[i]) + " is out of range [0, " +
                            std::to_string(vocab) + ")");
        if (w->n_past_ + s.n > w->max_ctx_)
            throw Error("context overflow: " + std::to_string(w->n_past_) + " + " + std::to_string(s.n) +
                        " tokens exceed the window's " + std::to_string(w->max_ctx_));
        longest = std::max(longest, s.n);
    }
    try {
        // Chunk c of every window that has one, in one pass each.
        for (int64_t c0 = 0; c0 < longest; c0 += kChunk) {
            std::vector<WindowStep> parts;
            for (const WindowStep& s : live) {
                if (s.n <= c0) continue;
                const int64_t m = std::min(kChunk, s.n - c0);
                float* out = s.all_logits ? s.logits + c0 * vocab : (c0 + m == s.n ? s.logits : nullptr);
                parts.push_back({s.window, s.tokens + c0, m, out, s.all_logits});
            }
            forward(parts);
        }
    } catch (...) {
        // Layers before the failure have extended their caches: forget everything rather than continue
        // from a state that matches no token sequence.
        for (const WindowStep& s : live) static_cast<DenseWindow*>(s.window)->reset_locked();
        throw;
    }
}

// Runs each part's tokens through the model, the rows of all parts in one pass: part i's rows follow part
// i-1's. A part's logits: [n][vocab] (all_logits), [1][vocab] for its last token, or null.
void DenseWindow::forward(const std::vector<WindowStep>& parts) {
    const auto win = [&](size_t i) { return static_cast<DenseWindow*>(parts[i].window); };
    const DenseModel& model = win(0)->model_;
    const DenseConfig& c = model.config_;
    Backend& be = win(0)->be_;
    Workspace& ws = win(0)->ws_;
    struct Release {  // the step's scratch, also when it fails
        Workspace& ws;
        ~Release() { ws.reset(); }
    } release{ws};
    const int64_t h = c.hidden, H = c.n_head, KV = c.n_head_kv, D = c.head_dim, ff = c.n_ff;

    std::vector<int64_t> t0(parts.size());  // each part's first row
    std::vector<int32_t> tokens;
    std::vector<int64_t> pos;  // [n][3] every row's position in its window
    for (size_t i = 0; i < parts.size(); ++i) {
        t0[i] = int64_t(tokens.size());
        tokens.insert(tokens.end(), parts[i].tokens, parts[i].tokens + parts[i].n);
        for (int64_t t = 0; t < parts[i].n; ++t) pos.insert(pos.end(), 3, win(i)->n_past_ + t);
    }
    const int64_t n = int64_t(tokens.size());
    const Tensor ids = ws.i32(n, 1);
    be.write(ids, tokens.data());
    const Tensor x = ws.f32(n, h);  // [n][hidden] residual stream
    be.get_rows(model.tok_embd_, ids, c.embed_scale, 1, x);
    // cos / sin of every position and rotary pair, for the global and the sliding-window layers
    const Tensor positions = ws.alloc(RG_TYPE_I64, n, 3);
    be.write(positions, pos.data());
    const Tensor rope_global = ws.f32(n, c.n_rot), rope_swa = ws.f32(n, c.n_rot);
    be.rope_table(positions, model.rope_freq_, model.rope_axis_, rope_global);
    if (std::find(c.swa.begin(), c.swa.end(), true) != c.swa.end())
        be.rope_table(positions, model.rope_freq_swa_, model.rope_axis_, rope_swa);

    const Tensor xn = ws.f32(n, h), o = ws.f32(n, h);          // [n][hidden]
    const Tensor q = ws.f32(n, H * D), att = ws.f32(n, H * D);  // [n][H][D]
    const Tensor k = ws.f32(n, KV * D), v = ws.f32(n, KV * D);  // [n][KV][D]
    const Tensor gate = ff > 0 ? ws.f32(n, ff) : Tensor{}, up = ff > 0 ? ws.f32(n, ff) : Tensor{};  // [n][n_ff]
    const auto residual = [&](const Tensor& post_norm) {
        if (post_norm) be.rms_norm(o, post_norm, c.eps, o);
        be.add(x, o, x);
    };
    const auto bias = [&](const Tensor& y, const Tensor& b) {
        if (b) be.add(y, b, y);
    };

    ExpertArena* arena = model.arena_.get();
    // a device-routed arena learns the step's routing afterwards: every layer's ids [n_layer][n * k]
    const bool routed = arena && arena->device_routed();
    const int64_t n_used = c.moe.n_used;
    int64_t longest = 0;  // decode steps (and short verifications) prefetch
    for (const WindowStep& p : parts) longest = std::max(longest, p.n);
    const Tensor routing = routed ? ws.i32(c.n_layer, n * n_used) : Tensor{};

    std::vector<KvSeq> seqs(parts.size());
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const DenseModel::Layer& L = model.layers_[size_t(il)];
        const bool swa = c.swa[size_t(il)];
        const Tensor& rope = swa ? rope_swa : rope_global;
        if (arena && !routed && model.lookahead_ && longest <= 8) {
            // Lookahead: this layer's router applied to its input (its MoE input as it would be without this
            // layer's attention), so the predicted experts load while the attention runs.
            be.rms_norm(x, L.ffn_norm, c.eps, xn);
            L.moe->prefetch(ws, xn);
        }

        // attention
        be.rms_norm(x, L.attn_norm, c.eps, xn);
        be.matmul(L.q, xn, q);
        be.matmul(L.k, xn, k);
        be.matmul(L.v, xn, v);
        bias(q, L.q_bias);
        bias(k, L.k_bias);
        bias(v, L.v_bias);
        const Tensor qh = q.reshaped(n * H, D), kh = k.reshaped(n * KV, D);
        if (L.q_norm) {
            be.rms_norm(qh, L.q_norm, c.eps, qh);
            be.rms_norm(kh, L.k_norm, c.eps, kh);
        }
        be.rope(qh, rope, H);
        be.rope(kh, rope, KV);
        if (c.scale_query) be.unary(q, Unary::Scale, c.attn_scale, q);
        for (size_t i = 0; i < parts.size(); ++i) seqs[i] = win(i)->kv_[size_t(il)].append_seq(t0[i], parts[i].n);
        be.kv_append(k, v, seqs.data(), int64_t(seqs.size()), KV);
        const AttentionShape shape{H, KV, D, swa ? c.sliding_window : 0, c.scale_query ? 1.0f : c.attn_scale, L.sinks};
        be.attention(q, seqs.data(), int64_t(seqs.size()), shape, att);
        for (size_t i = 0; i < parts.size(); ++i) win(i)->kv_[size_t(il)].commit(parts[i].n);
        be.matmul(L.o, att, o);
        bias(o, L.o_bias);
        residual(L.post_attn_norm);

        // feed-forward: down(act(gate(x)) * up(x)), or the mixture of experts
        be.rms_norm(x, L.ffn_norm, c.eps, xn);
        if (L.moe) {
            L.moe->forward(ws, xn, o, routed ? routing.row_range(il, 1).reshaped(n, n_used) : Tensor{});
        } else {
            be.matmul(L.gate, xn, gate);
            be.matmul(L.up, xn, up);
            be.glu(gate, up, c.act == FfnActivation::GeluTanh ? Glu::GeluTanh : Glu::Silu, gate);
            be.matmul(L.down, gate, o);
        }
        residual(L.post_ffn_norm);
    }
    if (arena) arena->end_step(routing);
    for (size_t i = 0; i < parts.size(); ++i) win(i)->n_past_ += parts[i].n;
    const WantedRows wanted = wanted_rows(parts, t0);
    if (wanted.rows.empty()) {
        be.submit();
        return;
    }

    // LM head on the rows whose logits are wanted: every token, or the last (prefill for generation)
    const int64_t rows = int64_t(wanted.rows.size());
    const Tensor xw = xn.row_range(0, rows);
    be.rms_norm(select_rows(ws, x, wanted), model.output_norm_, c.eps, xw);
    wanted.run(c.vocab, [&](float* logits) {
        lm_head(ws, model.output_, xw, logits, [&](const Tensor& lg) {
            bias(lg, model.output_bias_);
            if (c.final_softcap > 0.0f) be.unary(lg, Unary::Softcap, c.final_softcap, lg);
        });
    });
}

}  // namespace regolith
