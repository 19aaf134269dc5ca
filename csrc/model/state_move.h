// Suffix cache reuse's move of cached rows to new positions (ModelWindow::append_moved), the pieces every
// cache's move_state shares: a saved state and a destination seen as the packed items of a cache's
// state_tensors, and a key row turned by a RoPE shift.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/window_state.h"

namespace regolith {

// A saved state's items (`saved`: the bytes of state_tensors(0, total), packed in order) and a packed copy of
// the destination's (the items of state_tensors(to, to + n), scattered over HostStateParts' spans, split
// anyhow, by scatter()). Throws Error naming `what` when a size does not match the layout.
class MovedItems {
public:
    MovedItems(const uint8_t* saved, size_t saved_bytes, const std::vector<size_t>& from_bytes,
               const std::vector<size_t>& to_bytes, const std::vector<StateSpan>& dst, const std::string& what);
    const uint8_t* in(size_t i) const { return in_[i]; }
    uint8_t* out(size_t i) { return out_[i]; }
    // Copies the destination items into the spans given to the constructor.
    void scatter() const;

private:
    std::vector<const uint8_t*> in_;
    std::vector<uint8_t> packed_;
    std::vector<uint8_t*> out_;
    const std::vector<StateSpan>& dst_;
};

// The turn of every rotary pair j by shift * freq[j] radians (computed in double).
struct RopeShift {
    RopeShift(const std::vector<float>& freq, int64_t shift);
    std::vector<float> cos, sin;
};

// A cache row of d key values in `type` (F32, F16, Q8_0, or I8 with its scale `*src_scale`) turned by `r`
// (the NEOX pairs (j, j + r.cos.size()) of its leading dims) and stored again in `type` at dst (an I8 row's
// new scale in *dst_scale). buf: d floats of scratch.
void move_key_row(uint32_t type, const uint8_t* src, const float* src_scale, uint8_t* dst, float* dst_scale,
                  int64_t d, const RopeShift& r, float* buf);

// The part of `saved` (append_moved's) of this kind and layer: one contiguous span of `dtype` (Error
// otherwise, also when it has none).
const StatePart& saved_part(const std::vector<StatePart>& saved, StateKind kind, uint32_t layer, StateDtype dtype);

// The checks of a move of tokens [src, src + n) of a saved state of `total` onto a window holding n_past of
// max_ctx (Error otherwise: bad ranges, a context overflow).
void check_move(int64_t total, int64_t src, int64_t n, int64_t n_past, int64_t max_ctx);

}  // namespace regolith
