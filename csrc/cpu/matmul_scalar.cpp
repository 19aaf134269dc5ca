// Portable kernels: plain C++, no intrinsics. Always built; the reference the SIMD kernels are tested against.
#include <cstdint>

#include "core/half.h"
#include "cpu/matmul_impl.h"

namespace regolith::cpu {
namespace {

struct SimdScalar {
    using Acc = float;
    static Acc zero() { return 0.0f; }
    static float hsum(Acc a) { return a; }
    using W = const int8_t*;
    static W load_w(const int8_t* w) { return w; }
    using X = const int8_t*;
    static X load_x(const int8_t* x) { return x; }
    template <bool SPLIT>
    static void dot32x(W w, X x, float s_lo, float s_hi, Acc& acc) {
        dot32<SPLIT>(w, x, s_lo, s_hi, acc);
    }
    template <bool SPLIT>
    static void dot32(W w, const int8_t* x, float s_lo, float s_hi, Acc& acc) {
        int32_t lo = 0, hi = 0;
        for (int i = 0; i < 16; ++i) lo += int32_t(w[i]) * x[i];
        for (int i = 16; i < 32; ++i) hi += int32_t(w[i]) * x[i];
        acc += s_lo * float(lo) + s_hi * float(hi);
    }
    using IAcc = int32_t;
    struct IScale {
        int16_t lo, hi;
    };
    static IAcc izero() { return 0; }
    template <bool SPLIT>
    static IScale iscale(int16_t s_lo, int16_t s_hi) { return {s_lo, s_hi}; }
    template <bool UNSIGNED>
    static void idot32(W w, const int8_t* x, const IScale& s, IAcc& acc) {
        int32_t lo = 0, hi = 0;
        for (int i = 0; i < 16; ++i) lo += int32_t(w[i]) * x[i];
        for (int i = 16; i < 32; ++i) hi += int32_t(w[i]) * x[i];
        acc += lo * s.lo + hi * s.hi;
    }
    static void iflush(IAcc ia, float scale, Acc& acc) { acc += float(ia) * scale; }
    static void quantize_activations(const float* x, int64_t n, int block, int8_t* q, float* d, float* s) {
        cpu::quantize_activations(x, n, block, q, d, s);
    }
    static float dot_f32(const float* w, const float* x, int64_t n) {
        // 8 partial sums: same association as an 8-lane vector kernel, and faster than one serial chain.
        float s[8] = {};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; ++k) s[k] += w[i + k] * x[i + k];
        for (; i < n; ++i) s[0] += w[i] * x[i];
        return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    }
    static void dot_f32x4(const float* w, const float* x, int64_t stride, int64_t n, float* out) {
        for (int t = 0; t < 4; ++t) out[t] = dot_f32(w, x + t * stride, n);
    }
    static void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
        for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
    }
    static void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
        for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(src[i]);
    }
};

}  // namespace

const KernelTable& kernels_scalar() {
    static const KernelTable table = make_kernel_table<SimdScalar>();
    return table;
}

}  // namespace regolith::cpu
