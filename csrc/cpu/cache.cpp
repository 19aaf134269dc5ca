// Attention caches in their storage types (Backend::store_rows): storing f32 rows and reading them back.
#include <cstring>

#include "core/dequant.h"
#include "core/quantize.h"
#include "cpu/kernels.h"

namespace regolith::cpu {

void store_row(const float* x, const Rows& dst, const Rows& scale, int64_t r) {
    if (dst.type == RG_TYPE_I8)
        *scale.row(r) = quantize_i8_row(x, dst.row<int8_t>(r), dst.cols);
    else if (dst.type == RG_TYPE_F32)
        std::memcpy(dst.row(r), x, size_t(dst.cols) * sizeof(float));
    else
        quantize_row(dst.type, x, dst.row<uint8_t>(r), dst.cols);  // F16, Q8_0
}

void store_rows(const Rows& x, const Rows& dst, const Rows& scale) {
    for_rows(x.rows, x.cols, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) store_row(x.row(r), dst, scale, r);
    });
}

const float* cache_row(const Rows& t, const Rows& scale, int64_t r, float* buf) {
    if (t.type == RG_TYPE_F32) return t.row(r);
    if (t.type == RG_TYPE_I8) {
        const int8_t* q = t.row<int8_t>(r);
        const float s = *scale.row(r);
        for (int64_t i = 0; i < t.cols; ++i) buf[i] = float(q[i]) * s;
    } else {
        dequantize_row(t.type, t.row<uint8_t>(r), buf, t.cols);  // F16, Q8_0
    }
    return buf;
}

}  // namespace regolith::cpu
