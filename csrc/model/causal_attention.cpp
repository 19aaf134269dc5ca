#include "model/causal_attention.h"

#include <algorithm>
#include <string>

#include "core/errors.h"

namespace regolith {

namespace {

constexpr int64_t kKeyAlign = 16;  // the capacity is a multiple of the attention's key alignment

int64_t align_up(int64_t n) { return (n + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }

}  // namespace

KvCache::KvCache(Backend& be, int64_t n_head_kv, int64_t head_dim, int64_t max_ctx, KvType type)
    : be_(&be), n_head_kv_(n_head_kv), head_dim_(head_dim), max_ctx_(max_ctx), type_(type) {
    if (n_head_kv <= 0 || head_dim <= 0) throw Error("KV cache: head count and head dim must be positive");
    if (max_ctx <= 0) throw Error("KV cache: max_ctx must be positive, got " + std::to_string(max_ctx));
}

void KvCache::truncate(int64_t n) {
    if (n < 0 || n > n_)
        throw Error("KV cache: cannot truncate to " + std::to_string(n) + " tokens, it holds " + std::to_string(n_));
    // Zero the dropped positions: aligned key ranges multiply them by probability 0, which must give 0.
    if (n < n_) {
        for (int64_t h = 0; h < n_head_kv_; ++h) be_->zero(k_.t.row_range(h * cap_ + n, n_ - n));
        be_->zero(vt_.t.col_range(n, n_ - n));
        be_->submit();
    }
    n_ = n;
}

void KvCache::reserve(int64_t n) {
    if (n <= cap_) return;
    const int64_t cap = align_up(std::min(max_ctx_, std::max({n, 2 * cap_, int64_t(64)})));
    const int64_t KV = n_head_kv_, D = head_dim_;
    const uint32_t type = type_ == KvType::F16 ? RG_TYPE_F16 : RG_TYPE_F32;
    OwnedTensor k(*be_, type, KV * cap, D), vt(*be_, type, KV * D, cap);
    be_->zero(k.t);
    be_->zero(vt.t);
    for (int64_t h = 0; h < KV && n_ > 0; ++h)
        be_->copy(k_.t.row_range(h * cap_, n_), k.t.row_range(h * cap, n_));
    if (n_ > 0) be_->copy(vt_.t.col_range(0, n_), vt.t.col_range(0, n_));
    k_ = std::move(k);
    vt_ = std::move(vt);
    cap_ = cap;
}

KvSeq KvCache::append_seq(int64_t t0, int64_t ntok) {
    if (ntok < 0 || n_ + ntok > max_ctx_)
        throw Error("KV cache: " + std::to_string(n_) + " + " + std::to_string(ntok) + " tokens exceed its " +
                    std::to_string(max_ctx_));
    reserve(n_ + ntok);
    return {k_.t, vt_.t, n_, t0, ntok};
}

void KvCache::state_tensors(int64_t from, int64_t to, std::vector<Tensor>& out) const {
    if (from < 0 || from > to || to > n_)
        throw Error("KV cache: positions [" + std::to_string(from) + ", " + std::to_string(to) + ") of " +
                    std::to_string(n_));
    if (to == from) return;
    for (int64_t h = 0; h < n_head_kv_; ++h) out.push_back(k_.t.row_range(h * cap_ + from, to - from));
    out.push_back(vt_.t.col_range(from, to - from));
}

void KvCache::grow(int64_t n) {
    if (n < n_ || n > max_ctx_)
        throw Error("KV cache: cannot grow from " + std::to_string(n_) + " to " + std::to_string(n) +
                    " positions (max " + std::to_string(max_ctx_) + ")");
    reserve(n);
    n_ = n;
}

}  // namespace regolith
