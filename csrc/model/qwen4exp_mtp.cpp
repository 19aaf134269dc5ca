#include "model/qwen4exp_mtp.h"

#include <algorithm>
#include <string>

#include "core/errors.h"
#include "core/gguf_set.h"

namespace regolith {

namespace {

std::string nextn(int64_t layer, const char* name) {
    return "blk." + std::to_string(layer) + ".nextn." + name;
}

}  // namespace

bool MtpHead::present(const GgufSet& file, int64_t layer) {
    return file.find_tensor(nextn(layer, "eh_proj.weight")) != nullptr;
}

MtpHead::MtpHead(const ModelWeights& w, int64_t layer, int64_t hc, int64_t hc_rank, float eps, const MoeShape& moe,
                 const Tensor& tok_embd, const Tensor& output, ExpertArena* arena)
    : hidden_(moe.hidden),
      hc_(hc),
      eps_(eps),
      tok_embd_(tok_embd),
      output_(output),
      hyper_(hc > 1),
      moe_(with_context("MTP head: ", [&] { return SparseMoe::load(w, int(layer), moe, arena == nullptr); })) {
    if (arena) moe_.stream_from(arena, layer);
    with_context("MTP head: ", [&] {
        const int64_t h = hidden_;
        const std::string blk = "blk." + std::to_string(layer) + ".";
        eh_proj_ = w.matrix(nextn(layer, "eh_proj.weight"), h, 2 * h);
        enorm_ = w.f32_vector(nextn(layer, "enorm.weight"), h);
        hnorm_ = w.f32_vector(nextn(layer, "hnorm.weight"), h);
        head_norm_ = w.f32_vector(nextn(layer, "shared_head_norm.weight"), h);
        if (hyper_) {
            attn_hc_ = HyperConnection::load(w, blk + "hc_attn", h, hc, hc_rank, eps, true);
            ffn_hc_ = HyperConnection::load(w, blk + "hc_ffn", h, hc, hc_rank, eps, true);
            out_hc_ = HyperConnection::load(w, blk + "nextn.output_hc", h, hc, hc_rank, eps, false);
            qsa_.emplace(w, layer);
        } else {
            attn_hc_ = HyperConnection::pre_norm(w, blk + "attn_norm.weight", h, eps);
            ffn_hc_ = HyperConnection::pre_norm(w, blk + "post_attention_norm.weight", h, eps);
            out_hc_ = HyperConnection::pre_norm(w, nextn(layer, "shared_head_norm.weight"), h, eps);
            attn_.emplace(w, layer);
        }
        return 0;
    });
}

void MtpHead::check_cache_type(Backend& be, uint32_t cache_type) const {
    if (qsa_)
        QsaState::check_cache_type(be, qsa_->shape(), cache_type);
    else
        attn_->new_cache(be, 1, kv_type_of(cache_type));
}

MtpCache MtpHead::new_state(Backend& be, int64_t max_ctx, uint32_t cache_type) const {
    MtpCache c;
    if (qsa_)
        c.qsa.emplace(qsa_->new_state(be, max_ctx, cache_type));
    else
        c.kv.emplace(attn_->new_cache(be, max_ctx, kv_type_of(cache_type)));
    return c;
}

void MtpHead::forward(Workspace& ws, const Tensor& h, const int32_t* tokens, const int64_t* positions, MtpCache& st,
                      const Tensor& o) const {
    const int64_t ntok = h.rows, H = hidden_;
    for (int64_t t = 0; t < ntok; ++t)
        if (tokens[t] < 0 || tokens[t] >= tok_embd_.rows)
            throw Error("MTP head: token id " + std::to_string(tokens[t]) + " is out of range");
    Backend& be = ws.backend();
    Workspace::Scope scope(ws);
    const Tensor ids = ws.i32(ntok, 1);
    be.write(ids, tokens);
    const Tensor emb = ws.f32(ntok, H), cat = ws.f32(ntok, 2 * H), z = ws.f32(ntok, H);  // [ntok][H], [ntok][2H]
    be.get_rows(tok_embd_, ids, 1.0f, 1, emb);
    be.rms_norm(emb, enorm_, eps_, cat.col_range(0, H));
    be.rms_norm(h, hnorm_, eps_, cat.col_range(H, H));
    be.matmul(eh_proj_, cat, z);
    const Tensor streams = ws.f32(ntok, hc_ * H);  // [ntok][hc][H]: z in every stream
    for (int64_t s = 0; s < hc_; ++s) be.copy(z, streams.col_range(s * H, H));
    std::vector<int64_t> pos3(size_t(3 * ntok));  // [ntok][3]: text positions on every M-RoPE section
    for (int64_t t = 0; t < ntok; ++t) std::fill_n(&pos3[size_t(3 * t)], 3, positions[t]);
    const Tensor mixed = ws.f32(ntok, H), out = ws.f32(ntok, H), inject = ws.f32(ntok, hc_);
    attn_hc_.read(ws, streams, mixed, inject);
    if (qsa_)
        qsa_->forward(ws, mixed, pos3.data(), *st.qsa, out);
    else
        attn_->forward(ws, mixed, {AttentionRows{&*st.kv, pos3.data(), 0, ntok}}, out);
    attn_hc_.write(be, out, inject, streams);
    ffn_hc_.read(ws, streams, mixed, inject);
    moe_.forward(ws, mixed, out);
    ffn_hc_.write(be, out, inject, streams);
    out_hc_.read(ws, streams, o, Tensor{});
}

void MtpHead::logits(Workspace& ws, const Tensor& o, const Tensor& logits) const {
    if (!hyper_) {  // o is already normed
        ws.backend().matmul(output_, o, logits);
        return;
    }
    Workspace::Scope scope(ws);
    const Tensor normed = ws.f32(o.rows, hidden_);  // [ntok][H]
    ws.backend().rms_norm(o, head_norm_, eps_, normed);
    ws.backend().matmul(output_, normed, logits);
}

int32_t MtpHead::next_token(Workspace& ws, const Tensor& o) const {
    Backend& be = ws.backend();
    Workspace::Scope scope(ws);
    const Tensor lg = ws.f32(1, vocab()), id = ws.i32(1, 1);
    logits(ws, o, lg);
    be.top_k(lg, 1, id, Tensor{});
    int32_t next = 0;
    be.read(id, &next);
    return next;
}

// ---- window-side context ----------------------------------------------------------------------------------

MtpContext::MtpContext(Backend& b, const MtpHead& head, int64_t max_ctx_, uint32_t cache_type)
    : be(&b), width(head.hidden()), max_ctx(max_ctx_), kv(head.new_state(b, max_ctx_, cache_type)) {}

void MtpContext::append(const int32_t* ids, const Tensor& rows) {
    const int64_t held = size() - base, n = rows.rows;  // rows [0, held) hold tokens [base, size())
    if (!hidden.buffer || hidden.t.rows < held + n) resize(std::max(held + n, kBufferRows), 0, held);
    be->copy(rows, hidden.t.row_range(held, n));
    tokens.insert(tokens.end(), ids, ids + n);
}

void MtpContext::truncate(int64_t n) {
    if (n >= size()) return;
    tokens.resize(size_t(n));
    known_from = std::min(known_from, n);
    // pair i needs token i + 1: pairs below n - 1 stay
    kv.truncate(std::min(kv.size(), std::max<int64_t>(0, n - 1 - known_from)));
    // the next pair needs its token's hidden state: let go, the head restarts after the kept tokens
    if (known_from + kv.size() < base) forget(n);
}

void MtpContext::forget(int64_t n) {
    tokens.resize(size_t(n), 0);
    known_from = n;
    kv.truncate(0);
    base = n;  // rows below are unknown and never read; the held ones are dropped
}

void MtpContext::bound(Workspace& ws, const MtpHead& head) {
    if (lag() > kHeldRows) {
        if (kv.size() == 0)
            known_from = size() - 1 - kHeldRows;  // nothing taken in yet: the first draft gets the latest pairs
        else
            catch_up(ws, head);  // a head in use takes them in now rather than at its next draft
    }
    // needed: the pairs not taken in (from known_from + kv.size()) and, for a truncation, kHeldRows back
    const int64_t keep = std::max(known_from, std::min(known_from + kv.size(), size() - kHeldRows));
    const int64_t drop = keep - base, held = size() - keep;
    if (drop < kCompactRows) return;
    if (hidden.t.rows > kBufferRows && held <= kBufferRows) {
        resize(kBufferRows, drop, held);  // back from a long evaluation's size
    } else {
        // the kept rows to the start, in pieces no longer than the shift (no piece overlaps its target)
        for (int64_t r = 0; r < held; r += drop) {
            const int64_t rows = std::min(drop, held - r);
            be->copy(hidden.t.row_range(drop + r, rows), hidden.t.row_range(r, rows));
        }
    }
    base = keep;
}

void MtpContext::resize(int64_t rows, int64_t from, int64_t n) {
    OwnedTensor to(*be, RG_TYPE_F32, std::min(max_ctx, rows), width);
    if (n > 0) be->copy(hidden.t.row_range(from, n), to.t.row_range(0, n));
    hidden = std::move(to);
}

int64_t MtpContext::catch_up(Workspace& ws, const MtpHead& head) {
    const int64_t first = known_from + kv.size(), count = size() - 1 - first;  // pairs whose tokens are all held
    if (count <= 0 || kv.size() + count > kv.max_ctx()) return 0;
    for (int64_t c0 = 0; c0 < count; c0 += kCatchUpRows) {
        const int64_t rows = std::min(kCatchUpRows, count - c0), from = first + c0;
        Workspace::Scope scope(ws);
        std::vector<int64_t> pos(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) pos[size_t(i)] = from + i + 1;
        const Tensor o = ws.f32(rows, head.hidden());  // [rows][H], not read: the head's KV is what stays
        head.forward(ws, hidden.t.row_range(from - base, rows), tokens.data() + from + 1, pos.data(), kv, o);
    }
    return count;
}

std::vector<int32_t> MtpContext::draft(Workspace& ws, const MtpHead& head, int32_t next, int64_t n) {
    std::vector<int32_t> out;
    const int64_t n_past = size(), H = head.hidden();
    if (n <= 0 || n_past == 0 || known_from >= n_past) return out;
    if (n_past - known_from + n > kv.max_ctx()) return out;  // the pairs up to the last draft's
    catch_up(ws, head);
    // (hidden[n_past-1], next), then each drafted token with the head's own output
    Workspace::Scope scope(ws);
    Tensor last = ws.f32(1, H);  // [1][H]
    const int64_t p0 = n_past;
    head.forward(ws, hidden.t.row_range(n_past - 1 - base, 1), &next, &p0, kv, last);
    for (int64_t k = 0; k < n; ++k) {
        if (k > 0) {
            const int64_t p = n_past + k;
            const Tensor step = ws.f32(1, H);
            head.forward(ws, last, &out.back(), &p, kv, step);
            last = step;
        }
        out.push_back(head.next_token(ws, last));
    }
    kv.truncate(n_past - 1 - known_from);  // keep the pairs the held tokens determine
    return out;
}

}  // namespace regolith
