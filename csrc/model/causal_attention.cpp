#include "model/causal_attention.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/errors.h"
#include "core/types.h"
#include "model/state_move.h"

namespace regolith {

namespace {

constexpr int64_t kKeyAlign = 16;  // the capacity is a multiple of the attention's key alignment

int64_t align_up(int64_t n) { return (n + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }

}  // namespace

KvCache::KvCache(Backend& be, int64_t n_head_kv, int64_t head_dim, int64_t max_ctx, KvType type)
    : be_(&be), n_head_kv_(n_head_kv), head_dim_(head_dim), max_ctx_(max_ctx), type_(type) {
    if (n_head_kv <= 0 || head_dim <= 0) throw Error("KV cache: head count and head dim must be positive");
    if (max_ctx <= 0) throw Error("KV cache: max_ctx must be positive, got " + std::to_string(max_ctx));
    if (type == KvType::Q8_0 && head_dim % QK8_0 != 0)
        throw Error("KV cache: a q8_0 cache needs a head dim that is a multiple of 32, not " +
                    std::to_string(head_dim));
    const uint32_t t = kv_tensor_type(type);
    if ((type == KvType::Q8_0 || type == KvType::I8) && !be.supports_cache(t))
        throw Error(std::string("KV cache: the ") + be.name() + " backend has no kernels for " +
                    cache_type_name(t) + " attention caches");
}

uint32_t kv_tensor_type(KvType type) {
    switch (type) {
        case KvType::F16:
            return RG_TYPE_F16;
        case KvType::Q8_0:
            return RG_TYPE_Q8_0;
        case KvType::I8:
            return RG_TYPE_I8;
        case KvType::F32:
            break;
    }
    return RG_TYPE_F32;
}

KvType kv_type_of(uint32_t tensor_type) {
    for (KvType t : {KvType::F32, KvType::F16, KvType::Q8_0, KvType::I8})
        if (kv_tensor_type(t) == tensor_type) return t;
    throw Error("type id " + std::to_string(tensor_type) + " is not an attention cache type");
}

uint64_t KvCache::bytes() const {
    uint64_t n = 0;
    for (const OwnedTensor* t : {&k_, &vt_, &v_, &k_scale_, &v_scale_})
        if (t->t) n += t->buffer.bytes();
    return n;
}

void KvCache::truncate(int64_t n) {
    if (n < 0 || n > n_)
        throw Error("KV cache: cannot truncate to " + std::to_string(n) + " tokens, it holds " + std::to_string(n_));
    // Zero the dropped positions: aligned key ranges multiply them by probability 0, which must give 0.
    if (n < n_) {
        for (int64_t h = 0; h < n_head_kv_; ++h)
            for (const OwnedTensor* t : {&k_, &v_, &k_scale_, &v_scale_})
                if (t->t) be_->zero(t->t.row_range(h * cap_ + n, n_ - n));
        if (vt_.t) be_->zero(vt_.t.col_range(n, n_ - n));
        be_->submit();
    }
    n_ = n;
}

void KvCache::reserve(int64_t n) {
    if (n <= cap_) return;
    const int64_t cap = align_up(std::min(max_ctx_, std::max({n, 2 * cap_, int64_t(64)})));
    const int64_t KV = n_head_kv_, D = head_dim_;
    const uint32_t type = kv_tensor_type(type_);
    const bool rows = type_ == KvType::Q8_0 || type_ == KvType::I8;
    OwnedTensor k(*be_, type, KV * cap, D), vt, v, ks, vs;
    if (rows)
        v = OwnedTensor(*be_, type, KV * cap, D);
    else
        vt = OwnedTensor(*be_, type, KV * D, cap);
    if (type_ == KvType::I8)
        ks = OwnedTensor(*be_, RG_TYPE_F32, KV * cap, 1), vs = OwnedTensor(*be_, RG_TYPE_F32, KV * cap, 1);
    // per head, positions [0, n_) of the old storage into the new one; the rest zeroed
    const std::pair<const OwnedTensor*, const OwnedTensor*> by_head[] = {
        {&k_, &k}, {&v_, &v}, {&k_scale_, &ks}, {&v_scale_, &vs}};
    for (const auto& [from, to] : by_head) {
        if (!to->t) continue;
        be_->zero(to->t);
        for (int64_t h = 0; h < KV && n_ > 0; ++h)
            be_->copy(from->t.row_range(h * cap_, n_), to->t.row_range(h * cap, n_));
    }
    if (vt.t) {
        be_->zero(vt.t);
        if (n_ > 0) be_->copy(vt_.t.col_range(0, n_), vt.t.col_range(0, n_));
    }
    k_ = std::move(k), vt_ = std::move(vt), v_ = std::move(v), k_scale_ = std::move(ks),
    v_scale_ = std::move(vs);
    cap_ = cap;
}

KvSeq KvCache::append_seq(int64_t t0, int64_t ntok) {
    if (ntok < 0 || n_ + ntok > max_ctx_)
        throw Error("KV cache: " + std::to_string(n_) + " + " + std::to_string(ntok) + " tokens exceed its " +
                    std::to_string(max_ctx_));
    reserve(n_ + ntok);
    return {k_.t, vt_.t, n_, t0, ntok, v_.t, k_scale_.t, v_scale_.t};
}

void KvCache::state_tensors(int64_t from, int64_t to, std::vector<Tensor>& out) const {
    if (from < 0 || from > to || to > n_)
        throw Error("KV cache: positions [" + std::to_string(from) + ", " + std::to_string(to) + ") of " +
                    std::to_string(n_));
    if (to == from) return;
    for (int64_t h = 0; h < n_head_kv_; ++h) out.push_back(k_.t.row_range(h * cap_ + from, to - from));
    if (vt_.t) out.push_back(vt_.t.col_range(from, to - from));
    for (const OwnedTensor* t : {&v_, &k_scale_, &v_scale_})
        for (int64_t h = 0; h < n_head_kv_ && t->t; ++h)
            out.push_back(t->t.row_range(h * cap_ + from, to - from));
}

void KvCache::grow(int64_t n) {
    if (n < n_ || n > max_ctx_)
        throw Error("KV cache: cannot grow from " + std::to_string(n_) + " to " + std::to_string(n) +
                    " positions (max " + std::to_string(max_ctx_) + ")");
    reserve(n);
    n_ = n;
}

void KvCache::move_state(const uint8_t* saved, size_t saved_bytes, int64_t total, const std::vector<float>& freq,
                         int64_t src, int64_t to, int64_t n, const std::vector<StateSpan>& dst) const {
    const int64_t KV = n_head_kv_, D = head_dim_;
    if (src < 0 || n < 0 || src + n > total || 2 * int64_t(freq.size()) > D)
        throw Error("KV cache: cannot move positions [" + std::to_string(src) + ", " + std::to_string(src + n) +
                    ") of a saved state of " + std::to_string(total));
    if (n == 0) return;
    const uint32_t type = kv_tensor_type(type_);
    const bool rows = type_ == KvType::Q8_0 || type_ == KvType::I8, i8 = type_ == KvType::I8;
    const int64_t row_bytes = i8 ? D : type_row_bytes(*type_traits(type), D);
    // state_tensors' items over `len` positions: keys per head, then values (transposed, or rows per head),
    // then I8's key and value scales per head
    const auto items = [&](int64_t len) {
        std::vector<size_t> s(size_t(KV), size_t(len * row_bytes));
        if (!rows) {
            s.push_back(size_t(KV * D * len * element_bytes(type)));
            return s;
        }
        for (int64_t h = 0; h < KV; ++h) s.push_back(size_t(len * row_bytes));
        if (i8)
            for (int64_t h = 0; h < 2 * KV; ++h) s.push_back(size_t(len) * sizeof(float));
        return s;
    };
    MovedItems m(saved, saved_bytes, items(total), items(n), dst, "KV cache");
    const RopeShift turn(freq, to - src);
    std::vector<float> buf(static_cast<size_t>(D));
    const size_t ks = size_t(2 * KV);  // I8: the key scales' first item
    for (int64_t h = 0; h < KV; ++h)
        for (int64_t t = 0; t < n; ++t)
            move_key_row(type, m.in(size_t(h)) + (src + t) * row_bytes,
                         i8 ? reinterpret_cast<const float*>(m.in(ks + size_t(h))) + src + t : nullptr,
                         m.out(size_t(h)) + t * row_bytes,
                         i8 ? reinterpret_cast<float*>(m.out(ks + size_t(h))) + t : nullptr, D, turn, buf.data());
    if (!rows) {  // values transposed: row r's positions [src, src + n)
        const int64_t elt = element_bytes(type);
        for (int64_t r = 0; r < KV * D; ++r)
            std::memcpy(m.out(size_t(KV)) + r * n * elt, m.in(size_t(KV)) + (r * total + src) * elt, size_t(n * elt));
    } else {
        for (int64_t h = 0; h < KV; ++h) {
            std::memcpy(m.out(size_t(KV + h)), m.in(size_t(KV + h)) + src * row_bytes, size_t(n * row_bytes));
            if (i8)  // the value scales
                std::memcpy(m.out(size_t(3 * KV + h)), m.in(size_t(3 * KV + h)) + src * sizeof(float),
                            size_t(n) * sizeof(float));
        }
    }
    m.scatter();
}

}  // namespace regolith
