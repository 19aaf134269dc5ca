#include "model/dense_lm.h"

#include <algorithm>
#include <cmath>
#include <variant>

#include "core/dequant.h"
#include "core/errors.h"
#include "core/thread_pool.h"
#include "model/metadata.h"
#include "model/nn.h"

namespace regolith {

namespace {

// Tokens per forward pass: bounds the activations ([chunk][n_ff] floats) while keeping prefill matmuls
// large enough to amortise each weight panel's decode.
constexpr int64_t kChunk = 512;
// Element-wise work below which the pool's hand-off costs more than it saves.
constexpr int64_t kParallelElements = 1 << 15;

// gelu with the tanh approximation (transformers' gelu_pytorch_tanh, ggml's gelu) in the form
// 0.5 x (1 + tanh(u)) = x * sigmoid(2u): one exp, and no cancellation for negative u.
float gelu_tanh(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + std::exp(-2.0f * u));
}

// Runs fn(i0, i1) over [0, n) rows, on the pool when the rows hold enough work.
template <class F>
void for_rows(int64_t n, int64_t row_elements, const F& fn) {
    if (n > 1 && n * row_elements >= kParallelElements)
        default_pool()->parallel_for(n, 1, fn);
    else
        fn(0, n);
}

// y[t] = rms_norm(x[t]) * w for n rows of `width`.
void rms_rows(const float* x, int64_t n, int64_t width, const float* w, float eps, float* y) {
    for_rows(n, width, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) nn::rms_norm(x + t * width, width, w, eps, y + t * width);
    });
}

void add_bias(float* y, int64_t n, int64_t width, const float* b) {
    if (!b) return;
    for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < width; ++i) y[t * width + i] += b[i];
}

// cos / sin of position * inv_freq[i] for positions n0..n0+n-1: [n][n_rot / 2] each.
struct RopeTable {
    std::vector<float> cos, sin;
    RopeTable(int64_t n0, int64_t n, int64_t n_rot, float base, float scale) {
        const int64_t half = n_rot / 2;
        std::vector<float> inv(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i)
            inv[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(n_rot)) * scale;
        cos.resize(size_t(n * half));
        sin.resize(size_t(n * half));
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < half; ++i) {
                const float angle = float(n0 + t) * inv[size_t(i)];
                cos[size_t(t * half + i)] = std::cos(angle);
                sin[size_t(t * half + i)] = std::sin(angle);
            }
    }
    // Rotates the leading n_rot dims of the heads of token t (NEOX pairs i, i + n_rot/2). x: [n_heads][head_dim].
    void apply(float* x, int64_t t, int64_t n_heads, int64_t head_dim, int64_t n_rot) const {
        const int64_t half = n_rot / 2;
        const float* c = &cos[size_t(t * half)];
        const float* s = &sin[size_t(t * half)];
        for (int64_t h = 0; h < n_heads; ++h) {
            float* row = x + h * head_dim;
            for (int64_t i = 0; i < half; ++i) {
                const float a = row[i], b = row[i + half];
                row[i] = a * c[i] - b * s[i];
                row[i + half] = a * s[i] + b * c[i];
            }
        }
    }
};

}  // namespace

