// Which resident expert to evict: LRU, with an online-learned hot set that LRU may not evict.
//
// Routed experts show two kinds of reuse: temporal locality (consecutive tokens share many experts) and a
// skewed long-run usage (a minority of experts per layer serve most tokens). LRU captures the first but a
// burst of rarely used experts (a long prompt's prefill, a change of topic) flushes the frequent ones with
// it. So each expert keeps a usage score decayed by `decay` per use of the arena (an exponential moving
// count); every `refresh` uses the experts whose score ranks in the top min(hot_fraction * slots, slots -
// lru_reserve) become the hot set (the reserve keeps room for one token's experts to pass through LRU).
// Eviction takes the least recently used slot outside the hot set, and only when every candidate is hot
// the least recently used hot one. With hot_fraction 0 this is plain LRU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace regolith {

struct CachePolicyOptions {
    double hot_fraction = 0.75;  // share of the slots the protected hot set may take
    double decay = 0.999;        // per-use decay of the usage scores (half-life ~700 uses)
    int64_t refresh = 256;       // uses between recomputations of the hot set
    int64_t lru_reserve = 0;     // slots always left to LRU (the arena: one token's experts, layers x k)
};

class ExpertCachePolicy {
  public:
    ExpertCachePolicy(int64_t n_keys, int64_t n_slots, const CachePolicyOptions& opt = {});

    // A use of expert `key` (layer * n_expert + expert).
    void touch(int64_t key);
    // The slot a new record should replace: the least recently used non-hot candidate, else the least recently
    // used one. `slot_key[s]` is the key slot s holds (-1: empty); candidates are the slots may_evict(s) allows.
    template <class MayEvict>
    int64_t victim(const std::vector<int64_t>& slot_key, const std::vector<uint64_t>& slot_last_use,
                   MayEvict may_evict) const {
        int64_t best = -1, best_hot = -1;
        for (int64_t s = 0; s < int64_t(slot_key.size()); ++s) {
            if (!may_evict(s)) continue;
            if (slot_key[size_t(s)] < 0) return s;
            const bool h = hot(slot_key[size_t(s)]);
            int64_t& b = h ? best_hot : best;
            if (b < 0 || slot_last_use[size_t(s)] < slot_last_use[size_t(b)]) b = s;
        }
        return best >= 0 ? best : best_hot;
    }
    bool hot(int64_t key) const { return hot_[size_t(key)] != 0; }
    // Whether a record missed between steps should replace the one a slot holds (the device-routed arena's
    // admission, TinyLFU's idea): only when its usage score is the higher. Its misses are served anyway (read in
    // place), so admitting every one, as LRU does, copies records that the next tokens rarely use: on the
    // bundled demo model's routing trace at a quarter of the experts, admission keeps a higher hit rate
    // (43% against 40%) for a sixth of the copies (3.4 a token against 19).
    bool admits(int64_t key, int64_t resident) const { return score(key) > score(resident); }
    // Key's usage score decayed to the current clock.
    double score(int64_t key) const;
    uint64_t clock() const { return clock_; }
    // The keys with the highest usage scores, best first (at most n).
    std::vector<int64_t> top(int64_t n) const;

  private:
    void refresh_hot_set();

    CachePolicyOptions opt_;
    int64_t n_hot_;
    uint64_t clock_ = 0;
    std::vector<double> score_;     // [n_keys], valid as of last_[key]
    std::vector<uint64_t> last_;    // [n_keys], the clock of the score
    std::vector<uint8_t> hot_;      // [n_keys]
};

// The device-routed arena's scoring (ExpertArena, routed mode): a half-life of 16 arenas' worth of uses,
// whatever the arena's size, so a score outlives a record's stay in the arena and admission means something
// (at 0.999 a use, a record evicted from Flash-Next's quarter arena, 6,144 slots at 480 uses a token, keeps
// ~0.3% of its score and every miss is admitted, as LRU admits them).
double routed_decay(int64_t n_slots);

// One record admitted between steps by admit_misses: it goes into `slot`, whose record `evicted` (-1: none)
// leaves.
struct Admission {
    int64_t slot, key, evicted;
};

// The device-routed arena's choice between steps (ExpertArena::after_step): of a step's missed keys
// (distinct, in order) the last `limit` not resident(key) are offered, each to the policy's victim among the
// slots may_evict(s) allows; one is admitted where the victim is empty or the policy admits it over the
// victim's record. slot_key and slot_last_use are updated; returns the admissions in order.
template <class Resident, class MayEvict>
std::vector<Admission> admit_misses(const ExpertCachePolicy& policy, const std::vector<int64_t>& missed, int64_t limit,
                                    std::vector<int64_t>& slot_key, std::vector<uint64_t>& slot_last_use,
                                    Resident resident, MayEvict may_evict) {
    std::vector<Admission> out;
    const size_t first = missed.size() > size_t(limit) ? missed.size() - size_t(limit) : 0;
    for (size_t i = first; i < missed.size(); ++i) {
        const int64_t key = missed[i];
        if (resident(key)) continue;
        const int64_t s = policy.victim(slot_key, slot_last_use, may_evict);
        if (s < 0) break;
        const int64_t old = slot_key[size_t(s)];
        if (old >= 0 && !policy.admits(key, old)) continue;
        slot_key[size_t(s)] = key;
        slot_last_use[size_t(s)] = policy.clock();
        out.push_back({s, key, old});
    }
    return out;
}

// Replays a routing trace through the device-routed arena's policy with n_slots slots (no I/O): each token a
// step whose experts hit where the arena held them when it began, then admit_misses (at most `limit` a step,
// routed_decay's scores). {hits, misses, copies}: copies counts the records admitted.
struct RoutedReplay {
    uint64_t hits = 0, misses = 0, copies = 0;
};
RoutedReplay replay_routed_trace(const int32_t* trace, int64_t n_steps, int64_t n_layer, int64_t k, int64_t n_expert,
                                 int64_t n_slots, int64_t limit, const CachePolicyOptions& opt);

// Replays a routing trace through an arena of n_slots slots under the policy (no I/O): returns
// {hits, misses}. trace: [n_steps][n_layer][k] expert ids (-1 = none); steps are tokens, each layer's experts
// used in order.
struct TraceReplay {
    uint64_t hits = 0, misses = 0;
};
TraceReplay replay_trace(const int32_t* trace, int64_t n_steps, int64_t n_layer, int64_t k, int64_t n_expert,
                         int64_t n_slots, const CachePolicyOptions& opt);

}  // namespace regolith
