// Suffix drafting (model-free speculation): the text seen so far (prompt, generated tokens, earlier turns)
// in an incremental suffix automaton; a draft is what followed the most recent earlier occurrence of the
// text's longest repeated suffix. Prompt lookup is the case of a match found in the prompt.
//
// The automaton (Blumer et al.) has one state per endpos class; the longest suffix of the text that occurred
// before ends in the suffix link of the state of the whole text, and its length is the draft's confidence.
// Each state keeps the two latest end positions known for it (set when it is created, cloned, or is one of
// the first kMaxRefresh suffix-link ancestors of a new token's state), so a draft follows the most recent
// occurrence of that suffix except when only a longer repeat touched it since (then an older occurrence).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace regolith {

struct SuffixDraft {
    std::vector<int32_t> tokens;  // the proposed continuation, oldest first
    int64_t match_len = 0;        // length of the repeated suffix it continues (0: no draft)
};

class SuffixDrafter {
public:
    SuffixDrafter();

    int64_t size() const { return int64_t(text_.size()); }
    const std::vector<int32_t>& text() const { return text_; }
    // Appends tokens to the text (amortised O(1) each).
    void append(const int32_t* tokens, int64_t n);
    // Keeps the first n tokens (0 <= n <= size(); throws std::invalid_argument otherwise). Rebuilds the
    // automaton when n < size(): O(n), meant for rare rollbacks.
    void truncate(int64_t n);
    // Up to max_tokens tokens continuing the text, when its longest repeated suffix has at least min_match
    // tokens; otherwise an empty draft.
    SuffixDraft propose(int64_t max_tokens, int64_t min_match = 1) const;
    // The match length a draft proposed now would continue (0: none), in O(1): a check cheap enough for the
    // tokens the speculator skips planning for.
    int64_t match_len() const;
    // Which match lengths wake the speculator from its backoff: wakes[m] for a match of m tokens, the last
    // entry for every longer one (empty: none wakes). Set by the speculator as its acceptance estimates move.
    void set_wakes(std::vector<uint8_t> wakes) { wakes_ = std::move(wakes); }
    // The tokens the speculator skips planning for, in one call: appends `token` when the text holds
    // `expected` tokens (returns -1 and appends nothing otherwise) and returns whether the new match
    // length wakes the speculator (1) or not (0).
    int push_wakes(int32_t token, int64_t expected);

private:
    static constexpr int kMaxRefresh = 8;
    struct State {
        int32_t len = 0;    // longest string of the state
        int32_t link = -1;  // suffix link
        int32_t end = -1;   // latest known end position of the state's strings
        int32_t prev = -1;  // the one before (an occurrence before `end`), or -1
    };
    void extend(int32_t token);
    // Where the latest earlier occurrence of the longest repeated suffix ends (-1: no match).
    int64_t match_end() const;
    void seen_at(int32_t state, int32_t pos);
    int32_t next(int32_t state, int32_t token) const;

    std::vector<int32_t> text_;
    std::vector<State> st_;
    std::unordered_map<uint64_t, int32_t> edges_;  // (state << 32 | token) -> state
    std::vector<std::vector<int32_t>> out_;        // per state: the tokens of its edges (to copy on clones)
    std::vector<uint8_t> wakes_;                   // set_wakes
    int32_t last_ = 0;
};

}  // namespace regolith
