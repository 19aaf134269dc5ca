// arm64 kernels: NEON (baseline on every arm64 CPU); the dot-product extension is used when compiled in,
// which matmul_neondot.cpp does for CPUs that report it at run time (a second kernel table, RG_NEON_TABLE).
#include <arm_neon.h>

#include <cstdint>

#include "cpu/matmul_impl.h"

namespace regolith::cpu {
namespace {

struct SimdNeon {
    using Acc = float32x4_t;
    static Acc zero() { return vdupq_n_f32(0.0f); }
    static float hsum(Acc a) { return vaddvq_f32(a); }
    static int32x4_t dot16(int8x16_t w, int8x16_t x) {
#if defined(__ARM_FEATURE_DOTPROD)
        return vdotq_s32(vdupq_n_s32(0), w, x);
#else
        // int16 pair sums cannot overflow: |x| <= 127 and |w| <= 128.
        int16x8_t p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
        p = vmlal_s8(p, vget_high_s8(w), vget_high_s8(x));
        return vpaddlq_s16(p);
#endif
    }
    using W = int8x16x2_t;
    static W load_w(const int8_t* w) { return vld1q_s8_x2(w); }
    using X = int8x16x2_t;
    static X load_x(const int8_t* x) { return vld1q_s8_x2(x); }
    template <bool SPLIT>
    static void dot32(const W& w, const int8_t* x, float s_lo, float s_hi, Acc& acc) {
        dot32x<SPLIT>(w, load_x(x), s_lo, s_hi, acc);
    }
    template <bool SPLIT>
    static void dot32x(const W& w, const X& x, float s_lo, float s_hi, Acc& acc) {
        const int32x4_t lo = dot16(w.val[0], x.val[0]);
        const int32x4_t hi = dot16(w.val[1], x.val[1]);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(lo), s_lo);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(hi), s_hi);
    }
    using IAcc = int32x4_t;
    struct IScale {
        int32_t lo, hi;
    };
    static IAcc izero() { return vdupq_n_s32(0); }
    template <bool SPLIT>
    static IScale iscale(int16_t s_lo, int16_t s_hi) { return {s_lo, s_hi}; }
    template <bool UNSIGNED>
    static void idot32(const W& w, const int8_t* x, const IScale& s, IAcc& acc) {
        acc = vmlaq_n_s32(acc, dot16(w.val[0], vld1q_s8(x)), s.lo);
        acc = vmlaq_n_s32(acc, dot16(w.val[1], vld1q_s8(x + 16)), s.hi);
    }
    static void iflush(const IAcc& ia, float scale, Acc& acc) { acc = vfmaq_n_f32(acc, vcvtq_f32_s32(ia), scale); }
    static void quantize_activations(const float* x, int64_t n, int block, int8_t* q, float* d, float* s) {
        cpu::quantize_activations(x, n, block, q, d, s);
    }
    static float dot_f32(const float* w, const float* x, int64_t n) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
            a1 = vfmaq_f32(a1, vld1q_f32(w + i + 4), vld1q_f32(x + i + 4));
        }
        float s = vaddvq_f32(vaddq_f32(a0, a1));
        for (; i < n; ++i) s += w[i] * x[i];
        return s;
    }
    static void dot_f32x4(const float* w, const float* x, int64_t stride, int64_t n, float* out) {
        for (int t = 0; t < 4; ++t) out[t] = dot_f32(w, x + t * stride, n);
    }
    static void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
        for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
    }
    static void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(src + i), 16)));
        for (; i < n; ++i) dst[i] = bf16_to_fp32(src[i]);
    }
};

}  // namespace

#ifndef RG_NEON_TABLE
#define RG_NEON_TABLE kernels_neon
#endif

const KernelTable& RG_NEON_TABLE() {
    static const KernelTable table = make_kernel_table<SimdNeon>();
    return table;
}

}  // namespace regolith::cpu
