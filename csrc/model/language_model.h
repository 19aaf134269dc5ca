// The architecture-neutral face of a model, what generation, sessions and the Python layer use: a window
// (one inference context) takes token ids and gives logits. Every architecture's window implements it.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "model/window_state.h"

namespace regolith {

class ModelWindow;

// One window's share of a step over several windows (eval_windows): its tokens and where its logits go, as
// ModelWindow::eval takes them.
struct WindowStep {
    ModelWindow* window = nullptr;
    const int32_t* tokens = nullptr;
    int64_t n = 0;
    float* logits = nullptr;
    bool all_logits = false;
};

class ModelWindow {
public:
    virtual ~ModelWindow() = default;

    virtual int64_t n_past() const = 0;
    virtual int64_t max_ctx() const = 0;
    virtual int64_t vocab() const = 0;
    // Forget every token: back to the state of a new window.
    virtual void reset() = 0;
    // tokens: [n] ids < vocab; logits: [n][vocab], or [1][vocab] for the last token when !all_logits.
    // Throws regolith::Error on bad ids or when the context would overflow (the state is then unchanged);
    // if evaluation itself fails (I/O, memory), the window is reset.
    // Calls on one window are serialised; different windows of a model may run concurrently.
    virtual void eval(const int32_t* tokens, int64_t n, float* logits, bool all_logits) = 0;
    // eval_windows on windows of this window's model (this one among them or not).
    virtual void eval_steps(const std::vector<WindowStep>& steps) = 0;
    // Keep the first n tokens and forget the rest (0 <= n <= n_past). Returns false, changing nothing, when
    // the architecture's state cannot be cut back (recurrent layers keep no history); callers then reset
    // and evaluate the kept tokens again.
    virtual bool truncate(int64_t n) = 0;

    // Speculative decoding. After checkpoint(), the next eval (of at most kMaxCheckpointTokens tokens) keeps
    // per-token states, so that truncate(m) then succeeds for every m from the n_past at checkpoint() to
    // n_past, until an eval without checkpoint(), reset() or import_state(). Windows whose truncate always
    // succeeds (attention-only models cut their KV cache) need nothing and ignore it.
    static constexpr int64_t kMaxCheckpointTokens = 16;
    virtual void checkpoint() {}
    // Submits the ops recorded so far (Backend::submit). The Python bindings call it before they return, so no
    // thread keeps a GPU backend's graph capture (cuda: one thread's at a time) while Python runs: that thread
    // may next wait on another (the server's step thread) that needs the backend.
    virtual void submit() = 0;
    // The model's own draft head (qwen4exp's MTP), if it has one: up to n (<= kMaxCheckpointTokens) greedy
    // draft tokens following the window's tokens and `next`, the token to be evaluated next. Empty without a
    // draft head or before the window holds a token whose hidden state it knows.
    virtual bool has_draft_head() const { return false; }
    virtual std::vector<int32_t> draft(int32_t /*next*/, int64_t /*n*/) { return {}; }
    // The part of the next draft that depends on the held tokens alone: the head takes in every token it
    // has not seen but the last, and the backend finishes, so that timing this call times it. Returns how
    // many tokens it took in. A draft after it costs what drafting costs; a draft without it does this first.
    virtual int64_t catch_up_draft_head() { return 0; }
    // How many tokens catch_up_draft_head would take in now.
    virtual int64_t draft_head_lag() const { return 0; }

    using StateFn = std::function<void(std::vector<StatePart>&)>;
    // Saving (model/state_file.h): runs fn with the window locked and its state as parts, positional parts
    // holding the rows of tokens [from, n_past()). fn reads the spans; it must not call the window.
    virtual void export_state(int64_t from, const StateFn& fn) = 0;
    // Restoring a state of n tokens onto a window holding exactly its first `from` (StateError otherwise, or
    // when n exceeds max_ctx; the window is then unchanged): grows the storage to n tokens and runs fn with
    // the parts, whose spans fn fills; the window then holds n tokens. `whole`: list the whole-state parts
    // (recurrent states) too; without them the window is only a base for restoring a later delta on top.
    // If fn throws, the window is reset and the exception propagates.
    virtual void import_state(int64_t from, int64_t n, bool whole, const StateFn& fn) = 0;

