#include "core/suffix_drafter.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace regolith {

namespace {

uint64_t edge_key(int32_t state, int32_t token) { return uint64_t(uint32_t(state)) << 32 | uint32_t(token); }

}  // namespace

SuffixDrafter::SuffixDrafter() : st_(1), out_(1) {}

int32_t SuffixDrafter::next(int32_t state, int32_t token) const {
    const auto it = edges_.find(edge_key(state, token));
    return it == edges_.end() ? -1 : it->second;
}

void SuffixDrafter::seen_at(int32_t state, int32_t pos) {
    State& s = st_[size_t(state)];
    if (s.end == pos) return;
    s.prev = s.end;
    s.end = pos;
}

void SuffixDrafter::extend(int32_t token) {
    const int32_t pos = int32_t(text_.size());
    text_.push_back(token);
    const int32_t cur = int32_t(st_.size());
    st_.push_back(State{st_[size_t(last_)].len + 1, -1, pos, -1});
    out_.emplace_back();
    int32_t p = last_;
    while (p != -1 && next(p, token) == -1) {
        edges_[edge_key(p, token)] = cur;
        out_[size_t(p)].push_back(token);
        p = st_[size_t(p)].link;
    }
    if (p == -1) {
        st_[size_t(cur)].link = 0;
    } else {
        const int32_t q = next(p, token);
        if (st_[size_t(p)].len + 1 == st_[size_t(q)].len) {
            st_[size_t(cur)].link = q;
        } else {
            const int32_t clone = int32_t(st_.size());
            State c = st_[size_t(q)];  // same end positions: the clone's occurrences include q's
            c.len = st_[size_t(p)].len + 1;
            st_.push_back(c);
            out_.push_back(out_[size_t(q)]);
            for (int32_t t : out_[size_t(clone)]) edges_[edge_key(clone, t)] = next(q, t);
            while (p != -1 && next(p, token) == q) {
                edges_[edge_key(p, token)] = clone;
                p = st_[size_t(p)].link;
            }
            st_[size_t(q)].link = clone;
            st_[size_t(cur)].link = clone;
        }
    }
    last_ = cur;
    int32_t a = st_[size_t(cur)].link;
    for (int i = 0; i < kMaxRefresh && a > 0; ++i, a = st_[size_t(a)].link) seen_at(a, pos);
}

void SuffixDrafter::append(const int32_t* tokens, int64_t n) {
    for (int64_t i = 0; i < n; ++i) extend(tokens[i]);
}

void SuffixDrafter::truncate(int64_t n) {
    if (n < 0 || n > size())
        throw std::invalid_argument("SuffixDrafter::truncate: " + std::to_string(n) + " is outside [0, " +
                                    std::to_string(size()) + "]");
    if (n == size()) return;
    std::vector<int32_t> kept(text_.begin(), text_.begin() + n);
    text_.clear();
    st_.assign(1, State{});
    out_.assign(1, {});
    edges_.clear();
    last_ = 0;
    append(kept.data(), n);
}

int64_t SuffixDrafter::match_end() const {
    if (text_.empty()) return -1;
    const int32_t v = st_[size_t(last_)].link;
    if (v <= 0) return -1;
    const State& s = st_[size_t(v)];
    return s.end < size() - 1 ? s.end : s.prev;
}

int64_t SuffixDrafter::match_len() const {
    return match_end() < 0 ? 0 : st_[size_t(st_[size_t(last_)].link)].len;
}

int SuffixDrafter::push_wakes(int32_t token, int64_t expected) {
    if (expected != size()) return -1;
    extend(token);
    if (wakes_.empty()) return 0;
    const int64_t m = match_len();
    return wakes_[size_t(std::min<int64_t>(m, int64_t(wakes_.size()) - 1))];
}

SuffixDraft SuffixDrafter::propose(int64_t max_tokens, int64_t min_match) const {
    SuffixDraft d;
    const int64_t end = match_end();
    if (end < 0 || max_tokens <= 0) return d;
    const int64_t len = st_[size_t(st_[size_t(last_)].link)].len;
    if (len < min_match) return d;
    const int64_t n = size();
    d.match_len = len;
    const int64_t stop = std::min<int64_t>(n, end + 1 + max_tokens);
    d.tokens.assign(text_.begin() + end + 1, text_.begin() + stop);
    return d;
}

}  // namespace regolith
