#include "core/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/exp_nonpos.h"

namespace regolith {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kBlock = 256;  // elements per partial sum on the dense path

// max(x[0..n)), n >= 1, in 8 interleaved lanes so it vectorises.
float max_of(const float* x, int64_t n) {
    float lane[8];
    std::fill(lane, lane + 8, -kInf);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    for (; i < n; ++i) lane[0] = x[i] > lane[0] ? x[i] : lane[0];
    return *std::max_element(lane, lane + 8);
}

// f(i) for each i < n with x[i] >= floor, in order. Such tokens are usually a small part of the vocabulary:
// a vectorised test skips runs of 16 without any.
template <class F>
void for_each_at_least(const float* x, int64_t n, float floor, F f) {
    for (int64_t lo = 0; lo < n; lo += 16) {
        const int64_t hi = std::min(n, lo + 16);
        int any = 0;
        for (int64_t i = lo; i < hi; ++i) any |= x[i] >= floor;
        if (!any) continue;
        for (int64_t i = lo; i < hi; ++i)
            if (x[i] >= floor) f(i);
    }
}

// Token order for top_k and top_p: larger logit first, ties -> lower id.
inline bool better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

void check_params(const SamplerParams& p, int64_t n_vocab) {
    auto fail = [](const std::string& msg) { throw std::invalid_argument(msg); };
    if (n_vocab < 1 || n_vocab > std::numeric_limits<int32_t>::max()) fail("n_vocab must be in [1, 2^31)");
    if (!(p.temperature >= 0) || std::isinf(p.temperature)) fail("temperature must be finite and >= 0");
    if (p.top_k < 0) fail("top_k must be >= 0 (0 = off)");
    if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p must be in (0, 1] (1 = off)");
    if (!(p.min_p >= 0 && p.min_p <= 1)) fail("min_p must be in [0, 1] (0 = off)");
    if (!(p.repeat_penalty > 0) || std::isinf(p.repeat_penalty))
        fail("repeat_penalty must be finite and > 0 (1 = off)");
    if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
        fail("presence_penalty and frequency_penalty must be finite");
    if (p.penalty_last_n < -1) fail("penalty_last_n must be >= -1 (-1 = the whole history)");
    for (const auto& [id, bias] : p.logit_bias) {
        if (id < 0 || id >= n_vocab)
            fail("logit_bias id " + std::to_string(id) + " is outside the vocabulary of " +
                 std::to_string(n_vocab));
        if (std::isnan(bias) || bias == kInf)
            fail("logit_bias for id " + std::to_string(id) + " must be finite or -inf");
    }
}

}  // namespace

Sampler::Sampler(SamplerParams params, int64_t n_vocab)
    : p_(std::move(params)), n_vocab_(n_vocab), rng_(p_.seed) {
    check_params(p_, n_vocab_);
    w_.resize(size_t(n_vocab_));
}

void Sampler::check_id(int32_t id, const char* what) const {
    if (id < 0 || id >= n_vocab_)
        throw std::invalid_argument(std::string(what) + " id " + std::to_string(id) +
                                    " is outside the vocabulary of " + std::to_string(n_vocab_));
}

void Sampler::accept(int32_t id) {
    check_id(id, "token");
    if (p_.penalty_last_n == 0) return;
    window_.push_back(id);
    ++counts_[id];
    if (p_.penalty_last_n > 0 && int64_t(window_.size()) > p_.penalty_last_n) {
        auto it = counts_.find(window_.front());
        if (--it->second == 0) counts_.erase(it);
        window_.pop_front();
    }
}

void Sampler::set_history(const int32_t* ids, int64_t n) {
    for (int64_t i = 0; i < n; ++i) check_id(ids[i], "history token");
    window_.clear();
    counts_.clear();
    const int64_t first = p_.penalty_last_n < 0 ? 0 : std::max<int64_t>(0, n - p_.penalty_last_n);
    for (int64_t i = first; i < n; ++i) {
        window_.push_back(ids[i]);
        ++counts_[ids[i]];
    }
}

// In double, rounded to float once and saturated to its range, so that a penalty as extreme as 1e-300 still
// leaves a finite logit (the limit: the token is as likely as a float logit can make it); -inf stays -inf.
void Sampler::apply_penalties() {
    const double rp = p_.repeat_penalty, freq = p_.frequency_penalty, presence = p_.presence_penalty;
    for (const auto& [id, count] : counts_) {
        float& x = w_[size_t(id)];
        if (x == -kInf) continue;  // banned
        double v = x > 0 ? x / rp : x * rp;
        v -= double(count) * freq + presence;
        x = float(std::clamp(v, -double(FLT_MAX), double(FLT_MAX)));
    }
}

