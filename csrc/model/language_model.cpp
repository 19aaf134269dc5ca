#include "model/language_model.h"

#include <algorithm>
#include <string>

#include "core/errors.h"

namespace regolith {

void eval_windows(const std::vector<WindowStep>& steps) {
    if (steps.empty()) return;
    for (const WindowStep& s : steps) {
        if (!s.window) throw Error("eval_windows: a step without a window");
        if (s.n < 0) throw Error("eval_windows: a negative token count");
        if (s.n > 0 && (!s.tokens || !s.logits)) throw Error("eval_windows: a step without its tokens or logits");
    }
    steps.front().window->eval_steps(steps);
}

void ModelWindow::refuse_moves() {
    throw Error("suffix cache reuse is not supported for this architecture (its windows keep pooled or "
                "per-layer history state)");
}

void ModelWindow::append_moved(const std::vector<StatePart>&, int64_t, int64_t, int64_t, const std::vector<int32_t>&) {
    refuse_moves();
}

StepLocks::StepLocks(std::vector<std::mutex*> mutexes) {
    std::sort(mutexes.begin(), mutexes.end());
    if (std::adjacent_find(mutexes.begin(), mutexes.end()) != mutexes.end())
        throw Error("a window is listed twice in one step");
    for (std::mutex* m : mutexes) locks_.emplace_back(*m);
}

}  // namespace regolith
