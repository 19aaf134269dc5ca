#include "model/qwen4exp.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "model/expert_file.h"
#include "model/lm_head.h"
#include "model/metadata.h"
#include "model/state_move.h"

namespace regolith {

Qwen4ExpConfig Qwen4ExpConfig::from_gguf(const GgufSet& f) {
    Qwen4ExpConfig c;
    c.arch = meta::get_string(f, "general.architecture").value_or("<missing>");
    if (c.arch != "qwen4exp" && c.arch != "qwen35moe" && c.arch != "qwen3next")
        throw ModelFormatError("architecture '" + c.arch + "' is not supported by the qwen4exp loader");
    c.hyper = c.arch == "qwen4exp";
    const std::string prefix = c.arch + ".";
    const auto key = [&](const char* suffix) { return prefix + suffix; };
    // llama.cpp's nextn convention: MTP blocks follow the main layers and count in block_count.
    const int64_t n_block = meta::require_int(f, key("block_count"));
    c.n_nextn = meta::get_int(f, key("nextn_predict_layers")).value_or(0);
    if (c.n_nextn < 0 || c.n_nextn > 1 || c.n_nextn >= n_block)
        throw ModelFormatError(key("nextn_predict_layers") + " must be 0 or 1 (and below block_count), got " +
                               std::to_string(c.n_nextn));
    c.n_layer = n_block - c.n_nextn;
    c.hidden = meta::require_int(f, key("embedding_length"));
    c.context_length = meta::get_int(f, key("context_length")).value_or(0);
    c.hc = c.hyper ? meta::require_int(f, key("hyper_connection.count")) : 1;
    c.hc_rank = c.hyper ? meta::require_int(f, key("hyper_connection.low_rank")) : 0;
    c.eps = meta::require_float(f, key("attention.layer_norm_rms_epsilon"));
    // Every layer has tensors, so a count beyond the file's tensors is a lie (and must not size anything).
    if (c.n_layer > int64_t(f.tensors().size()))
        throw ModelFormatError(key("block_count") + " " + std::to_string(c.n_layer) + " exceeds the file's " +
                               std::to_string(f.tensors().size()) + " tensors");
    if (c.n_layer <= 0 || c.hidden <= 0)
        throw ModelFormatError(c.arch + ": block_count and embedding_length must be positive");
    if (c.hyper && (c.hc <= 1 || c.hc_rank <= 0))
        throw ModelFormatError("qwen4exp: hyper_connection.low_rank must be positive and hyper_connection.count > 1");
    // Linear attention everywhere except every full_attention_interval-th layer, unless listed explicitly.
    // Per-layer arrays cover every block, MTP blocks included (llama.cpp's qwen35 converter marks those
    // non-recurrent); the main layers read their leading n_layer entries.
    if (auto rec = meta::get_int_array(f, key("attention.recurrent_layers"), n_block, /*allow_bool=*/true)) {
        for (int64_t i = 0; i < c.n_layer; ++i) c.recurrent.push_back((*rec)[size_t(i)] != 0);
    } else {
        const int64_t interval = meta::get_int(f, key("full_attention_interval")).value_or(4);
        if (interval <= 0) throw ModelFormatError(key("full_attention_interval") + " must be positive");
        for (int64_t i = 0; i < c.n_layer; ++i) c.recurrent.push_back((i + 1) % interval != 0);
    }
    // llama.cpp's qwen4exp graph gates with a sigmoid, its qwen35moe and qwen3next graphs (as transformers) SiLU
    const std::string gate = meta::get_string(f, key("ssm.gate_activation")).value_or(c.hyper ? "sigmoid" : "silu");
    if (gate != "sigmoid" && gate != "silu")
        throw ModelFormatError(key("ssm.gate_activation") + " must be 'sigmoid' or 'silu', not '" + gate + "'");
    c.gdn_gate = gate == "silu" ? GdnGateAct::Silu : GdnGateAct::Sigmoid;
    c.moe.hidden = c.hidden;
    c.moe.n_expert = meta::require_int(f, key("expert_count"));
    c.moe.n_used = meta::require_int(f, key("expert_used_count"));
    c.moe.ff_expert = meta::require_int(f, key("expert_feed_forward_length"));
    c.moe.ff_shared = meta::get_int(f, key("expert_shared_feed_forward_length")).value_or(0);
    c.moe.norm_topk_prob = meta::get_bool(f, key("expert_weights_norm")).value_or(true);
    if (c.moe.n_used <= 0 || c.moe.n_used > c.moe.n_expert)
        throw ModelFormatError(key("expert_used_count") + " must be in 1..expert_count");
    const GgufTensor* emb = f.find_tensor("token_embd.weight");
    if (!emb) throw ModelFormatError("missing tensor 'token_embd.weight'");
    c.vocab = int64_t(emb->ne[1]);
    if (auto ple = meta::get_int_array(f, key("ple.layers"))) {
        for (int64_t il : *ple)
            if (il < 0 || il >= c.n_layer) throw ModelFormatError(key("ple.layers") + " names layer " + std::to_string(il));
        c.ple_layers = *ple;
    }
    return c;
}

Qwen4ExpModel::Qwen4ExpModel(const std::vector<std::vector<std::string>>& files, const Qwen4ExpLoadOptions& options,
                             Backend& backend)
    : file_(files),
      backend_(backend),
      store_(file_, backend),
      weights_(store_),
      config_(Qwen4ExpConfig::from_gguf(file_)) {
    const Qwen4ExpConfig& c = config_;
    // Every block's experts, the MTP head's (block n_layer) included where the head is there (a model whose
    // head is in a side file it was loaded without has none): `regolith pack` stores them all.
    const bool head = c.n_nextn > 0 && MtpHead::present(file_, c.n_layer);
    arena_ = open_expert_arena(file_, c.n_layer + (head ? c.n_nextn : 0), c.n_layer, c.moe, options, backend_);
    lookahead_ = arena_ && options.lookahead;
    std::optional<PleTableSource> ple_source;
    if (!options.ple_path.empty()) ple_source = ple_table_from_pack(options.ple_path);
    tok_embd_ = weights_.matrix("token_embd.weight", c.vocab, c.hidden);
    output_ = weights_.has("output.weight") ? weights_.matrix("output.weight", c.vocab, c.hidden) : tok_embd_;
    out_hc_ = c.hyper ? HyperConnection::load(weights_, "output_hc", c.hidden, c.hc, c.hc_rank, c.eps, false)
                      : HyperConnection::pre_norm(weights_, "output_norm.weight", c.hidden, c.eps);
    layers_.reserve(size_t(c.n_layer));
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        const auto hc = [&](const char* name, const char* norm) {
            return c.hyper ? HyperConnection::load(weights_, p + name, c.hidden, c.hc, c.hc_rank, c.eps, true)
                           : HyperConnection::pre_norm(weights_, p + norm, c.hidden, c.eps);
        };
        Layer L{hc("hc_attn", "attn_norm.weight"),
                hc("hc_ffn", "post_attention_norm.weight"),
                std::nullopt,
                std::nullopt,
                std::nullopt,
                SparseMoe::load(weights_, int(il), c.moe, !arena_),
                nullptr};
        layers_.push_back(std::move(L));
        Layer& l = layers_.back();
        if (arena_) l.moe.stream_from(arena_.get(), il);
        l.moe.set_moce(options.moce);
        if (std::find(c.ple_layers.begin(), c.ple_layers.end(), il) != c.ple_layers.end())
            l.ple = std::make_unique<PleLayer>(weights_, il, options.ple, ple_source ? &*ple_source : nullptr);
        if (c.recurrent[size_t(il)])
            l.gdn.emplace(weights_, il, c.gdn_gate);
        else if (c.hyper)
            l.qsa.emplace(weights_, il);
        else
            l.attn.emplace(weights_, il);
    }
    if (head)
        mtp_ = std::make_unique<MtpHead>(weights_, c.n_layer, c.hc, c.hc_rank, c.eps, c.moe, tok_embd_, output_,
                                         arena_.get());
}

