#include "model/window_state.h"

#include "core/errors.h"
#include "core/types.h"

namespace regolith {

StateDtype qsa_state_dtype(uint32_t cache_type) {
    switch (cache_type) {
        case RG_TYPE_F16:
            return StateDtype::F16;
        case RG_TYPE_Q8_0:
            return StateDtype::Q8_0;
        case RG_TYPE_I8:
            return StateDtype::I8;
        default:
            return StateDtype::Mixed;
    }
}

StateDtype kv_state_dtype(uint32_t cache_type) {
    const StateDtype d = qsa_state_dtype(cache_type);
    return d == StateDtype::Mixed ? StateDtype::F32 : d;
}

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

HostStateParts::HostStateParts(Backend& be, const std::vector<TensorPart>& parts) : be_(be) {
    size_t n_staged = 0, n_tensors = 0;
    for (const TensorPart& p : parts)
        for (const StateItem& it : p.items) {
            n_tensors += bool(it.tensor);
            n_staged += it.tensor && !be.host_address(it.tensor.buffer);
        }
    staged_.reserve(n_staged);  // spans point into the staged bytes: they must not move
    for (const TensorPart& p : parts) {
        StatePart& h = host_.emplace_back(StatePart{p.kind, p.layer, p.dtype, {}});
        for (const StateItem& it : p.items) {
            if (!it.tensor) {
                h.spans.push_back(it.host);
                continue;
            }
            const Tensor& t = it.tensor;
            const size_t row = size_t(type_row_bytes(*type_traits(t.type), t.cols));
            if (auto* base = static_cast<uint8_t*>(be.host_address(t.buffer))) {
                if (t.rows > 0 && (t.rows == 1 || t.row_bytes == int64_t(row)))
                    h.spans.push_back({base + t.offset, row * size_t(t.rows)});
                else
                    for (int64_t r = 0; r < t.rows; ++r) h.spans.push_back({base + t.offset + uint64_t(r * t.row_bytes), row});
                continue;
            }
            Staged& st = staged_.emplace_back(Staged{t, std::vector<uint8_t>(row * size_t(t.rows))});
            h.spans.push_back({st.bytes.data(), st.bytes.size()});
        }
    }
    // Spans in place are read (a save) or written (a restore) by the host from here on: the ops recorded
    // before must have run (a GPU with unified memory may still be running them).
    if (staged_.size() < n_tensors) be.synchronize();
}

void HostStateParts::download() {
    for (Staged& s : staged_) be_.read(s.tensor, s.bytes.data());
}

void HostStateParts::upload() {
    for (Staged& s : staged_) be_.write(s.tensor, s.bytes.data());
    be_.submit();
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