int32_t Sampler::prepare(const float* logits, int64_t n_vocab, const int32_t* banned, int64_t n_banned) {
    if (n_vocab != n_vocab_)
        throw std::invalid_argument("logits have " + std::to_string(n_vocab) + " entries, the sampler " +
                                    std::to_string(n_vocab_));
    for (int64_t i = 0; i < n_banned; ++i) check_id(banned[i], "banned");
    const int64_t n = n_vocab_;
    float* w = w_.data();
    int64_t n_bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        w[i] = logits[i];
        n_bad += !(logits[i] < kInf);
    }
    if (n_bad) {
        const int64_t i = std::find_if(w, w + n, [](float x) { return !(x < kInf); }) - w;
        throw SamplingError("logit of token " + std::to_string(i) + " is " +
                            (std::isnan(w[i]) ? "NaN" : "+inf") + "; logits must be finite or -inf");
    }
    for (const auto& [id, bias] : p_.logit_bias)
        if (!((w[id] += bias) < kInf))
            throw SamplingError("logit_bias made the logit of token " + std::to_string(id) + " +inf");
    for (int64_t i = 0; i < n_banned; ++i) w[banned[i]] = -kInf;
    apply_penalties();

    const float max_logit = max_of(w, n);
    if (max_logit == -kInf)
        throw SamplingError(
            "no token left to sample: every token is banned (logit_bias -inf or banned ids) or has logit "
            "-inf");
    if (p_.temperature == 0) return int32_t(std::find(w, w + n, max_logit) - w);

    const float inv_t = float(1.0 / p_.temperature);
    if (p_.top_k > 0 && p_.top_k < n)
        top_k(max_logit, inv_t);
    else
        dense_softmax(max_logit, inv_t);
    if (p_.top_p < 1) top_p();
    if (p_.min_p > 0) min_p();
    mass_ = kept_mass();
    return -1;
}

// Weights e = exp((w - max) * (1/T)) of every token (1/T rounded to float once), and their sums per block
// of kBlock tokens (8 interleaved partial sums each, combined in a fixed order), so the draw can skip whole
// blocks.
void Sampler::dense_softmax(float max_logit, float inv_t) {
    const int64_t n = n_vocab_, n_blocks = (n + kBlock - 1) / kBlock;
    e_.resize(size_t(n));
    block_mass_.resize(size_t(n_blocks));
    const float* w = w_.data();
    float* e = e_.data();
    for (int64_t i = 0; i < n; ++i) e[i] = exp_nonpos((w[i] - max_logit) * inv_t);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; ++j) acc[j] += e[i + j];
        for (; i < hi; ++i) acc[0] += e[i];
        block_mass_[size_t(b)] =
            ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    dense_ = true;
}

// The top_k best tokens by a min-heap pass over the logits (one compare per token once the heap is full),
// sorted best first, then their weights.
void Sampler::top_k(float max_logit, float inv_t) {
    const size_t k = size_t(p_.top_k);
    const float* w = w_.data();
    kept_.clear();
    float floor = -kInf;  // the worst kept logit once the heap is full; -inf tokens never enter
    for (int64_t i = 0; i < n_vocab_; ++i) {
        if (!(w[i] > floor)) continue;
        if (kept_.size() == k) {
            std::pop_heap(kept_.begin(), kept_.end(), better);
            kept_.back() = {w[i], int32_t(i)};
        } else {
            kept_.emplace_back(w[i], int32_t(i));
        }
        std::push_heap(kept_.begin(), kept_.end(), better);
        if (kept_.size() == k) floor = kept_.front().first;
    }
    std::sort(kept_.begin(), kept_.end(), better);
    for (auto& [x, id] : kept_) x = exp_nonpos((x - max_logit) * inv_t);
    dense_ = false;
}