Qwen4ExpModel::~Qwen4ExpModel() = default;

std::vector<PleTable*> Qwen4ExpModel::ple_tables() const {
    std::vector<PleTable*> t;
    for (const auto& l : layers_)
        if (l.ple) t.push_back(&l.ple->table());
    return t;
}

void Qwen4ExpModel::set_moce(const MoceOptions& moce) {
    for (auto& l : layers_) l.moe.set_moce(moce);
}

std::unique_ptr<ModelWindow> Qwen4ExpModel::new_window(int64_t max_ctx, uint32_t cache_type) const {
    return std::make_unique<Qwen4ExpWindow>(*this, max_ctx, cache_type);
}

uint64_t Qwen4ExpWindow::scratch_peak_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ws_.held_peak();
}

uint64_t Qwen4ExpWindow::attention_cache_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t n = 0;
    for (const auto& q : qsa_)
        if (q) n += q->bytes();
    for (const auto& kv : kv_)
        if (kv) n += kv->bytes();
    return n;
}

void Qwen4ExpModel::check_cache_type(uint32_t cache_type) const {
    for (const auto& l : layers_) {
        if (l.qsa) QsaState::check_cache_type(backend_, l.qsa->shape(), cache_type);
        if (l.attn) l.attn->new_cache(backend_, 1, kv_type_of(cache_type));
    }
    if (mtp_) mtp_->check_cache_type(backend_, cache_type);
}

