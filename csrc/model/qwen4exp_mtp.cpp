#include "model/qwen4exp_mtp.h"

#include <algorithm>
#include <string>

#include "core/dequant.h"
#include "core/errors.h"
#include "core/gguf.h"
#include "model/nn.h"

namespace regolith {

namespace {

std::string nextn(int64_t layer, const char* name) {
    return "blk." + std::to_string(layer) + ".nextn." + name;
}

}  // namespace

bool MtpHead::present(const GgufFile& file, int64_t layer) {
    return file.find_tensor(nextn(layer, "eh_proj.weight")) != nullptr;
}

MtpHead::MtpHead(const GgufFile& file, int64_t layer, int64_t hc, int64_t hc_rank, float eps, const MoeShape& moe,
                 const WeightView& tok_embd, const WeightView& output, ExpertArena* arena, Backend& backend)
    : backend_(backend),
      hidden_(moe.hidden),
      hc_(hc),
      eps_(eps),
      tok_embd_(tok_embd),
      output_(output),
      qsa_(with_context("qwen4exp MTP head: ",
                        [&] {
                            const QsaShape s = qsa_shape_from_gguf(file, layer);
                            return QsaAttention(s, qsa_weights_from_gguf(file, layer, s), backend);
                        })),
      moe_(with_context("qwen4exp MTP head: ",
                        [&] { return SparseMoe::load(ModelWeights(file), int(layer), moe, arena == nullptr); })) {
    if (arena) moe_.stream_from(arena, layer);
    with_context("qwen4exp MTP head: ", [&] {
        const ModelWeights w(file);
        const int64_t h = hidden_;
        const std::string blk = "blk." + std::to_string(layer) + ".";
        eh_proj_ = w.matrix(nextn(layer, "eh_proj.weight"), h, 2 * h);
        enorm_ = w.f32_vector(nextn(layer, "enorm.weight"), h);
        hnorm_ = w.f32_vector(nextn(layer, "hnorm.weight"), h);
        head_norm_ = w.f32_vector(nextn(layer, "shared_head_norm.weight"), h);
        attn_hc_ = HyperConnection::load(w, blk + "hc_attn", h, hc, hc_rank, eps, true);
        ffn_hc_ = HyperConnection::load(w, blk + "hc_ffn", h, hc, hc_rank, eps, true);
        out_hc_ = HyperConnection::load(w, blk + "nextn.output_hc", h, hc, hc_rank, eps, false);
        return 0;
    });
}

void MtpHead::forward(const float* h, const int32_t* tokens, const int64_t* positions, int64_t ntok, QsaState& st,
                      float* o) const {
    const int64_t H = hidden_, width = hc_ * H;
    std::vector<float> cat(size_t(ntok * 2 * H)), emb(static_cast<size_t>(H)), z(size_t(ntok * H));  // [ntok][2H], [H], [ntok][H]
    for (int64_t t = 0; t < ntok; ++t) {
        if (tokens[t] < 0 || tokens[t] >= tok_embd_.rows)
            throw Error("MTP head: token id " + std::to_string(tokens[t]) + " is out of range");
        dequantize_row(tok_embd_.type, static_cast<const uint8_t*>(tok_embd_.data) + tokens[t] * tok_embd_.row_bytes,
                       emb.data(), H);
        nn::rms_norm(emb.data(), H, enorm_, eps_, &cat[size_t(t * 2 * H)]);
        nn::rms_norm(h + t * H, H, hnorm_, eps_, &cat[size_t(t * 2 * H + H)]);
    }
    backend_.matmul(eh_proj_, cat.data(), ntok, z.data());
    std::vector<float> streams(size_t(ntok * width));  // [ntok][hc][H]: z in every stream
    for (int64_t t = 0; t < ntok; ++t)
        for (int64_t s = 0; s < hc_; ++s) std::copy_n(&z[size_t(t * H)], H, &streams[size_t(t * width + s * H)]);
    std::vector<float> mixed(size_t(ntok * H)), out(size_t(ntok * H)), inject(size_t(ntok * hc_));
    attn_hc_.read(backend_, streams.data(), ntok, mixed.data(), inject.data());
    qsa_.forward(mixed.data(), positions, ntok, st, out.data());
    attn_hc_.write(out.data(), inject.data(), ntok, streams.data());
    ffn_hc_.read(backend_, streams.data(), ntok, mixed.data(), inject.data());
    moe_.forward(backend_, mixed.data(), ntok, out.data());
    ffn_hc_.write(out.data(), inject.data(), ntok, streams.data());
    out_hc_.read(backend_, streams.data(), ntok, o, nullptr);
}

void MtpHead::logits(const float* o, int64_t ntok, float* logits) const {
    std::vector<float> normed(size_t(ntok * hidden_));  // [ntok][H]
    for (int64_t t = 0; t < ntok; ++t) nn::rms_norm(o + t * hidden_, hidden_, head_norm_, eps_, &normed[size_t(t * hidden_)]);
    backend_.matmul(output_, normed.data(), ntok, logits);
}

// ---- window-side context ----------------------------------------------------------------------------------

MtpContext::MtpContext(const MtpHead& head, int64_t max_ctx) : width(head.hidden()), kv(head.new_state(max_ctx)) {}

void MtpContext::append(const int32_t* ids, const float* rows, int64_t n) {
    tokens.insert(tokens.end(), ids, ids + n);
    hidden.insert(hidden.end(), rows, rows + n * width);
}

void MtpContext::truncate(int64_t n) {
    if (n >= size()) return;
    tokens.resize(size_t(n));
    hidden.resize(size_t(n * width));
    known_from = std::min(known_from, n);
    // pair i needs token i + 1: pairs below n - 1 stay
    kv.truncate(std::min(kv.size(), std::max<int64_t>(0, n - 1 - known_from)));
}

void MtpContext::forget(int64_t n) {
    tokens.resize(size_t(n), 0);
    hidden.resize(size_t(n * width), 0.0f);
    known_from = n;
    kv.truncate(0);
}

std::vector<int32_t> MtpContext::draft(const MtpHead& head, int32_t next, int64_t n) {
    std::vector<int32_t> out;
    const int64_t n_past = size(), H = head.hidden();
    if (n <= 0 || n_past == 0 || known_from >= n_past) return out;
    // Catch up: the pairs not yet consumed, then (hidden[n_past-1], next).
    const int64_t first = known_from + kv.size(), count = n_past - first;
    if (kv.size() + count + n > kv.max_ctx()) return out;
    std::vector<float> h(hidden.begin() + first * H, hidden.begin() + n_past * H);  // [count][H]
    std::vector<int32_t> ids(tokens.begin() + first + 1, tokens.end());
    ids.push_back(next);
    std::vector<int64_t> pos(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) pos[size_t(i)] = first + i + 1;
    std::vector<float> o(size_t(count * H));
    head.forward(h.data(), ids.data(), pos.data(), count, kv, o.data());
    std::vector<float> last(o.end() - H, o.end());  // [H]
    std::vector<float> logits;
    for (int64_t k = 0; k < n; ++k) {
        if (k > 0) {
            const int64_t p = n_past + k;
            std::vector<float> step(static_cast<size_t>(H));
            head.forward(last.data(), &out.back(), &p, 1, kv, step.data());
            last.swap(step);
        }
        logits.resize(size_t(head.vocab()));
        head.logits(last.data(), 1, logits.data());
        out.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    kv.truncate(n_past - 1 - known_from);  // keep the pairs the held tokens determine
    return out;
}

}  // namespace regolith