DenseConfig DenseConfig::from_gguf(const GgufFile& f) {
    DenseConfig c;
    c.arch = meta::get_string(f, "general.architecture").value_or("<missing>");
    if (c.arch != "gemma3" && c.arch != "qwen2")
        throw ModelFormatError("architecture '" + c.arch + "' is not supported by the dense loader (gemma3, qwen2)");
    const bool gemma = c.arch == "gemma3";
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
    c.n_ff = meta::require_positive_int(f, key("feed_forward_length"));
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

    // RoPE scaling as llama.cpp reads it: linear (the default type) with an optional factor; nothing else.
    const std::string scaling = meta::get_string(f, key("rope.scaling.type")).value_or("linear");
    if (scaling != "linear" && scaling != "none")
        throw ModelFormatError(key("rope.scaling.type") + " '" + scaling + "' is not supported (none, linear)");
    const auto factor = meta::get_float(f, key("rope.scaling.factor"));
    const float scale_linear = factor ? *factor : meta::get_float(f, key("rope.scale_linear")).value_or(0.0f);
    if (scaling == "linear" && scale_linear != 0.0f) c.rope_scale = 1.0f / scale_linear;

    c.swa.assign(size_t(c.n_layer), false);
    c.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
    if (gemma) {
        c.embed_scale = std::sqrt(float(c.hidden));
        c.qk_norm = c.post_norms = true;
        c.act = FfnActivation::GeluTanh;
        c.scale_query = true;
        // llama.cpp's rule: Gemma 3 27B (62 layers) scales by hidden / n_head (its query_pre_attn_scalar,
        // which the GGUF does not record), every other size by key_length.
        if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(float(c.hidden / c.n_head));
        c.final_softcap = meta::get_float(f, key("final_logit_softcapping")).value_or(0.0f);
        c.sliding_window = meta::get_int(f, key("attention.sliding_window")).value_or(0);
        if (c.sliding_window < 0) throw ModelFormatError(key("attention.sliding_window") + " must not be negative");
        if (c.sliding_window > 0) {
            // llama.cpp: a per-layer bool array, or every n-th layer global (n = the key's value, default 6)
            const std::string pkey = key("attention.sliding_window_pattern");
            const GgufValue* pv = f.find(pkey);
            if (pv && std::holds_alternative<GgufArray>(static_cast<const GgufVariant&>(*pv))) {
                const auto pattern = *meta::get_int_array(f, pkey, c.n_layer, /*allow_bool=*/true);
                for (int64_t il = 0; il < c.n_layer; ++il) c.swa[size_t(il)] = pattern[size_t(il)] != 0;
            } else {
                const int64_t n = meta::get_int(f, pkey).value_or(6);
                if (n < 0) throw ModelFormatError(pkey + " must not be negative");
                for (int64_t il = 0; il < c.n_layer; ++il) c.swa[size_t(il)] = n == 0 || il % n < n - 1;
            }
            c.rope_base_swa = meta::get_float(f, key("rope.freq_base_swa")).value_or(10000.0f);
        }
    }

    const GgufTensor* emb = f.find_tensor("token_embd.weight");
    if (!emb) throw ModelFormatError("missing tensor 'token_embd.weight'");
    c.vocab = int64_t(emb->ne[1]);
    return c;
}

DenseModel::DenseModel(const std::string& path, Backend& backend)
    : file_(path), weights_(file_), backend_(backend), config_(DenseConfig::from_gguf(file_)) {
    with_context(config_.arch + ": ", [&] {
        const DenseConfig& c = config_;
        const int64_t h = c.hidden, qd = c.n_head * c.head_dim, kvd = c.n_head_kv * c.head_dim;
        const auto vec = [&](const std::string& name, int64_t n) {
            return weights_.f32_or_convert(name, {n}, owned_);
        };
        const auto opt_vec = [&](const std::string& name, int64_t n) {
            return weights_.has(name) ? vec(name, n) : nullptr;
        };
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
            if (c.qk_norm) {
                L.q_norm = vec(p + "attn_q_norm.weight", c.head_dim);
                L.k_norm = vec(p + "attn_k_norm.weight", c.head_dim);
            }
            L.ffn_norm = vec(p + "ffn_norm.weight", h);
            L.gate = weights_.matrix(p + "ffn_gate.weight", c.n_ff, h);
            L.up = weights_.matrix(p + "ffn_up.weight", c.n_ff, h);
            L.down = weights_.matrix(p + "ffn_down.weight", h, c.n_ff);
            if (c.post_norms) {
                L.post_attn_norm = vec(p + "post_attention_norm.weight", h);
                L.post_ffn_norm = vec(p + "post_ffw_norm.weight", h);
            }
        }
    });
}

std::unique_ptr<ModelWindow> DenseModel::new_window(int64_t max_ctx, KvType kv_type) const {
    return std::make_unique<DenseWindow>(*this, max_ctx, kv_type);
}