Qwen4ExpWindow::Qwen4ExpWindow(const Qwen4ExpModel& model, int64_t max_ctx, uint32_t cache_type)
    : model_(model), be_(model.backend_), ws_(model.backend_), max_ctx_(max_ctx), cache_type_(cache_type) {
    if (max_ctx <= 0) throw Error("window: max_ctx must be positive");
    reset();
}

int64_t Qwen4ExpWindow::vocab() const { return model_.config_.vocab; }

bool Qwen4ExpWindow::truncate(int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n < 0 || n > n_past_) throw Error("window: cannot truncate to " + std::to_string(n) + " of " +
                                          std::to_string(n_past_) + " tokens");
    if (n == n_past_) return true;
    if (cp_.base < 0 || n < cp_.base) return false;
    const size_t slot = size_t(n - cp_.base);
    for (size_t il = 0; il < model_.layers_.size(); ++il) {
        if (gdn_[il]) gdn_[il]->copy_row(be_, *cp_.gdn[il], int64_t(slot), 0);
        if (ple_[il]) ple_[il]->assign(be_, cp_.ple[il][slot]);
        if (qsa_[il]) qsa_[il]->truncate(n);
        if (kv_[il]) kv_[il]->truncate(n);
    }
    if (mtp_) mtp_->truncate(n);
    n_past_ = n;
    be_.submit();
    return true;
}

void Qwen4ExpWindow::checkpoint() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = true;
}

std::vector<int32_t> Qwen4ExpWindow::draft(int32_t next, int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!mtp_) return {};
    if (next < 0 || next >= model_.config_.vocab)
        throw Error("token id " + std::to_string(next) + " is out of range [0, " +
                    std::to_string(model_.config_.vocab) + ")");
    std::vector<int32_t> out = mtp_->draft(ws_, *model_.mtp_, next, std::min(n, kMaxCheckpointTokens));
    ws_.reset();
    return out;
}

int64_t Qwen4ExpWindow::catch_up_draft_head() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!mtp_) return 0;
    const int64_t n = mtp_->catch_up(ws_, *model_.mtp_);
    ws_.reset();
    be_.synchronize();
    return n;
}

int64_t Qwen4ExpWindow::draft_head_lag() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return mtp_ ? mtp_->lag() : 0;
}

void Qwen4ExpWindow::reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    reset_locked();
}