// Keeps the shortest best-first prefix whose weight reaches top_p of the total. The dense path never sorts
// the vocabulary: tokens are bucketed by the top 13 bits of their weight's float encoding (1/16 of a binade
// each, and weights order like logits since exp_nonpos is monotone); buckets are taken from the heaviest
// down until the one where the mass crosses top_p, and only that bucket is sorted. Tokens weighing less
// than (1 - top_p) / n * 0.999 are skipped: all of them together weigh less than 1 - top_p, and the total
// is at least the largest weight, 1.
void Sampler::top_p() {
    double total = 0;
    if (!dense_) {
        for (const auto& kv : kept_) total += kv.first;
        const double target = p_.top_p * total;
        double cum = 0;
        size_t keep = 0;
        while (keep < kept_.size() && cum < target) cum += kept_[keep++].first;
        kept_.resize(keep);
        return;
    }
    for (double m : block_mass_) total += m;
    const double target = p_.top_p * total;
    const float floor = std::max(float((1 - p_.top_p) / double(n_vocab_) * 0.999), FLT_MIN);
    const float* w = w_.data();
    const float* e = e_.data();
    auto bucket = [](float x) {
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        return int(bits >> 19);
    };
    constexpr int kBuckets = (0x3f800000 >> 19) + 1;  // weights are in (0, 1]
    bucket_mass_.assign(kBuckets, 0.0);
    candidates_.clear();
    for_each_at_least(e, n_vocab_, floor, [&](int64_t i) {
        candidates_.push_back(int32_t(i));
        bucket_mass_[size_t(bucket(e[i]))] += e[i];
    });
    // The crossing bucket; should rounding leave the sum short, every bucket is taken whole.
    double cum = 0;
    int cross = kBuckets - 1;
    while (cross >= 0 && cum + bucket_mass_[size_t(cross)] < target) cum += bucket_mass_[size_t(cross--)];
    kept_.clear();
    boundary_.clear();
    for (int32_t id : candidates_) {
        const int b = bucket(e[id]);
        if (b > cross)
            kept_.emplace_back(e[id], id);
        else if (b == cross)
            boundary_.emplace_back(w[id], id);
    }
    std::sort(boundary_.begin(), boundary_.end(), better);
    for (size_t j = 0; j < boundary_.size() && cum < target; ++j) {
        const int32_t id = boundary_[j].second;
        cum += e[id];
        kept_.emplace_back(e[id], id);
    }
    dense_ = false;
}

// Drops tokens whose weight is below min_p of the largest; the largest weight is exp(0) = 1.
void Sampler::min_p() {
    const float floor = float(p_.min_p);
    if (dense_) {
        kept_.clear();
        for_each_at_least(e_.data(), n_vocab_, floor,
                          [&](int64_t i) { kept_.emplace_back(e_[size_t(i)], int32_t(i)); });
        dense_ = false;
        return;
    }
    kept_.erase(std::remove_if(kept_.begin(), kept_.end(), [&](const auto& kv) { return kv.first < floor; }),
                kept_.end());
}

double Sampler::kept_mass() const {
    double total = 0;
    if (dense_)
        for (double m : block_mass_) total += m;
    else
        for (const auto& kv : kept_) total += kv.first;
    return total;
}

int32_t Sampler::sample(const float* logits, int64_t n_vocab, const int32_t* banned, int64_t n_banned) {
    const int32_t greedy = prepare(logits, n_vocab, banned, n_banned);
    if (greedy >= 0) return greedy;
    const double target = rng_.uniform() * mass_;
    double cum = 0;
    if (!dense_) {
        // Adds in kept_mass()'s order, so the sum ends exactly at mass_ > target; the fallback only catches
        // u * mass_ rounding up to mass_.
        for (const auto& [x, id] : kept_)
            if ((cum += x) > target) return id;
        auto last = std::find_if(kept_.rbegin(), kept_.rend(), [](const auto& kv) { return kv.first > 0; });
        return last->second;
    }
    // Skip whole blocks, then walk the block the target falls in. Its sum was added in another order than
    // this walk, so rounding can leave the walk short: it then takes the block's last positive weight.
    int64_t b_last = int64_t(block_mass_.size()) - 1;
    while (block_mass_[size_t(b_last)] == 0) --b_last;
    int64_t b = 0;
    while (b < b_last && cum + block_mass_[size_t(b)] <= target) cum += block_mass_[size_t(b++)];
    const int64_t lo = b * kBlock, hi = std::min(n_vocab_, lo + kBlock);
    int32_t last = -1;
    for (int64_t i = lo; i < hi; ++i) {
        if (e_[size_t(i)] == 0) continue;
        last = int32_t(i);
        if ((cum += e_[size_t(i)]) > target) break;
    }
    return last;
}

void Sampler::probabilities(const float* logits, int64_t n_vocab, const int32_t* banned, int64_t n_banned,
                            double* out) {
    const int32_t greedy = prepare(logits, n_vocab, banned, n_banned);
    std::fill(out, out + n_vocab_, 0.0);
    if (greedy >= 0) {
        out[greedy] = 1;
    } else if (dense_) {
        for (int64_t i = 0; i < n_vocab_; ++i) out[i] = e_[size_t(i)] / mass_;
    } else {
        for (const auto& [x, id] : kept_) out[id] = x / mass_;
    }
}

}  // namespace regolith
