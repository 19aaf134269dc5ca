// The architecture-neutral face of a model, what generation, sessions and the Python layer use: a window
// (one inference context) takes token ids and gives logits. Every architecture's window implements it.
#pragma once

#include <cstdint>

namespace regolith {

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
    // Keep the first n tokens and forget the rest (0 <= n <= n_past). Returns false, changing nothing, when
    // the architecture's state cannot be cut back (recurrent layers keep no history); callers then reset
    // and evaluate the kept tokens again.
    virtual bool truncate(int64_t n) = 0;
};

}  // namespace regolith