    // Suffix cache reuse: whether append_moved works for this architecture (attention-only models).
    virtual bool can_move() const { return false; }
    // Appends positions [src, src + n) of `saved` (this model's window state of `total` tokens: the parts of
    // export_state(0), each one contiguous span) at this window's next n positions, each attention key turned
    // to its new position (a RoPE rotation by the shift): the tokens' cache rows as they were computed in
    // their old context, not the new one; pooled block keys (QSA) are pooled again. `recent`: the ids of the
    // window's last tokens after the move (up to kRecentTokens; the n-gram context of PLE layers). Error,
    // changing nothing, for bad ranges, a context overflow or a state of another layout; Error where
    // !can_move(). If the copy itself fails, the window is reset.
    static constexpr int64_t kRecentTokens = 16;
    virtual void append_moved(const std::vector<StatePart>& saved, int64_t total, int64_t src, int64_t n,
                              const std::vector<int32_t>& recent);
    // Suffix cache reuse's cut: keeps the attention rows of the first n tokens (0 <= n <= n_past) and every
    // recurrent state (Gated DeltaNet, PLE's conv history) as it is, the state after all n_past tokens: the
    // "keep" policy, approximate where such layers exist (truncate(n) on attention-only models). `recent`:
    // the ids of the last kept tokens, as append_moved's. Error where !can_move().
    virtual void truncate_attention(int64_t n, const std::vector<int32_t>& recent) { refuse_moves(); }
    // Suffix cache reuse's end: takes the whole-state parts of `saved` (as append_moved's: the Gated DeltaNet
    // states, PLE's conv history) as this window's, its tokens unchanged, PLE's n-gram context from
    // `recent`: after the last run moved, the recurrent layers have read the old text up to its end, whose
    // last stretch the window's last tokens are (the "adopt" policy). Nothing for attention-only models.
    // Error, changing nothing, for a state of another layout; if the copy fails, the window is reset.
    virtual void adopt_recurrent(const std::vector<StatePart>& saved, const std::vector<int32_t>& recent) {}

    // Bytes of backend memory the window's growing attention caches hold now (QSA or KV caches; not the MTP
    // head's): what the memory plan's per-token state estimates.
    virtual uint64_t attention_cache_bytes() const = 0;
    // The most bytes of backend memory the window's scratch (the tensors of one evaluation, or of a step over
    // several windows this one led) has held at once: what the memory plan's scratch estimates.
    virtual uint64_t scratch_peak_bytes() const = 0;

protected:
    // The Error append_moved throws where !can_move().
    [[noreturn]] static void refuse_moves();
};

// One forward pass over several windows of one model: every window's rows have their own positions, caches
// and recurrent states, and each product carries the rows of all of them, so a weight (a streamed expert too)
// is read once per step for every window routed to it. Each window's logits and state are bit for bit those
// of its eval alone. A step may mix a prompt chunk of one window with single decode tokens of others; a window
// armed by checkpoint() keeps its rollback slots as in eval. Windows with n == 0 are left alone. Throws Error,
// changing no window, for a window listed twice, windows of different models, a bad id or a context overflow;
// if evaluation itself fails, every window of the step is reset.
void eval_windows(const std::vector<WindowStep>& steps);

// The windows of a step locked together, in address order (so that overlapping steps cannot deadlock).
class StepLocks {
public:
    explicit StepLocks(std::vector<std::mutex*> mutexes);

private:
    std::vector<std::unique_lock<std::mutex>> locks_;
};

}  // namespace regolith