void Qwen4ExpWindow::reset_locked() {
    n_past_ = 0;
    armed_ = false;
    cp_.base = -1;
    mtp_.reset();
    if (model_.mtp_) mtp_.emplace(be_, *model_.mtp_, max_ctx_ + kMaxCheckpointTokens, cache_type_);
    gdn_.clear();
    qsa_.clear();
    kv_.clear();
    ple_.clear();
    for (const auto& l : model_.layers_) {
        ple_.push_back(l.ple ? std::optional<PleState>(l.ple->new_state(be_)) : std::nullopt);
        gdn_.emplace_back();
        if (l.gdn) gdn_.back().emplace(be_, l.gdn->shape(), 1), gdn_.back()->zero(be_);
        qsa_.push_back(l.qsa ? std::optional<QsaState>(l.qsa->new_state(be_, max_ctx_, cache_type_))
                             : std::nullopt);
        kv_.push_back(l.attn ? std::optional<KvCache>(l.attn->new_cache(be_, max_ctx_, kv_type_of(cache_type_)))
                             : std::nullopt);
    }
    be_.submit();
}

std::vector<TensorPart> Qwen4ExpWindow::state_parts(int64_t from, int64_t to, bool whole) {
    std::vector<TensorPart> parts;
    for (size_t il = 0; il < model_.layers_.size(); ++il) {
        const uint32_t layer = uint32_t(il);
        if (ple_[il] && whole) {
            PleState& p = *ple_[il];
            const StateSpan context{reinterpret_cast<uint8_t*>(p.context.data()), p.context.size() * sizeof(int64_t)};
            parts.push_back({StateKind::Ple, layer, StateDtype::Mixed, {{Tensor{}, context}, {p.conv.t, {}}}});
        }
        if (gdn_[il] && whole) {
            const GdnStates& g = *gdn_[il];
            parts.push_back({StateKind::Gdn, layer, StateDtype::F32, {{g.conv.t, {}}, {g.recurrent.t, {}}}});
        }
        if (qsa_[il]) {
            std::vector<Tensor> ts;
            qsa_[il]->state_tensors(from, to, ts);
            TensorPart& p =
                parts.emplace_back(TensorPart{StateKind::Qsa, layer, qsa_state_dtype(cache_type_), {}});
            for (const Tensor& t : ts) p.items.push_back({t, {}});
        }
        if (kv_[il]) {
            std::vector<Tensor> ts;
            kv_[il]->state_tensors(from, to, ts);
            TensorPart& p = parts.emplace_back(TensorPart{StateKind::Kv, layer, kv_state_dtype(cache_type_), {}});
            for (const Tensor& t : ts) p.items.push_back({t, {}});
        }
    }
    return parts;
}

void Qwen4ExpWindow::export_state(int64_t from, const StateFn& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (from < 0 || from > n_past_)
        throw Error("window: cannot save from token " + std::to_string(from) + " of " +
                    std::to_string(n_past_));
    HostStateParts host(be_, state_parts(from, n_past_, true));
    host.download();
    fn(host.parts());
}

void Qwen4ExpWindow::import_state(int64_t from, int64_t n, bool whole, const StateFn& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_state_import(from, n, n_past_, max_ctx_);
    try {
        for (auto& q : qsa_)
            if (q) q->grow(n);
        for (auto& kv : kv_)
            if (kv) kv->grow(n);
        HostStateParts host(be_, state_parts(from, n, whole));
        fn(host.parts());
        host.upload();
        n_past_ = n;
        armed_ = false;
        cp_.base = -1;
        if (mtp_) mtp_->forget(n);  // hidden states are not saved: the MTP head restarts after them
    } catch (...) {
        reset_locked();
        throw;
    }
}

void Qwen4ExpWindow::set_ple_context(const std::vector<int32_t>& recent) {
    for (size_t il = 0; il < ple_.size(); ++il) {
        if (!ple_[il]) continue;
        std::vector<int64_t>& ctx = ple_[il]->context;
        std::vector<int64_t> ids(ctx.size(), model_.layers_[il].ple->hash().eos_token_id);  // a new window's
        ids.insert(ids.end(), recent.begin(), recent.end());
        std::copy(ids.end() - int64_t(ctx.size()), ids.end(), ctx.begin());
    }
}

