#include "core/expert_cache_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "core/errors.h"

namespace regolith {

ExpertCachePolicy::ExpertCachePolicy(int64_t n_keys, int64_t n_slots, const CachePolicyOptions& opt)
    : opt_(opt),
      n_hot_(std::max<int64_t>(0, std::min(int64_t(std::floor(std::clamp(opt.hot_fraction, 0.0, 1.0) *
                                                               double(n_slots))),
                                           n_slots - opt.lru_reserve))),
      score_(size_t(n_keys), 0.0),
      last_(size_t(n_keys), 0),
      hot_(size_t(n_keys), 0) {
    if (!(opt.decay > 0.0 && opt.decay <= 1.0)) throw Error("cache policy: decay must be in (0, 1]");
    if (opt.refresh <= 0) throw Error("cache policy: refresh must be positive");
}

void ExpertCachePolicy::touch(int64_t key) {
    ++clock_;
    double& s = score_[size_t(key)];
    s = s * std::pow(opt_.decay, double(clock_ - last_[size_t(key)])) + 1.0;
    last_[size_t(key)] = clock_;
    if (clock_ % uint64_t(opt_.refresh) == 0) refresh_hot_set();
}

double ExpertCachePolicy::score(int64_t key) const {
    return score_[size_t(key)] * std::pow(opt_.decay, double(clock_ - last_[size_t(key)]));
}

std::vector<int64_t> ExpertCachePolicy::top(int64_t n) const {
    // Scores decayed to the current clock, so experts last used long ago rank by what is left of theirs.
    std::vector<double> now(score_.size());
    for (size_t i = 0; i < score_.size(); ++i) now[i] = score_[i] * std::pow(opt_.decay, double(clock_ - last_[i]));
    std::vector<int64_t> keys(score_.size());
    std::iota(keys.begin(), keys.end(), 0);
    n = std::min<int64_t>(n, int64_t(keys.size()));
    std::partial_sort(keys.begin(), keys.begin() + n, keys.end(), [&](int64_t a, int64_t b) {
        return now[size_t(a)] > now[size_t(b)] || (now[size_t(a)] == now[size_t(b)] && a < b);
    });
    keys.resize(size_t(n));
    while (!keys.empty() && now[size_t(keys.back())] == 0.0) keys.pop_back();
    return keys;
}

void ExpertCachePolicy::refresh_hot_set() {
    std::fill(hot_.begin(), hot_.end(), 0);
    for (int64_t key : top(n_hot_)) hot_[size_t(key)] = 1;
}

double routed_decay(int64_t n_slots) { return std::pow(0.5, 1.0 / (16.0 * double(std::max<int64_t>(1, n_slots)))); }

RoutedReplay replay_routed_trace(const int32_t* trace, int64_t n_steps, int64_t n_layer, int64_t k, int64_t n_expert,
                                 int64_t n_slots, int64_t limit, const CachePolicyOptions& opt) {
    if (n_slots <= 0) throw Error("replay_routed_trace: n_slots must be positive");
    CachePolicyOptions o = opt;
    o.decay = routed_decay(n_slots);
    ExpertCachePolicy policy(n_layer * n_expert, n_slots, o);
    std::vector<int64_t> slot_key(size_t(n_slots), -1);
    std::vector<uint64_t> last_use(size_t(n_slots), 0);
    std::unordered_map<int64_t, int64_t> where;  // key -> slot
    RoutedReplay r;
    for (int64_t t = 0; t < n_steps; ++t) {
        std::vector<int64_t> missed;
        for (int64_t i = 0; i < n_layer * k; ++i) {
            const int32_t e = trace[t * n_layer * k + i];
            if (e < 0) continue;
            if (e >= n_expert) throw Error("replay_routed_trace: expert id out of range");
            const int64_t key = i / k * n_expert + e;
            policy.touch(key);
            const auto it = where.find(key);
            if (it != where.end()) {
                ++r.hits;
                last_use[size_t(it->second)] = policy.clock();
            } else {
                ++r.misses;
                if (std::find(missed.begin(), missed.end(), key) == missed.end()) missed.push_back(key);
            }
        }
        for (const Admission& a : admit_misses(policy, missed, limit, slot_key, last_use,
                                               [&](int64_t key) { return where.count(key) > 0; },
                                               [](int64_t) { return true; })) {
            if (a.evicted >= 0) where.erase(a.evicted);
            where[a.key] = a.slot;
            ++r.copies;
        }
    }
    return r;
}

TraceReplay replay_trace(const int32_t* trace, int64_t n_steps, int64_t n_layer, int64_t k, int64_t n_expert,
                         int64_t n_slots, const CachePolicyOptions& opt) {
    if (n_slots <= 0) throw Error("replay_trace: n_slots must be positive");
    ExpertCachePolicy policy(n_layer * n_expert, n_slots, opt);
    std::vector<int64_t> slot_key(size_t(n_slots), -1);
    std::vector<uint64_t> last_use(size_t(n_slots), 0);
    std::unordered_map<int64_t, int64_t> where;  // key -> slot
    TraceReplay r;
    for (int64_t i = 0; i < n_steps * n_layer; ++i) {
        const int32_t* ids = trace + i * k;
        const int64_t layer = i % n_layer;
        // The experts of one layer are in use together: none of them may be evicted for another.
        std::vector<int64_t> pinned;
        for (int64_t j = 0; j < k; ++j) {
            if (ids[j] < 0) continue;
            if (ids[j] >= n_expert) throw Error("replay_trace: expert id out of range");
            const int64_t key = layer * n_expert + ids[j];
            policy.touch(key);
            auto it = where.find(key);
            int64_t slot;
            if (it != where.end()) {
                ++r.hits;
                slot = it->second;
            } else {
                ++r.misses;
                slot = policy.victim(slot_key, last_use, [&](int64_t s) {
                    return std::find(pinned.begin(), pinned.end(), s) == pinned.end();
                });
                if (slot < 0) continue;  // more experts in one layer than slots: streamed through, not kept
                if (slot_key[size_t(slot)] >= 0) where.erase(slot_key[size_t(slot)]);
                slot_key[size_t(slot)] = key;
                where[key] = slot;
            }
            last_use[size_t(slot)] = policy.clock();
            pinned.push_back(slot);
        }
    }
    return r;
}

}  // namespace regolith