DenseWindow::DenseWindow(const DenseModel& model, int64_t max_ctx, KvType kv_type)
    : model_(model), max_ctx_(max_ctx), kv_type_(kv_type) {
    if (max_ctx <= 0) throw Error("window: max_ctx must be positive");
    reset_locked();
}

void DenseWindow::reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    reset_locked();
}

void DenseWindow::reset_locked() {
    const DenseConfig& c = model_.config_;
    n_past_ = 0;
    kv_.clear();
    for (int64_t il = 0; il < c.n_layer; ++il) kv_.emplace_back(c.n_head_kv, c.head_dim, max_ctx_, kv_type_);
}

bool DenseWindow::truncate(int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n < 0 || n > n_past_)
        throw Error("window: cannot truncate to " + std::to_string(n) + " of " + std::to_string(n_past_) + " tokens");
    for (KvCache& kv : kv_) kv.truncate(n);
    n_past_ = n;
    return true;
}

std::vector<StatePart> DenseWindow::state_parts(int64_t from, int64_t to) {
    std::vector<StatePart> parts;
    const StateDtype dtype = kv_type_ == KvType::F16 ? StateDtype::F16 : StateDtype::F32;
    for (size_t il = 0; il < kv_.size(); ++il) {
        parts.push_back({StateKind::Kv, uint32_t(il), dtype, {}});
        kv_[il].state_spans(from, to, parts.back().spans);
    }
    return parts;
}

void DenseWindow::export_state(int64_t from, const StateFn& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (from < 0 || from > n_past_)
        throw Error("window: cannot save from token " + std::to_string(from) + " of " +
                    std::to_string(n_past_));
    std::vector<StatePart> parts = state_parts(from, n_past_);
    fn(parts);
}

void DenseWindow::import_state(int64_t from, int64_t n, bool /*whole: the caches are all positional*/,
                               const StateFn& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_state_import(from, n, n_past_, max_ctx_);
    try {
        for (KvCache& kv : kv_) kv.grow(n);
        std::vector<StatePart> parts = state_parts(from, n);
        fn(parts);
        n_past_ = n;
    } catch (...) {
        reset_locked();
        throw;
    }
}

void DenseWindow::eval(const int32_t* tokens, int64_t n, float* logits, bool all_logits) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t vocab = model_.config_.vocab;
    if (n <= 0) return;
    for (int64_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            throw Error("token id " + std::to_string(tokens[i]) + " is out of range [0, " + std::to_string(vocab) +
                        ")");
    if (n_past_ + n > max_ctx_)
        throw Error("context overflow: " + std::to_string(n_past_) + " + " + std::to_string(n) +
                    " tokens exceed the window's " + std::to_string(max_ctx_));
    try {
        for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
            const int64_t m = std::min(kChunk, n - c0);
            float* out = all_logits ? logits + c0 * vocab : (c0 + m == n ? logits : nullptr);
            eval_chunk(tokens + c0, m, out, all_logits);
        }
    } catch (...) {
        // Layers before the failure have extended their caches: forget everything rather than continue
        // from a state that matches no token sequence.
        reset_locked();
        throw;
    }
}