void Qwen4ExpWindow::append_moved(const std::vector<StatePart>& saved, int64_t total, int64_t src, int64_t n,
                                  const std::vector<int32_t>& recent) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_move(total, src, n, n_past_, max_ctx_);
    // the saved positional parts in state_parts' order (QSA before KV within a layer)
    std::vector<const StatePart*> from;
    for (size_t il = 0; il < model_.layers_.size(); ++il) {
        if (qsa_[il]) from.push_back(&saved_part(saved, StateKind::Qsa, uint32_t(il), qsa_state_dtype(cache_type_)));
        if (kv_[il]) from.push_back(&saved_part(saved, StateKind::Kv, uint32_t(il), kv_state_dtype(cache_type_)));
    }
    if (n == 0) return;
    const int64_t to = n_past_;
    try {
        for (auto& q : qsa_)
            if (q) q->grow(to + n);
        for (auto& kv : kv_)
            if (kv) kv->grow(to + n);
        HostStateParts host(be_, state_parts(to, to + n, false));
        for (size_t il = 0, i = 0; il < model_.layers_.size(); ++il) {
            const auto& L = model_.layers_[il];
            if (qsa_[il]) {
                const StateSpan& sp = from[i]->spans[0];
                qsa_[il]->move_state(sp.data, sp.bytes, total, L.qsa->rope_freq(), src, to, n, host.parts()[i].spans);
                ++i;
            }
            if (kv_[il]) {
                const StateSpan& sp = from[i]->spans[0];
                kv_[il]->move_state(sp.data, sp.bytes, total, L.attn->rope_freq(), src, to, n, host.parts()[i].spans);
                ++i;
            }
        }
        host.upload();
        Workspace::Scope scope(ws_);
        for (size_t il = 0; il < model_.layers_.size(); ++il)
            if (qsa_[il]) model_.layers_[il].qsa->pool(ws_, *qsa_[il], to);  // the blocks the moved tokens complete
        be_.submit();
        n_past_ = to + n;
        armed_ = false;
        cp_.base = -1;
        set_ple_context(recent);
        if (mtp_) mtp_->forget(n_past_);  // the moved tokens' hidden states are unknown: the head restarts after
    } catch (...) {
        reset_locked();
        throw;
    }
}

void Qwen4ExpWindow::adopt_recurrent(const std::vector<StatePart>& saved, const std::vector<int32_t>& recent) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<const StatePart*> from;  // the saved whole parts in state_parts' order (PLE before GDN)
    for (size_t il = 0; il < model_.layers_.size(); ++il) {
        if (ple_[il]) from.push_back(&saved_part(saved, StateKind::Ple, uint32_t(il), StateDtype::Mixed));
        if (gdn_[il]) from.push_back(&saved_part(saved, StateKind::Gdn, uint32_t(il), StateDtype::F32));
    }
    try {
        HostStateParts host(be_, state_parts(n_past_, n_past_, true));  // no positions: the whole parts alone
        size_t i = 0;
        for (StatePart& p : host.parts()) {
            if (p.kind != StateKind::Ple && p.kind != StateKind::Gdn) continue;
            const StateSpan& s = from[i++]->spans[0];
            // PLE's first span is its n-gram context (set from `recent` below), the rest its conv history
            const size_t first = p.kind == StateKind::Ple ? 1 : 0;
            size_t at = p.kind == StateKind::Ple ? p.spans[0].bytes : 0, need = at;
            for (size_t k = first; k < p.spans.size(); ++k) need += p.spans[k].bytes;
            if (need != s.bytes) throw Error("window: a saved " + state_part_name(p.kind, p.layer) + " of another shape");
            for (size_t k = first; k < p.spans.size(); ++k)
                std::memcpy(p.spans[k].data, s.data + at, p.spans[k].bytes), at += p.spans[k].bytes;
        }
        host.upload();
        set_ple_context(recent);
        armed_ = false;
        cp_.base = -1;
    } catch (...) {
        reset_locked();
        throw;
    }
}

