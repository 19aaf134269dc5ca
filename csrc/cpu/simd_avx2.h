// The AVX2 + FMA + F16C kernel primitives (matmul_impl.h's Simd interface), in a header so that the AVX-512
// file can build on them: included only by kernel files compiled with at least -mavx2 -mfma -mf16c -mbmi2.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/codes_avx2.h"
#include "cpu/matmul_impl.h"

namespace regolith::cpu {
namespace {

struct SimdAvx2 {
    using Acc = __m256;
    static Acc zero() { return _mm256_setzero_ps(); }
    static float hsum(Acc a) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    struct W {
        __m256i w, abs;
    };
    using Raw = __m256i;
    template <uint32_t TYPE>
    using Codes = Avx2Codes<TYPE>;
    static W make_w(__m256i v) { return {v, _mm256_sign_epi8(v, v)}; }
    static void store_raw(int8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
    static W load_w(const int8_t* w) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        return {v, _mm256_sign_epi8(v, v)};
    }
    using X = __m256i;
    static X load_x(const int8_t* x) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)); }
    template <bool SPLIT>
    static void dot32(const W& w, const int8_t* x, float s_lo, float s_hi, Acc& acc) {
        dot32x<SPLIT>(w, load_x(x), s_lo, s_hi, acc);
    }
    template <bool SPLIT>
    static void dot32x(const W& w, const X& xv, float s_lo, float s_hi, Acc& acc) {
        // |w| (unsigned) * sign(w)*x (signed): pair sums stay within int16 since |x| <= 127.
        const __m256i p = _mm256_maddubs_epi16(w.abs, _mm256_sign_epi8(xv, w.w));
        const __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));  // lanes 0-3: elements 0-15
        const __m256 scale = SPLIT ? _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s_lo)), _mm_set1_ps(s_hi), 1)
                                   : _mm256_set1_ps(s_lo);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc);
    }
    using IAcc = __m256i;
    using IScale = __m256i;  // int16 multipliers for the 16 pair sums: 8 x s_lo (elements 0-15), 8 x s_hi
    static IAcc izero() { return _mm256_setzero_si256(); }
    template <bool SPLIT>
    static IScale iscale(int16_t s_lo, int16_t s_hi) {
        if (!SPLIT) return _mm256_set1_epi16(s_lo);
        return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(s_lo)), _mm_set1_epi16(s_hi), 1);
    }
    template <bool UNSIGNED>
    static void idot32(const W& w, const int8_t* x, const IScale& s, IAcc& acc) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
        // codes >= 0 are their own magnitude, and x needs no sign where w is 0 (the product is 0 either way)
        const __m256i p =
            UNSIGNED ? _mm256_maddubs_epi16(w.w, xv) : _mm256_maddubs_epi16(w.abs, _mm256_sign_epi8(xv, w.w));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
        // one running sum per token: GCC would otherwise reassociate a half block's 4 chunks x 8 tokens into
        // a tree of partial sums and spill them (the prefill tile ran 17% slower); the sign form keeps GCC's
        // order, which its decode kernels (Q6_K's) run faster with
        if constexpr (UNSIGNED) __asm__("" : "+x"(acc));
    }
    static void idot32_offset(const W& w, const uint8_t* xu, const IScale& s, IAcc& acc) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xu));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(xv, w.w), s));
        __asm__("" : "+x"(acc));  // as idot32
    }
    static void ioffset(const W& w, const IScale& s, IAcc& acc) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi8(char(0x80)), w.w);
        acc = _mm256_sub_epi32(acc, _mm256_madd_epi16(p, s));
    }
    static void iflush(const IAcc& ia, float scale, Acc& acc) {
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_set1_ps(scale), acc);
    }
    // cpu::quantize_activations with AVX2: the same float operations (amax, amax / 127, 1 / scale, x * inv,
    // round to nearest even), so the codes, scales and sums are identical.
    static void quantize_activations(const float* x, int64_t n, int block, int8_t* q, float* d, float* s) {
        const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        for (int64_t b = 0; b < n; b += block) {
            __m256 mx = _mm256_setzero_ps();
            for (int i = 0; i < block; i += 8)
                mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + b + i), abs_mask));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float amax = _mm_cvtss_f32(m4);
            const float scale = amax / 127.0f;
            const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
            const __m256 vinv = _mm256_set1_ps(inv);
            for (int i = 0; i < block; i += 32) {
                const float* p = x + b + i;
                const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), vinv));
                const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + 8), vinv));
                const __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + 16), vinv));
                const __m256i f = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + 24), vinv));
                // packs interleave 128-bit lanes: restore element order with one cross-lane permute
                const __m256i ac = _mm256_packs_epi32(a, c), ef = _mm256_packs_epi32(e, f);
                const __m256i bytes = _mm256_packs_epi16(ac, ef);
                const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b + i), ordered);
            }
            d[b / block] = scale;
        }
        cpu::activation_sums(q, d, n, block, s);
    }
    static void spread_pairs(const float* in, float* out) {
        const __m256 v = _mm256_loadu_ps(in);
        _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
        _mm256_storeu_ps(out + 8, _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
    }
    static float dot_f32(const float* w, const float* x, int64_t n) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        }
        float s = hsum(_mm256_add_ps(a0, a1));
        for (; i < n; ++i) s += w[i] * x[i];
        return s;
    }
    // dot_f32 of w with 4 rows of x (stride apart) at once: per row the very same operations, side by side
    // in registers (8 independent accumulators, w loaded once).
    static void dot_f32x4(const float* w, const float* x, int64_t stride, int64_t n, float* out) {
        __m256 a0[4], a1[4];
        for (int t = 0; t < 4; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            const __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
            for (int t = 0; t < 4; ++t) {
                a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * stride + i), a0[t]);
                a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * stride + i + 8), a1[t]);
            }
        }
        for (int t = 0; t < 4; ++t) {
            float s = hsum(_mm256_add_ps(a0[t], a1[t]));
            for (int64_t j = i; j < n; ++j) s += w[j] * x[t * stride + j];
            out[t] = s;
        }
    }
    // A 2-row x 3-token tile of dot_f32, split over column chunks: columns [c0, c1) (c0 and c1 multiples of
    // 16) of rows wa, wb against 3 rows of x (stride apart), added to the partial sums acc[r][t][16]
    // (dot_f32's two 8-lane accumulators, stored). Every weight vector feeds 3 tokens, every token vector
    // 2 rows; dot_f32_finish then completes each output bit for bit as dot_f32.
    static void dot_f32_2x3(const float* wa, const float* wb, const float* x, int64_t stride, int64_t c0,
                            int64_t c1, float* acc) {
        __m256 a[2][3][2];
        for (int r = 0; r < 2; ++r)
            for (int t = 0; t < 3; ++t)
                for (int h = 0; h < 2; ++h) a[r][t][h] = _mm256_loadu_ps(acc + (r * 3 + t) * 16 + 8 * h);
        for (int64_t i = c0; i < c1; i += 16) {
            for (int h = 0; h < 2; ++h) {
                const __m256 va = _mm256_loadu_ps(wa + i + 8 * h), vb = _mm256_loadu_ps(wb + i + 8 * h);
                for (int t = 0; t < 3; ++t) {
                    __m256 xv = _mm256_loadu_ps(x + t * stride + i + 8 * h);
                    // keep xv in a register: GCC would otherwise fold the load into both FMAs (16 loads
                    // per 12 FMAs instead of 10, and the tile is load-bound)
                    __asm__("" : "+x"(xv));
                    a[0][t][h] = _mm256_fmadd_ps(va, xv, a[0][t][h]);
                    a[1][t][h] = _mm256_fmadd_ps(vb, xv, a[1][t][h]);
                }
            }
        }
        for (int r = 0; r < 2; ++r)
            for (int t = 0; t < 3; ++t)
                for (int h = 0; h < 2; ++h) _mm256_storeu_ps(acc + (r * 3 + t) * 16 + 8 * h, a[r][t][h]);
    }
    // dot_f32(w, x, n) from its partial sums over the first n / 16 * 16 columns (as dot_f32_2x3 leaves them).
    static float dot_f32_finish(const float* acc, const float* w, const float* x, int64_t n) {
        float s = hsum(_mm256_add_ps(_mm256_loadu_ps(acc), _mm256_loadu_ps(acc + 8)));
        for (int64_t j = n / 16 * 16; j < n; ++j) s += w[j] * x[j];
        return s;
    }
    static void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
        for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
    }
    static void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        for (; i < n; ++i) dst[i] = bf16_to_fp32(src[i]);
    }
};

// SimdAvx2 with the float-scale types' byte products through a VNNI vpdpbusd: V::dpbusd(u, s) sums four
// unsigned x signed byte products into each int32 lane, the lanes vpmaddubsw + vpmaddwd(1) give (their int16
// pair sums cannot saturate: |w| <= 128, |x| <= 127), so the results are SimdAvx2's bit for bit. V is the
// instruction's encoding: AVX-VNNI's (VEX) or AVX-512 VNNI's (EVEX), each in the file compiled for it.
template <class V>
struct SimdAvx2Vnni : SimdAvx2 {
    template <bool SPLIT>
    static void dot32(const W& w, const int8_t* x, float s_lo, float s_hi, Acc& acc) {
        dot32x<SPLIT>(w, load_x(x), s_lo, s_hi, acc);
    }
    template <bool SPLIT>
    static void dot32x(const W& w, const X& xv, float s_lo, float s_hi, Acc& acc) {
        const __m256i s = V::dpbusd(w.abs, _mm256_sign_epi8(xv, w.w));
        const __m256 scale = SPLIT ? _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s_lo)), _mm_set1_ps(s_hi), 1)
                                   : _mm256_set1_ps(s_lo);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc);
    }
};

}  // namespace
}  // namespace regolith::cpu