// Runs n tokens through the model; logits: [n][vocab] (all_logits), [1][vocab] for the last token, or null.
void DenseWindow::eval_chunk(const int32_t* tokens, int64_t n, float* logits, bool all_logits) {
    const DenseConfig& c = model_.config_;
    Backend& be = model_.backend_;
    const int64_t h = c.hidden, H = c.n_head, KV = c.n_head_kv, D = c.head_dim, ff = c.n_ff;

    std::vector<float> x(size_t(n * h));  // [n][hidden] residual stream
    const WeightView& te = model_.tok_embd_;
    for (int64_t t = 0; t < n; ++t) {
        float* row = &x[size_t(t * h)];
        dequantize_row(te.type, static_cast<const uint8_t*>(te.data) + tokens[t] * te.row_bytes, row, h);
        if (c.embed_scale != 1.0f)
            for (int64_t i = 0; i < h; ++i) row[i] *= c.embed_scale;
    }
    const RopeTable rope_global(n_past_, n, c.n_rot, c.rope_base, c.rope_scale);
    const bool any_swa = std::find(c.swa.begin(), c.swa.end(), true) != c.swa.end();
    const RopeTable rope_swa(n_past_, any_swa ? n : 0, c.n_rot, c.rope_base_swa, 1.0f);

    std::vector<float> xn(size_t(n * h)), o(size_t(n * h));        // [n][hidden]
    std::vector<float> q(size_t(n * H * D)), att(size_t(n * H * D));  // [n][H][D]
    std::vector<float> k(size_t(n * KV * D)), v(size_t(n * KV * D));  // [n][KV][D]
    std::vector<float> gate(size_t(n * ff)), up(size_t(n * ff));      // [n][n_ff]
    const auto residual = [&](const float* post_norm) {
        if (post_norm) rms_rows(o.data(), n, h, post_norm, c.eps, o.data());
        for (int64_t i = 0; i < n * h; ++i) x[size_t(i)] += o[size_t(i)];
    };

    for (int64_t il = 0; il < c.n_layer; ++il) {
        const DenseModel::Layer& L = model_.layers_[size_t(il)];
        const bool swa = c.swa[size_t(il)];
        const RopeTable& rope = swa ? rope_swa : rope_global;

        // attention
        rms_rows(x.data(), n, h, L.attn_norm, c.eps, xn.data());
        be.matmul(L.q, xn.data(), n, q.data());
        be.matmul(L.k, xn.data(), n, k.data());
        be.matmul(L.v, xn.data(), n, v.data());
        add_bias(q.data(), n, H * D, L.q_bias);
        add_bias(k.data(), n, KV * D, L.k_bias);
        add_bias(v.data(), n, KV * D, L.v_bias);
        for (int64_t t = 0; t < n; ++t) {
            float* qt = &q[size_t(t * H * D)];
            float* kt = &k[size_t(t * KV * D)];
            if (L.q_norm) {
                rms_rows(qt, H, D, L.q_norm, c.eps, qt);
                rms_rows(kt, KV, D, L.k_norm, c.eps, kt);
            }
            rope.apply(qt, t, H, D, c.n_rot);
            rope.apply(kt, t, KV, D, c.n_rot);
            if (c.scale_query)
                for (int64_t i = 0; i < H * D; ++i) qt[i] *= c.attn_scale;
        }
        kv_[size_t(il)].append(k.data(), v.data(), n);
        const AttentionShape shape{H, KV, D, swa ? c.sliding_window : 0, c.scale_query ? 1.0f : c.attn_scale};
        causal_attention(be, shape, kv_[size_t(il)], q.data(), n, att.data());
        be.matmul(L.o, att.data(), n, o.data());
        residual(L.post_attn_norm);

        // feed-forward: down(act(gate(x)) * up(x))
        rms_rows(x.data(), n, h, L.ffn_norm, c.eps, xn.data());
        be.matmul(L.gate, xn.data(), n, gate.data());
        be.matmul(L.up, xn.data(), n, up.data());
        for_rows(n, ff, [&](int64_t t0, int64_t t1) {
            for (int64_t i = t0 * ff; i < t1 * ff; ++i) {
                const float g = gate[size_t(i)];
                gate[size_t(i)] = (c.act == FfnActivation::GeluTanh ? gelu_tanh(g) : nn::silu(g)) * up[size_t(i)];
            }
        });
        be.matmul(L.down, gate.data(), n, o.data());
        residual(L.post_ffn_norm);
    }
    n_past_ += n;
    if (!logits) return;

    // LM head on the rows whose logits are wanted: every token, or the last (prefill for generation)
    const int64_t first = all_logits ? 0 : n - 1, rows = n - first, vocab = c.vocab;
    rms_rows(&x[size_t(first * h)], rows, h, model_.output_norm_, c.eps, xn.data());
    be.matmul(model_.output_, xn.data(), rows, logits);
    add_bias(logits, rows, vocab, model_.output_bias_);
    if (c.final_softcap > 0.0f)
        for (int64_t i = 0; i < rows * vocab; ++i)
            logits[i] = c.final_softcap * std::tanh(logits[i] / c.final_softcap);
}

}  // namespace regolith
