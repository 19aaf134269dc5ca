#include "model/window_state.h"

#include "core/errors.h"

namespace regolith {

std::string state_part_name(StateKind kind, uint32_t layer) {
    const std::string blk = "blk." + std::to_string(layer) + " ";
    switch (kind) {
        case StateKind::Kv:
            return blk + "kv";
        case StateKind::Qsa:
            return blk + "qsa";
        case StateKind::Gdn:
            return blk + "gdn";
        case StateKind::Ple:
            return blk + "ple";
        case StateKind::Logits:
            return "logits";
    }
    return "part kind " + std::to_string(uint32_t(kind)) + " layer " + std::to_string(layer);
}

void check_state_import(int64_t from, int64_t n, int64_t n_past, int64_t max_ctx) {
    if (from != n_past)
        throw StateError("the state continues the first " + std::to_string(from) +
                         " tokens; the window holds " + std::to_string(n_past));
    if (n < from || n > max_ctx)
        throw StateError("the state holds " + std::to_string(n) + " tokens; the window holds at most " +
                         std::to_string(max_ctx));
}

}  // namespace regolith