void Qwen4ExpWindow::truncate_attention(int64_t n, const std::vector<int32_t>& recent) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n < 0 || n > n_past_)
        throw Error("window: cannot truncate to " + std::to_string(n) + " of " + std::to_string(n_past_) + " tokens");
    for (size_t il = 0; il < model_.layers_.size(); ++il) {
        if (qsa_[il]) qsa_[il]->truncate(n);
        if (kv_[il]) kv_[il]->truncate(n);
    }
    if (mtp_) mtp_->truncate(n);
    n_past_ = n;
    armed_ = false;
    cp_.base = -1;
    set_ple_context(recent);
    be_.submit();
}

void Qwen4ExpWindow::eval(const int32_t* tokens, int64_t n, float* logits, bool all_logits) {
    eval_steps({WindowStep{this, tokens, n, logits, all_logits}});
}

void Qwen4ExpWindow::eval_multimodal(const int32_t* tokens, int64_t n, const MultimodalRows& mm, float* logits,
                                     bool all_logits) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n <= 0) return;
    std::vector<Part> parts{{this, {this, tokens, n, logits, all_logits}, mm.pos3 || mm.n_rows ? &mm : nullptr}};
    eval_parts(parts);
}

void Qwen4ExpWindow::eval_steps(const std::vector<WindowStep>& steps) {
    std::vector<Part> parts;
    std::vector<std::mutex*> mutexes;
    for (const WindowStep& s : steps) {
        auto* w = dynamic_cast<Qwen4ExpWindow*>(s.window);
        if (!w || &w->model_ != &model_) throw Error("eval_windows: the windows belong to different models");
        if (s.n > 0) parts.push_back({w, s, nullptr}), mutexes.push_back(&w->mutex_);
    }
    StepLocks locks(std::move(mutexes));
    if (!parts.empty()) eval_parts(parts);
}

void Qwen4ExpWindow::check(const int32_t* tokens, int64_t n, const MultimodalRows* mm) const {
    const Qwen4ExpConfig& c = model_.config_;
    for (int64_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= c.vocab)
            throw Error("token id " + std::to_string(tokens[i]) + " is out of range [0, " + std::to_string(c.vocab) +
                        ")");
    for (int64_t r = 0; mm && r < mm->n_rows; ++r)
        if (mm->rows[r] < 0 || mm->rows[r] >= n) throw Error("image row " + std::to_string(mm->rows[r]) + " is outside the call's " + std::to_string(n) + " tokens");
    if (n_past_ + n > max_ctx_)
        throw Error("context overflow: " + std::to_string(n_past_) + " + " + std::to_string(n) +
                    " tokens exceed the window's " + std::to_string(max_ctx_));
    if (armed_ && n > kMaxCheckpointTokens)
        throw Error("window: a checkpointed eval takes at most " + std::to_string(kMaxCheckpointTokens) +
                    " tokens, got " + std::to_string(n));
}

void Qwen4ExpWindow::eval_parts(std::vector<Part>& parts) {
    int64_t t0 = 0;
    for (Part& p : parts) {
        p.w->check(p.step.tokens, p.step.n, p.mm);
        p.t0 = t0;
        t0 += p.step.n;
    }
    try {
        forward(parts);
        // the draft heads' held hidden states, within MtpContext::kHeldRows (in the step's workspace)
        Workspace& ws = parts.front().w->ws_;
        for (Part& p : parts)
            if (p.w->mtp_) p.w->mtp_->bound(ws, *p.w->model_.mtp_);
        ws.reset();
    } catch (...) {
        // Layers before the failure have advanced their state: forget everything rather than continue
        // from a state that matches no token sequence.
        for (Part& p : parts) p.w->reset_locked();
        throw;
    }
}

