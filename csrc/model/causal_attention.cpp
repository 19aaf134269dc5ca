#include "model/causal_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/errors.h"
#include "core/half.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace regolith {

namespace {

// Queries per block of one attention pass: bounds the score matrix ([block * group][keys]) and the keys
// computed past a query's own position (at most block - 1).
constexpr int64_t kQueryBlock = 32;
// Softmax work (rows x keys) below which the pool's hand-off costs more than it saves.
constexpr int64_t kParallelSoftmax = 1 << 14;
// Key ranges start and end at multiples of this many positions (the cache capacity is one too), so the
// backend's float dot products (periodic in at most 16 lanes, see Backend::matmul) sum a query's terms in
// the same lanes and order however the keys were split into calls: one-shot, chunked and token-by-token
// evaluation give bit-identical results. Keys outside a query's range get probability 0.
constexpr int64_t kKeyAlign = 16;

int64_t align_up(int64_t n) { return (n + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }

// fp16_to_fp32(fp32_to_fp16(x)) with few branches (equal for every float, checked exhaustively): overflow
// to inf, f16 subnormals rounded to a multiple of 2^-24 by adding and removing 0.75 (whose float ulp that
// is), normal values by rounding away the 13 low mantissa bits to nearest even.
float round_f16(float x) {
    uint32_t u = f32_bits(x);
    const uint32_t ax = u & 0x7fffffffu;
    if (ax >= 0x477ff000u) return ax > 0x7f800000u ? x : std::copysign(INFINITY, x);  // NaN stays NaN
    if (ax < 0x38800000u) return std::copysign((std::fabs(x) + 0.75f) - 0.75f, x);
    u = (u + 0x0fffu + ((u >> 13) & 1u)) & 0xffffe000u;
    return f32_from_bits(u);
}

}  // namespace

KvCache::KvCache(int64_t n_head_kv, int64_t head_dim, int64_t max_ctx, KvType type)
    : n_head_kv_(n_head_kv), head_dim_(head_dim), max_ctx_(max_ctx), type_(type),
      elt_(type == KvType::F16 ? 2 : 4) {
    if (n_head_kv <= 0 || head_dim <= 0) throw Error("KV cache: head count and head dim must be positive");
    if (max_ctx <= 0) throw Error("KV cache: max_ctx must be positive, got " + std::to_string(max_ctx));
}

void KvCache::truncate(int64_t n) {
    if (n < 0 || n > n_)
        throw Error("KV cache: cannot truncate to " + std::to_string(n) + " tokens, it holds " + std::to_string(n_));
    // Zero the dropped positions: aligned key ranges multiply them by probability 0, which must give 0.
    const int64_t D = head_dim_;
    for (int64_t h = 0; h < n_head_kv_ && n < n_; ++h) {
        std::memset(&k_[size_t((h * cap_ + n) * D * elt_)], 0, size_t((n_ - n) * D * elt_));
        for (int64_t d = 0; d < D; ++d)
            std::memset(&vt_[size_t(((h * D + d) * cap_ + n) * elt_)], 0, size_t((n_ - n) * elt_));
    }
    n_ = n;
}

void KvCache::reserve(int64_t n) {
    if (n <= cap_) return;
    const int64_t cap = align_up(std::min(max_ctx_, std::max({n, 2 * cap_, int64_t(64)})));
    const int64_t D = head_dim_;
    std::vector<uint8_t> k(size_t(n_head_kv_ * cap * D * elt_)), vt(k.size());
    for (int64_t h = 0; h < n_head_kv_ && n_ > 0; ++h) {
        std::memcpy(&k[size_t(h * cap * D * elt_)], &k_[size_t(h * cap_ * D * elt_)], size_t(n_ * D * elt_));
        for (int64_t d = 0; d < D; ++d)
            std::memcpy(&vt[size_t((h * D + d) * cap * elt_)], &vt_[size_t((h * D + d) * cap_ * elt_)],
                        size_t(n_ * elt_));
    }
    k_.swap(k);
    vt_.swap(vt);
    cap_ = cap;
}

void KvCache::append(const float* k, const float* v, int64_t ntok) {
    if (ntok < 0 || n_ + ntok > max_ctx_)
        throw Error("KV cache: " + std::to_string(n_) + " + " + std::to_string(ntok) + " tokens exceed its " +
                    std::to_string(max_ctx_));
    reserve(n_ + ntok);
    const int64_t KV = n_head_kv_, D = head_dim_;
    for (int64_t t = 0; t < ntok; ++t) {
        const int64_t i = n_ + t;
        for (int64_t h = 0; h < KV; ++h) {
            const float* kr = k + (t * KV + h) * D;
            const float* vr = v + (t * KV + h) * D;
            const int64_t krow = (h * cap_ + i) * D;  // element index of K[h][i][0]
            const int64_t vcol = h * D * cap_ + i;    // element index of Vt[h][0][i]
            if (type_ == KvType::F16) {
                auto* kd = reinterpret_cast<uint16_t*>(k_.data());
                auto* vd = reinterpret_cast<uint16_t*>(vt_.data());
                for (int64_t d = 0; d < D; ++d) kd[krow + d] = fp32_to_fp16(kr[d]);
                for (int64_t d = 0; d < D; ++d) vd[vcol + d * cap_] = fp32_to_fp16(vr[d]);
            } else {
                auto* kd = reinterpret_cast<float*>(k_.data());
                auto* vd = reinterpret_cast<float*>(vt_.data());
                std::memcpy(kd + krow, kr, size_t(D) * sizeof(float));
                for (int64_t d = 0; d < D; ++d) vd[vcol + d * cap_] = vr[d];
            }
        }
    }
    n_ += ntok;
}

void KvCache::state_spans(int64_t from, int64_t to, std::vector<StateSpan>& out) {
    if (from < 0 || from > to || to > n_)
        throw Error("KV cache: positions [" + std::to_string(from) + ", " + std::to_string(to) + ") of " +
                    std::to_string(n_));
    const int64_t D = head_dim_, rows = to - from;
    if (rows == 0) return;
    for (int64_t h = 0; h < n_head_kv_; ++h)
        out.push_back({&k_[size_t((h * cap_ + from) * D * elt_)], size_t(rows * D * elt_)});
    for (int64_t h = 0; h < n_head_kv_; ++h)
        for (int64_t d = 0; d < D; ++d)
            out.push_back({&vt_[size_t(((h * D + d) * cap_ + from) * elt_)], size_t(rows * elt_)});
}

void KvCache::grow(int64_t n) {
    if (n < n_ || n > max_ctx_)
        throw Error("KV cache: cannot grow from " + std::to_string(n_) + " to " + std::to_string(n) +
                    " positions (max " + std::to_string(max_ctx_) + ")");
    reserve(n);
    n_ = n;
}

WeightView KvCache::keys(int64_t head, int64_t lo, int64_t hi) const {
    const uint32_t type = type_ == KvType::F16 ? RG_TYPE_F16 : RG_TYPE_F32;
    return {type, k_.data() + (head * cap_ + lo) * head_dim_ * elt_, hi - lo, head_dim_, head_dim_ * elt_};
}

WeightView KvCache::values_t(int64_t head, int64_t lo, int64_t hi) const {
    const uint32_t type = type_ == KvType::F16 ? RG_TYPE_F16 : RG_TYPE_F32;
    return {type, vt_.data() + (head * head_dim_ * cap_ + lo) * elt_, head_dim_, hi - lo, cap_ * elt_};
}

void causal_attention(Backend& backend, const AttentionShape& s, const KvCache& cache, const float* q,
                      int64_t ntok, float* y) {
    const int64_t H = s.n_head, KV = s.n_head_kv, D = s.head_dim, group = H / KV;
    const int64_t n0 = cache.size() - ntok;
    const bool f16 = cache.type() == KvType::F16;
    const int64_t max_rows = std::min(ntok, kQueryBlock) * group;
    std::vector<float> qg(size_t(max_rows * D));   // [rows][D] one kv head's queries, token-major
    std::vector<float> out(size_t(max_rows * D));  // [rows][D]
    std::vector<float> p;                          // [rows][keys] scores, then probabilities

    for (int64_t t0 = 0; t0 < ntok; t0 += kQueryBlock) {
        const int64_t t1 = std::min(ntok, t0 + kQueryBlock), rows = (t1 - t0) * group;
        // keys any query of the block may see, from the first query's window start to the last query,
        // widened to aligned positions
        const int64_t first = s.window > 0 ? std::max<int64_t>(0, n0 + t0 - s.window + 1) : 0;
        const int64_t lo = first / kKeyAlign * kKeyAlign, hi = align_up(n0 + t1);
        const int64_t nk = hi - lo;
        p.resize(size_t(rows * nk));
        for (int64_t g = 0; g < KV; ++g) {
            for (int64_t t = t0; t < t1; ++t) {
                const float* src = q + (t * H + g * group) * D;
                float* dst = &qg[size_t((t - t0) * group * D)];
                for (int64_t i = 0; i < group * D; ++i) dst[i] = f16 ? round_f16(src[i]) : src[i];
            }
            backend.matmul(cache.keys(g, lo, hi), qg.data(), rows, p.data());

            const auto softmax_rows = [&](int64_t r0, int64_t r1) {
                for (int64_t r = r0; r < r1; ++r) {
                    const int64_t pos = n0 + t0 + r / group;
                    // visible keys [a, b] relative to lo; everything else gets probability 0
                    const int64_t a = (s.window > 0 ? std::max(lo, pos - s.window + 1) : lo) - lo, b = pos - lo;
                    float* row = &p[size_t(r * nk)];
                    float mx = -INFINITY;
                    for (int64_t j = a; j <= b; ++j) {
                        row[j] *= s.scale;
                        mx = row[j] > mx ? row[j] : mx;
                    }
                    double sum = 0.0;
                    for (int64_t j = a; j <= b; ++j) {
                        row[j] = std::exp(row[j] - mx);
                        sum += row[j];
                    }
                    const float inv = float(1.0 / sum);
                    std::fill(row, row + a, 0.0f);
                    if (f16)
                        for (int64_t j = a; j <= b; ++j) row[j] = round_f16(row[j] * inv);
                    else
                        for (int64_t j = a; j <= b; ++j) row[j] *= inv;
                    std::fill(row + b + 1, row + nk, 0.0f);
                }
            };
            if (rows * nk >= kParallelSoftmax)
                default_pool()->parallel_for(rows, 1, softmax_rows);
            else
                softmax_rows(0, rows);

            backend.matmul(cache.values_t(g, lo, hi), p.data(), rows, out.data());
            for (int64_t t = t0; t < t1; ++t)
                std::memcpy(y + (t * H + g * group) * D, &out[size_t((t - t0) * group * D)],
                            size_t(group * D) * sizeof(float));
        }
    }
}

}  // namespace regolith
