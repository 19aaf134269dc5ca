// Token sampling: one step's logits -> one token id. Backend-agnostic and single-threaded; given the seed,
// the same logits give the same tokens on every platform (own PRNG and exp, plain float arithmetic in a
// fixed order, no contraction into fma).
//
// Pipeline, each step acting on the output of the one before:
//   1. logit bias (additive; -inf bans a token), then this step's banned ids (-> -inf)
//   2. penalties over the last penalty_last_n tokens of the history, count = occurrences there:
//      repetition (CTRL, as llama.cpp: a positive logit is divided by repeat_penalty, a negative one
//      multiplied), then presence/frequency (OpenAI: logit -= frequency * count + presence * [count > 0])
//   3. temperature == 0: the argmax (ties -> lowest id), done
//   4. temperature: logit / T
//   5. top_k: the k largest (ties -> lower id)
//   6. softmax
//   7. top_p: order by probability (ties -> lower id); keep the shortest prefix whose mass >= top_p
//   8. min_p: drop p < min_p * p_max
//   9. renormalise; draw u in [0, 1) and take the first kept token whose cumulative mass exceeds u
// Why this order: bias and bans say which tokens exist, so every later step sees them. Penalties act on raw
// logits, the scale llama.cpp and the OpenAI API define them on. Greedy is decided on those same logits and
// before the division by T. Temperature comes before the truncations, as in transformers and vLLM, so
// top_p and min_p cut the distribution that is actually drawn from (llama.cpp's default chain applies
// temperature last, cutting the T = 1 distribution); top_k is order-only, so its place among 4-6 does not
// matter; top_p before min_p is transformers' order (min_p, being relative to p_max, is unaffected by
// top_p's cut, while top_p after min_p would measure mass on a renormalised remainder).
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "core/random.h"

namespace regolith {

// Sampling input the sampler cannot work with: NaN or +inf logits, every token banned (-> Python
// regolith.SamplingError).
struct SamplingError : Error {
    using Error::Error;
};

struct SamplerParams {
    double temperature = 1.0;        // >= 0; 0 = greedy
    int64_t top_k = 0;               // >= 0; 0 = off
    double top_p = 1.0;              // (0, 1]; 1 = off
    double min_p = 0.0;              // [0, 1]; 0 = off
    double repeat_penalty = 1.0;     // > 0; 1 = off
    double presence_penalty = 0.0;   // 0 = off
    double frequency_penalty = 0.0;  // 0 = off
    int64_t penalty_last_n = 64;     // tokens of history the penalties look at; -1 = all, 0 = none
    std::vector<std::pair<int32_t, float>> logit_bias;  // (id, additive bias); -inf bans the token
    uint64_t seed = 0;
};

class Sampler {
  public:
    // Throws std::invalid_argument for out-of-range parameters or bias ids outside [0, n_vocab).
    Sampler(SamplerParams params, int64_t n_vocab);

    // A token id drawn from logits[n_vocab]; banned[n_banned] are forbidden at this step only. Throws
    // SamplingError for NaN or +inf logits or when no token is left, std::invalid_argument for a wrong
    // n_vocab or a banned id out of range. Does not add the token to the history (accept() does).
    int32_t sample(const float* logits, int64_t n_vocab, const int32_t* banned, int64_t n_banned);

    // out[n_vocab] = the distribution sample() draws from for the same input (one-hot when greedy).
    void probabilities(const float* logits, int64_t n_vocab, const int32_t* banned, int64_t n_banned,
                       double* out);

    // Appends a token to the penalty history.
    void accept(int32_t id);
    // Replaces the history (the prompt and the tokens generated so far, e.g. after a rollback).
    void set_history(const int32_t* ids, int64_t n);
    void reseed(uint64_t seed) { rng_.reseed(seed); }

    const SamplerParams& params() const { return p_; }
    int64_t n_vocab() const { return n_vocab_; }

  private:
    // Steps 1-8. Returns the greedy token, or -1 with the kept tokens in the kept set: all ids with weights
    // e_[id] (dense_) or kept_[i] = (weight, id).
    int32_t prepare(const float* logits, int64_t n_vocab, const int32_t* banned, int64_t n_banned);
    void apply_penalties();
    void dense_softmax(float max_logit, float inv_t);
    void top_k(float max_logit, float inv_t);
    void top_p();
    void min_p();
    double kept_mass() const;
    void check_id(int32_t id, const char* what) const;

    SamplerParams p_;
    int64_t n_vocab_;
    Xoshiro256 rng_;
    std::deque<int32_t> window_;                   // the last penalty_last_n history tokens
    std::unordered_map<int32_t, int32_t> counts_;  // id -> occurrences in window_

    std::vector<float> w_;                             // [n_vocab] logits after steps 1-2
    std::vector<float> e_;                             // [n_vocab] exp((w - max) / T) on the dense path
    std::vector<double> block_mass_;                   // [n_vocab / kBlock] sums of e_ per block, dense path
    std::vector<std::pair<float, int32_t>> kept_;      // (weight, id) on the sparse path
    std::vector<double> bucket_mass_;                  // top_p: weight per bucket of weights
    std::vector<int32_t> candidates_;                  // top_p: ids that may be in the kept set
    std::vector<std::pair<float, int32_t>> boundary_;  // top_p: (logit, id) of the crossing bucket
    bool dense_ = false;
    double mass_ = 0;  // sum of the kept weights
};

}  // namespace regolith
