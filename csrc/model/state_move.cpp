#include "model/state_move.h"

#include <cmath>
#include <cstring>

#include "core/dequant.h"
#include "core/errors.h"
#include "core/quant.h"
#include "core/quantize.h"

namespace regolith {

MovedItems::MovedItems(const uint8_t* saved, size_t saved_bytes, const std::vector<size_t>& from_bytes,
                       const std::vector<size_t>& to_bytes, const std::vector<StateSpan>& dst,
                       const std::string& what)
    : dst_(dst) {
    size_t at = 0;
    for (size_t b : from_bytes) in_.push_back(saved + at), at += b;
    if (at != saved_bytes) throw Error(what + ": a saved state that does not match its layout");
    size_t out_bytes = 0, dst_bytes = 0;
    for (size_t b : to_bytes) out_bytes += b;
    for (const StateSpan& sp : dst) dst_bytes += sp.bytes;
    if (dst_bytes != out_bytes) throw Error(what + ": destination spans that do not match its layout");
    packed_.assign(out_bytes, 0);
    at = 0;
    for (size_t b : to_bytes) out_.push_back(packed_.data() + at), at += b;
}

void MovedItems::scatter() const {
    size_t at = 0;
    for (const StateSpan& sp : dst_) std::memcpy(sp.data, packed_.data() + at, sp.bytes), at += sp.bytes;
}

RopeShift::RopeShift(const std::vector<float>& freq, int64_t shift) {
    for (float f : freq) {
        cos.push_back(float(std::cos(double(shift) * f)));
        sin.push_back(float(std::sin(double(shift) * f)));
    }
}

void move_key_row(uint32_t type, const uint8_t* src, const float* src_scale, uint8_t* dst, float* dst_scale,
                  int64_t d, const RopeShift& r, float* buf) {
    if (type == RG_TYPE_I8)
        for (int64_t e = 0; e < d; ++e) buf[e] = float(reinterpret_cast<const int8_t*>(src)[e]) * *src_scale;
    else
        dequantize_row(type, src, buf, d);  // F32, F16, Q8_0
    const int64_t half = int64_t(r.cos.size());
    for (int64_t j = 0; j < half; ++j) {
        const float a = buf[j], b = buf[j + half];
        buf[j] = a * r.cos[size_t(j)] - b * r.sin[size_t(j)];
        buf[j + half] = b * r.cos[size_t(j)] + a * r.sin[size_t(j)];
    }
    if (type == RG_TYPE_I8)
        *dst_scale = quantize_i8_row(buf, reinterpret_cast<int8_t*>(dst), d);
    else if (type == RG_TYPE_F32)
        std::memcpy(dst, buf, size_t(d) * sizeof(float));
    else
        quantize_row(type, buf, dst, d);
}

const StatePart& saved_part(const std::vector<StatePart>& saved, StateKind kind, uint32_t layer, StateDtype dtype) {
    for (const StatePart& p : saved)
        if (p.kind == kind && p.layer == layer) {
            if (p.dtype != dtype || p.spans.size() != 1)
                throw Error("window: a saved state of another layout or cache type");
            return p;
        }
    throw Error("window: the saved state has no " + state_part_name(kind, layer));
}

void check_move(int64_t total, int64_t src, int64_t n, int64_t n_past, int64_t max_ctx) {
    if (src < 0 || n < 0 || total < 0 || src + n > total)
        throw Error("window: cannot move tokens [" + std::to_string(src) + ", " + std::to_string(src + n) +
                    ") of a state of " + std::to_string(total));
    if (n_past + n > max_ctx)
        throw Error("context overflow: " + std::to_string(n_past) + " + " + std::to_string(n) +
                    " moved tokens exceed the window's " + std::to_string(max_ctx));
}

}  // namespace regolith