// Runs the parts' tokens through the model in one pass, part i's rows after part i-1's.
void Qwen4ExpWindow::forward(std::vector<Part>& parts) {
    const Qwen4ExpModel& model = parts.front().w->model_;
    const Qwen4ExpConfig& c = model.config_;
    Backend& be = parts.front().w->be_;
    Workspace& ws = parts.front().w->ws_;
    struct Release {  // the step's scratch, also when it fails
        Workspace& ws;
        ~Release() { ws.reset(); }
    } release{ws};
    const int64_t h = c.hidden, width = c.hc * h;

    std::vector<int32_t> tokens;
    std::vector<int64_t> pos3;  // [n][3] M-RoPE (t, h, w): text tokens n_past + t
    int64_t longest = 0;
    for (const Part& p : parts) {
        tokens.insert(tokens.end(), p.step.tokens, p.step.tokens + p.step.n);
        if (p.mm && p.mm->pos3)
            pos3.insert(pos3.end(), p.mm->pos3, p.mm->pos3 + 3 * p.step.n);
        else
            for (int64_t t = 0; t < p.step.n; ++t) pos3.insert(pos3.end(), 3, p.w->n_past_ + t);
        longest = std::max(longest, p.step.n);
    }
    const int64_t n = int64_t(tokens.size());
    // streams: [n][hc][hidden], every stream starts as the token embedding
    const Tensor ids = ws.i32(n, 1);
    be.write(ids, tokens.data());
    const Tensor streams = ws.f32(n, width);
    be.get_rows(model.tok_embd_, ids, 1.0f, c.hc, streams);
    // image features replace the embedding of their rows, on every stream
    for (const Part& p : parts)
        for (int64_t r = 0; p.mm && r < p.mm->n_rows; ++r)
            for (int64_t s = 0; s < c.hc; ++s)
                be.write(streams.row_range(p.t0 + p.mm->rows[r], 1).col_range(s * h, h), p.mm->embd + r * h);

    std::vector<bool> keep;  // per part: fill the window's rollback slots (checkpoint())
    for (Part& p : parts) {
        keep.push_back(p.w->armed_);
        p.w->armed_ = false;
        p.w->cp_.base = -1;
        if (keep.back()) p.w->prepare_slots(p.step.n);
    }
    const Tensor mixed = ws.f32(n, h), out = ws.f32(n, h), inject = ws.f32(n, c.hc);
    ExpertArena* arena = model.arena_.get();
    // a device-routed arena learns the step's routing afterwards: every layer's ids [n_layer][n * k]
    const bool routed = arena && arena->device_routed();
    const int64_t k = c.moe.n_used;
    const Tensor routing = routed ? ws.i32(c.n_layer, n * k) : Tensor{};
    std::vector<PleSeq> ple;
    std::vector<GdnRows> gdn;
    std::vector<QsaRows> qsa;
    std::vector<AttentionRows> attn;
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const auto& l = model.layers_[size_t(il)];
        const size_t li = size_t(il);
        Workspace::Scope scope(ws);
        if (arena && !routed && model.lookahead_ && longest <= 8) {
            // Lookahead: this layer's router applied to the previous layer's output (its MoE input as it
            // would be without this layer's PLE and mixer), so the predicted experts load while those run.
            l.ffn_hc.read(ws, streams, mixed, inject);
            l.moe.prefetch(ws, mixed);
        }
        if (l.ple) {
            const Tensor addend = ws.f32(n, width);  // [n][hc * hidden]
            ple.clear();
            for (size_t i = 0; i < parts.size(); ++i) {
                const Part& p = parts[i];
                PleState& st = *p.w->ple_[li];
                if (!keep[i]) {
                    ple.push_back({p.step.tokens, &st, p.t0, p.step.n});
                    continue;
                }
                for (int64_t t = 0; t < p.step.n; ++t) {  // token by token, keeping the state after each
                    const int64_t r = p.t0 + t;
                    l.ple->forward(ws, p.step.tokens + t, streams.row_range(r, 1), st, addend.row_range(r, 1));
                    p.w->cp_.ple[li][size_t(t + 1)].assign(be, st);
                }
            }
            if (ple.size() == parts.size())
                l.ple->forward(ws, ple, streams, addend);
            else
                for (const PleSeq& q : ple)
                    l.ple->forward(ws, {PleSeq{q.token_ids, q.state, 0, q.ntok}}, streams.row_range(q.t0, q.ntok),
                                   addend.row_range(q.t0, q.ntok));
            be.add(streams, addend, streams);
        }
        l.attn_hc.read(ws, streams, mixed, inject);
        if (l.gdn) {
            gdn.clear();
            for (size_t i = 0; i < parts.size(); ++i) {
                const Part& p = parts[i];
                gdn.push_back({&*p.w->gdn_[li], 0, p.t0, p.step.n, keep[i] ? &*p.w->cp_.gdn[li] : nullptr});
            }
            l.gdn->forward(ws, mixed, gdn, out);
        } else if (l.attn) {
            attn.clear();
            for (const Part& p : parts)
                attn.push_back({&*p.w->kv_[li], &pos3[size_t(3 * p.t0)], p.t0, p.step.n});
            l.attn->forward(ws, mixed, attn, out);
        } else {
            qsa.clear();
            for (const Part& p : parts) qsa.push_back({&*p.w->qsa_[li], &pos3[size_t(3 * p.t0)], p.t0, p.step.n});
            l.qsa->forward(ws, mixed, qsa, out);
        }
        l.attn_hc.write(be, out, inject, streams);
        l.ffn_hc.read(ws, streams, mixed, inject);
        l.moe.forward(ws, mixed, out, routed ? routing.row_range(il, 1).reshaped(n, k) : Tensor{});
        l.ffn_hc.write(be, out, inject, streams);
    }
    // The LM head runs on the rows whose logits are wanted: every token, or the last (prefill for generation).
    // With an MTP head every row's final hidden state is kept for it.
    std::vector<WindowStep> steps;
    std::vector<int64_t> t0;
    for (const Part& p : parts) steps.push_back(p.step), t0.push_back(p.t0);
    const WantedRows wanted = wanted_rows(steps, t0);
    const int64_t rows = int64_t(wanted.rows.size());
    const bool mtp = parts.front().w->mtp_.has_value();
    Tensor final_h;  // [rows][hidden] of the wanted rows
    if (mtp) {
        const Tensor all_h = ws.f32(n, h);  // [n][hidden]
        model.out_hc_.read(ws, streams, all_h, Tensor{});
        for (const Part& p : parts) p.w->mtp_->append(p.step.tokens, all_h.row_range(p.t0, p.step.n));
        final_h = select_rows(ws, all_h, wanted);
    } else {
        final_h = ws.f32(rows, h);
        model.out_hc_.read(ws, select_rows(ws, streams, wanted), final_h, Tensor{});
    }
    wanted.run(c.vocab, [&](float* logits) { lm_head(ws, model.output_, final_h, logits, [](const Tensor&) {}); });
    for (size_t i = 0; i < parts.size(); ++i) {
        if (keep[i]) parts[i].w->cp_.base = parts[i].w->n_past_;
        parts[i].w->n_past_ += parts[i].step.n;
    }
    if (arena) arena->end_step(routing);
}

void Qwen4ExpWindow::prepare_slots(int64_t n) {
    const size_t n_layers = model_.layers_.size(), slots = size_t(n + 1);
    cp_.gdn.resize(n_layers);
    cp_.ple.resize(n_layers);
    for (size_t il = 0; il < n_layers; ++il) {
        if (gdn_[il]) {
            auto& g = cp_.gdn[il];
            if (!g) g.emplace(be_, model_.layers_[il].gdn->shape(), kMaxCheckpointTokens + 1);
            g->copy_row(be_, *gdn_[il], 0, 0);
        }
        if (ple_[il]) {
            auto& p = cp_.ple[il];
            if (p.size() < slots) p.resize(slots);
            p[0].assign(be_, *ple_[il]);
        }
    }
}

}  // namespace regolith
