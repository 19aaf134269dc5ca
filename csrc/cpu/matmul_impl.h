// Kernel templates shared by every ISA; included once per ISA translation unit with its Simd type:
//
//   struct Simd {
//       using Acc = ...;                       // a float accumulator (scalar float or a vector register)
//       static Acc zero();
//       static float hsum(Acc);
//       using W = ...;                         // 32 weight codes loaded once, reused for several tokens
//       static W load_w(const int8_t* w);
//       // acc += s_lo * dot(w[0:16], x[0:16]) + s_hi * dot(w[16:32], x[16:32])   (int8 codes);
//       // SPLIT is false when s_lo == s_hi (32-element scale groups).
//       template <bool SPLIT> static void dot32(const W& w, const int8_t* x, float s_lo, float s_hi, Acc& acc);
//       // Optional, two rows at once (the float-scale prefill tile): Acc2 holds row a's Acc and row b's,
//       //   W2 = load_w2(wa, wb) (or make_w2(raw_a, raw_b)); Acc2 ws = scales2(sa_lo, sa_hi, sb_lo, sb_hi);
//       //   dot32x2(w2, x, ws, d, acc2) is dot32x for each row with scales (s * d), the same per lane;
//       //   lo(acc2) / hi(acc2) give back each row's Acc; zero2().
//       // Optional, the integer-scale products of two rows at once (prefill panels), each row's lanes as
//       //   idot32's: IAcc2, IW2 = load_iw2(wa, wb), IScale2 = iscale2(sa_lo, sa_hi, sb_lo, sb_hi),
//       //   izero2(), idot32x2<UNSIGNED>, idot32_offset2, ioffset2 (as the one-row forms),
//       //   iflush2(ia2, scale_a, scale_b, acc2) (iflush per row).
//       // Optional, two chunks of one row per integer-scale step (simd_has_chunk_pairs below).
//       // Integer-scale path (256-element blocks with IntScales): int32 lanes, int16 sub-scales.
//       using IAcc = ...;  using IScale = ...;
//       static IAcc izero();
//       template <bool SPLIT> static IScale iscale(int16_t s_lo, int16_t s_hi);
//       // acc += s_lo * (w[0:16] . x[0:16]) + s_hi * (w[16:32] . x[16:32]) in int32 lanes
//       // (UNSIGNED: the codes are >= 0, which the ISA may exploit; the sums are the same)
//       template <bool UNSIGNED> static void idot32(const W& w, const int8_t* x, const IScale& s, IAcc& acc);
//       static void iflush(const IAcc& ia, float scale, Acc& acc);   // acc += float(ia) * scale
//       // Optional (an unsigned x signed byte product, AVX2's maddubs): the same lanes from x + 128,
//       //   acc += s_lo * (w[0:16] . xu[0:16]) + s_hi * (w[16:32] . xu[16:32])   (|w| <= 64),
//       // and the offset's share of them, acc -= (the same for xu = 128).
//       static void idot32_offset(const W& w, const uint8_t* xu, const IScale& s, IAcc& acc);
//       static void ioffset(const W& w, const IScale& s, IAcc& acc);
//       static void quantize_activations(...);  // as cpu::quantize_activations, bit for bit
//       static float dot_f32(const float* w, const float* x, int64_t n);
//       // out[t] = dot_f32(w, x + t * stride, n) for t < 4, bit for bit
//       static void dot_f32x4(const float* w, const float* x, int64_t stride, int64_t n, float* out);
//       static void f16_to_f32(const uint16_t* src, float* dst, int64_t n);
//       static void bf16_to_f32(const uint16_t* src, float* dst, int64_t n);
//   };
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/block_decode.h"
#include "core/block_int_scales.h"
#include "cpu/matmul.h"

namespace regolith::cpu {

// Does the ISA decode TYPE straight into registers (S::Codes<TYPE>, e.g. codes_avx2.h)?
template <class S, uint32_t TYPE, class = void>
struct simd_has_codes : std::false_type {};
template <class S, uint32_t TYPE>
struct simd_has_codes<S, TYPE, std::void_t<decltype(&S::template Codes<TYPE>::codes)>> : std::true_type {};

// Does the ISA decode two rows' blocks of TYPE (32 codes each) into one register (S::Codes<TYPE>::codes2(a, b),
// row a in the low lanes, for S::make_w2(that register))?
template <class S, uint32_t TYPE, class = void>
struct simd_has_codes2 : std::false_type {};
template <class S, uint32_t TYPE>
struct simd_has_codes2<S, TYPE, std::void_t<decltype(&S::template Codes<TYPE>::codes2)>> : std::true_type {};

// Does the ISA have a two-row form of dot32x (S::dot32x2: both rows' accumulators in one S::Acc2)?
template <class S, class = void>
struct simd_has_pair_dot : std::false_type {};
template <class S>
struct simd_has_pair_dot<S, std::void_t<decltype(&S::dot32x2)>> : std::true_type {};

// Does the ISA have two-row forms of the integer-scale products (S::idot32x2 and the rest, S::IAcc2)?
template <class S, class = void>
struct simd_has_pair_idot : std::false_type {};
template <class S>
struct simd_has_pair_idot<S, std::void_t<typename S::IAcc2>> : std::true_type {};

// Does the ISA copy 8 floats to 16 as pairs (S::spread_pairs(in, out): out[2i] = out[2i + 1] = in[i])? The
// loop form, compiled with AVX-512 enabled, became a chain of shuffles that cost Q4_K's one-token product
// a third of its speed.
template <class S, class = void>
struct simd_has_spread_pairs : std::false_type {};
template <class S>
struct simd_has_spread_pairs<S, std::void_t<decltype(&S::spread_pairs)>> : std::true_type {};

// Does the ISA take two 32-code chunks of one row per integer-scale step (S::make_iw2(raw_a, raw_b): chunk a
// in the low lanes of an IW2; S::idot64<UNSIGNED>(w, x, s, acc): idot32 of each chunk on x[0:32] / x[32:64]
// with the scales of S::iscale2, into an IAcc2; S::ifold(acc): the two halves added into one IAcc)? The
// int32 sums are idot32's, only added in another order, so the results are the same to the bit.
template <class S, class = void>
struct simd_has_chunk_pairs : std::false_type {};
template <class S>
struct simd_has_chunk_pairs<S, std::void_t<decltype(&S::make_iw2)>> : std::true_type {};

// Does the ISA have the offset form of the integer-scale product (S::idot32_offset)?
template <class S, class = void>
struct simd_has_offset_dot : std::false_type {};
template <class S>
struct simd_has_offset_dot<S, std::void_t<decltype(&S::idot32_offset)>> : std::true_type {};

// Asks for the cache lines prefetch_bytes past a weight block. One thread's demand loads alone keep too few
// lines in flight to stream from DRAM: measured on a Xeon (Sapphire Rapids class, 1 thread, 2048 x 4096
// matvec), Q8_0 went from 6.1 to 15 GB/s and Q4_K to 12.5 of the 17 GB/s one thread reads.
template <class Block>
inline void prefetch_weights(const Block* block) {
    for (size_t o = 0; o < sizeof(Block); o += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(block) + prefetch_bytes + o);
}

template <class S, class D>
struct QuantKernel {
    static constexpr int QK = D::QK, G = D::G, NG = QK / G;
    static_assert(G == 16 || G == 32, "scale groups must be 16 or 32 elements");
    static_assert(QK % 32 == 0, "blocks must cover whole 32-element activation blocks");
    // Types with integer sub-scales accumulate half a block (128 elements) in int32 and convert it to float
    // once, with their activations quantized per 128 elements. ggml's Q8_K takes one activation scale per
    // 256, set by the block's largest activation; halving the block costs one more int32-to-float flush per
    // block and cuts Gemma 3 270M's KL divergence from its float64 reference by a quarter (docs/fidelity.md).
    static constexpr bool INT = has_int_scales<D::TYPE>::value;
    static constexpr int AB = INT ? 128 : 32;
    static_assert(!INT || QK == 256, "integer sub-scales are for 256-element blocks");
    // Affine types (scale * q + bias) have codes 0 .. 2^bits - 1.
    static constexpr bool UCODES = D::HAS_BIAS;
    // Signed codes of at most 64 in magnitude (Q3_K: -4..3, Q6_K: -32..31) take the offset form where the
    // ISA has it: the activations as x + 128 need no sign fix-up per token and chunk, and the offset's
    // share, 128 * (w . 1) per lane, is taken once per row and half block (the int32 sums are the same).
    // The float-scale types' two-row prefill tiles (S::dot32x2) read the offset form too: vpdpbusd sums four
    // byte products straight into int32, so any signed code fits.
    static constexpr bool OFFSET = (INT && simd_has_offset_dot<S>::value &&
                                    (D::TYPE == RG_TYPE_Q3_K || D::TYPE == RG_TYPE_Q6_K)) ||
                                   (!INT && simd_has_pair_dot<S>::value);

    // Tokens [t0, t1) (at most kMaxTok) as the integer-scale products read them: codes (xq, or xu for the
    // offset form) stride apart, and the activation scales transposed, xdt[block * kMaxTok + token], so that
    // a half block's scales of every token are contiguous. Empty for the float-scale types.
    struct TokenGroup {
        const void* x;
        int64_t stride;
        const float* xdt;
    };

    static TokenGroup group(const MatmulArgs& a, const Scratch& s, int64_t t0, int64_t t1) {
        if constexpr (INT) {
            const int64_t nxb = a.cols / AB;
            for (int64_t t = 0; t < t1 - t0; ++t)
                for (int64_t xb = 0; xb < nxb; ++xb) s.xdt[xb * kMaxTok + t] = a.xd[(t0 + t) * nxb + xb];
            if constexpr (OFFSET) return {a.xu + t0 * a.cols, a.cols, s.xdt};
            return {a.xq + t0 * a.cols, a.cols, s.xdt};
        }
        return {};
    }

    // Decoded row: int8 codes plus per-group scale (and bias) for every block.
    struct DecodedRow {
        int8_t* q;
        float* scale;
        float* bias;
        int16_t* isc;
        float* dsuper;
    };

    static void decode_row(const typename D::Block* blocks, int64_t nb, DecodedRow out) {
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_weights(blocks + b);
            float bias[NG];
            if constexpr (simd_has_codes<S, D::TYPE>::value) {
                // the ISA's register decoder (same codes), stored to the panel; its scales are integer
                // sub-scales (INT types) or one float for the whole block
                using P = typename S::template Codes<D::TYPE>;
                typename S::Raw raw[QK / 32];
                const float ds = P::scales(blocks[b], out.isc + b * NG, bias);
                P::codes(blocks[b], raw);
                for (int k = 0; k < QK / 32; ++k) S::store_raw(out.q + b * QK + 32 * k, raw[k]);
                if constexpr (INT)
                    out.dsuper[b] = ds;
                else
                    for (int g = 0; g < NG; ++g) out.scale[b * NG + g] = ds;
            } else {
                D::decode(blocks[b], out.q + b * QK, out.scale + b * NG, bias);
                if constexpr (INT) out.dsuper[b] = IntScales<D::TYPE>::get(blocks[b], out.isc + b * NG);
            }
            if constexpr (D::HAS_BIAS) spread_bias(bias, out.bias + b * (QK / 16));
        }
    }

    // Block biases per scale group -> one per 16 elements (the granularity of the activation sums xs).
    static void spread_bias(const float* bias, float* bias16) {
        if constexpr (QK == 256 && G == 32 && simd_has_spread_pairs<S>::value)
            S::spread_pairs(bias, bias16);
        else
            for (int i = 0; i < QK / 16; ++i) bias16[i] = bias[i * 16 / G];
    }

    // sum_c bias(c) * x[t][c] over the row: the per-16 biases dotted with the activation sums. Every path
    // (decode, prefill, fused) computes it by this one call, so they agree bit for bit.
    static float bias_dot(const float* bias16, const MatmulArgs& a, int64_t t) {
        return S::dot_f32(bias16, a.xs + t * (a.cols / 16), a.cols / 16);
    }

    // Integer-scale form of dot_row: per half block and token, int32 lanes accumulate isc * (q . x) over 4
    // chunks, then one float multiply-add by dsuper * (the half block's activation scale).
    template <int NT>
    static void dot_row_int(const DecodedRow& r, const TokenGroup& g, int64_t cols, typename S::Acc* acc) {
        for (int64_t b = 0; b < cols / QK; ++b) {
            for (int h = 0; h < QK / AB; ++h) {
                typename S::IAcc ia[NT];
                if constexpr (OFFSET) {
                    typename S::IAcc off = S::izero();
                    for (int k = 0; k < AB / 32; ++k) {
                        const int64_t c = b * QK + h * AB + 32 * k;
                        S::ioffset(S::load_w(r.q + c), iscale_at(r, c), off);
                    }
                    for (int t = 0; t < NT; ++t) ia[t] = off;
                } else {
                    for (int t = 0; t < NT; ++t) ia[t] = S::izero();
                }
                for (int k = 0; k < AB / 32; ++k) {
                    const int64_t c = b * QK + h * AB + 32 * k;
                    const typename S::W w = S::load_w(r.q + c);
                    const typename S::IScale sv = iscale_at(r, c);
                    for (int t = 0; t < NT; ++t) {
                        const int64_t at = t * g.stride + c;
                        if constexpr (OFFSET)
                            S::idot32_offset(w, static_cast<const uint8_t*>(g.x) + at, sv, ia[t]);
                        else
                            S::template idot32<UCODES>(w, static_cast<const int8_t*>(g.x) + at, sv, ia[t]);
                    }
                }
                const float* xd = g.xdt + (b * QK / AB + h) * kMaxTok;
                float sc[kMaxTok];  // entries past NT unused
                for (int t = 0; t < kMaxTok; ++t) sc[t] = r.dsuper[b] * xd[t];
                for (int t = 0; t < NT; ++t) S::iflush(ia[t], sc[t], acc[t]);
            }
        }
    }

    // dot_row_int for two rows at once where the ISA has the pair forms (S::IAcc2): each row's lanes hold
    // what dot_row_int's do, and each row's float steps are dot_row_int's.
    template <int NT>
    static void dot_rows2_int(const DecodedRow& ra, const DecodedRow& rb, const MatmulArgs& a, const TokenGroup& g,
                              int64_t t0, float* oa, float* ob) {
        typename S::Acc2 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = S::zero2();
        for (int64_t b = 0; b < a.cols / QK; ++b) {
            for (int h = 0; h < QK / AB; ++h) {
                typename S::IAcc2 ia[NT];
                typename S::IAcc2 off = S::izero2();
                if constexpr (OFFSET)
                    for (int k = 0; k < AB / 32; ++k) {
                        const int64_t c = b * QK + h * AB + 32 * k;
                        S::ioffset2(S::load_iw2(ra.q + c, rb.q + c), iscale2_at(ra, rb, c), off);
                    }
                for (int t = 0; t < NT; ++t) ia[t] = off;
                for (int k = 0; k < AB / 32; ++k) {
                    const int64_t c = b * QK + h * AB + 32 * k;
                    const typename S::IW2 w = S::load_iw2(ra.q + c, rb.q + c);
                    const typename S::IScale2 sv = iscale2_at(ra, rb, c);
                    for (int t = 0; t < NT; ++t) {
                        const int64_t at = t * g.stride + c;
                        if constexpr (OFFSET)
                            S::idot32_offset2(w, static_cast<const uint8_t*>(g.x) + at, sv, ia[t]);
                        else
                            S::template idot32x2<UCODES>(w, static_cast<const int8_t*>(g.x) + at, sv, ia[t]);
                    }
                }
                const float* xd = g.xdt + (b * QK / AB + h) * kMaxTok;
                for (int t = 0; t < NT; ++t) S::iflush2(ia[t], ra.dsuper[b] * xd[t], rb.dsuper[b] * xd[t], acc[t]);
            }
        }
        for (int t = 0; t < NT; ++t) {
            oa[t] = S::hsum(S::lo(acc[t])) + row_bias(ra, a, t0 + t);
            ob[t] = S::hsum(S::hi(acc[t])) + row_bias(rb, a, t0 + t);
        }
    }

    static auto iscale2_at(const DecodedRow& ra, const DecodedRow& rb, int64_t c) {
        const int64_t g = c / G, g2 = G == 16 ? g + 1 : g;
        return S::iscale2(ra.isc[g], ra.isc[g2], rb.isc[g], rb.isc[g2]);
    }

    // Rows r, r + 1 (decoded) against tokens [t0, t1), writing y.
    static void dot_tokens2_int(const DecodedRow& ra, const DecodedRow& rb, const MatmulArgs& a, const TokenGroup& g,
                                int64_t r, int64_t t0, int64_t t1) {
        float oa[kMaxTok], ob[kMaxTok];
        const int nt = int(t1 - t0);
        switch (nt) {
            case 1: dot_rows2_int<1>(ra, rb, a, g, t0, oa, ob); break;
            case 2: dot_rows2_int<2>(ra, rb, a, g, t0, oa, ob); break;
            case 3: dot_rows2_int<3>(ra, rb, a, g, t0, oa, ob); break;
            case 4: dot_rows2_int<4>(ra, rb, a, g, t0, oa, ob); break;
            case 5: dot_rows2_int<5>(ra, rb, a, g, t0, oa, ob); break;
            case 6: dot_rows2_int<6>(ra, rb, a, g, t0, oa, ob); break;
            case 7: dot_rows2_int<7>(ra, rb, a, g, t0, oa, ob); break;
            default: dot_rows2_int<8>(ra, rb, a, g, t0, oa, ob); break;
        }
        for (int t = 0; t < nt; ++t) {
            a.y[(t0 + t) * a.rows + r] = oa[t];
            a.y[(t0 + t) * a.rows + r + 1] = ob[t];
        }
    }

    static typename S::IScale iscale_at(const DecodedRow& r, int64_t c) {
        const int64_t g = c / G;
        return S::template iscale<G == 16>(r.isc[g], r.isc[G == 16 ? g + 1 : g]);
    }

    // Float-scale form: each 32-code chunk is scaled by (weight scale * activation scale) in float.
    template <int NT>
    static void dot_row_float(const DecodedRow& r, const MatmulArgs& a, int64_t t0, typename S::Acc* acc) {
        const int64_t cols = a.cols;
        for (int64_t c = 0; c < cols; c += 32) {
            const typename S::W w = S::load_w(r.q + c);
            const int64_t g = c / G;
            const float w_lo = r.scale[g], w_hi = G == 16 ? r.scale[g + 1] : w_lo;
            for (int t = 0; t < NT; ++t) {
                const float d = a.xd[(t0 + t) * (cols / 32) + c / 32];
                S::template dot32<G == 16>(w, a.xq + (t0 + t) * cols + c, w_lo * d, w_hi * d, acc[t]);
            }
        }
    }

    // NT tokens (t0 .. t0+NT) against one decoded row; each 32-code chunk of weights is loaded once and
    // used by all NT tokens. out[t] = sum over the row of scale*q*x (+ bias*sum(x)).
    template <int NT>
    static void dot_row(const DecodedRow& r, const MatmulArgs& a, const TokenGroup& g, int64_t t0,
                        float* out) {
        typename S::Acc acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = S::zero();
        if constexpr (INT) {
            dot_row_int<NT>(r, g, a.cols, acc);
        } else {
            dot_row_float<NT>(r, a, t0, acc);
        }
        for (int t = 0; t < NT; ++t) out[t] = S::hsum(acc[t]) + row_bias(r, a, t0 + t);
    }

    // Tokens [t0, t1) (at most kMaxTok; g: group(a, s, t0, t1)) against one decoded row, writing y[t][r].
    static void dot_tokens(const DecodedRow& row, const MatmulArgs& a, const TokenGroup& g, int64_t r,
                           int64_t t0, int64_t t1) {
        float out[kMaxTok];
        const int nt = int(t1 - t0);
        switch (nt) {
            case 1: dot_row<1>(row, a, g, t0, out); break;
            case 2: dot_row<2>(row, a, g, t0, out); break;
            case 3: dot_row<3>(row, a, g, t0, out); break;
            case 4: dot_row<4>(row, a, g, t0, out); break;
            case 5: dot_row<5>(row, a, g, t0, out); break;
            case 6: dot_row<6>(row, a, g, t0, out); break;
            case 7: dot_row<7>(row, a, g, t0, out); break;
            default: dot_row<8>(row, a, g, t0, out); break;
        }
        for (int t = 0; t < nt; ++t) a.y[(t0 + t) * a.rows + r] = out[t];
    }

    // Prefill tile of the float-scale path: 2 rows x NT tokens, each activation chunk loaded once for both
    // rows (2 * NT accumulators stay in registers).
    template <int NT>
    static void dot_rows2(const DecodedRow& ra, const DecodedRow& rb, const MatmulArgs& a, int64_t t0, float* oa,
                          float* ob) {
        const int64_t cols = a.cols;
        if constexpr (simd_has_pair_dot<S>::value) {
            // both rows' accumulators of a token side by side in one register: the same lanes, the same
            // operations per lane
            typename S::Acc2 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = S::zero2();
            for (int64_t c = 0; c < cols; c += 32) {
                const typename S::W2 w = S::load_w2(ra.q + c, rb.q + c);
                const int64_t g = c / G, g2 = G == 16 ? g + 1 : g;
                const typename S::Acc2 ws = S::scales2(ra.scale[g], ra.scale[g2], rb.scale[g], rb.scale[g2]);
                for (int t = 0; t < NT; ++t)
                    S::dot32x2(w, a.xu + (t0 + t) * cols + c, ws, a.xd[(t0 + t) * (cols / 32) + c / 32], acc[t]);
            }
            for (int t = 0; t < NT; ++t) {
                oa[t] = S::hsum(S::lo(acc[t])) + row_bias(ra, a, t0 + t);
                ob[t] = S::hsum(S::hi(acc[t])) + row_bias(rb, a, t0 + t);
            }
            return;
        }
        typename S::Acc acc_a[NT], acc_b[NT];
        for (int t = 0; t < NT; ++t) acc_a[t] = acc_b[t] = S::zero();
        for (int64_t c = 0; c < cols; c += 32) {
            const typename S::W wa = S::load_w(ra.q + c), wb = S::load_w(rb.q + c);
            const int64_t g = c / G, g2 = G == 16 ? g + 1 : g;
            for (int t = 0; t < NT; ++t) {
                const typename S::X xv = S::load_x(a.xq + (t0 + t) * cols + c);
                const float d = a.xd[(t0 + t) * (cols / 32) + c / 32];
                S::template dot32x<G == 16>(wa, xv, ra.scale[g] * d, ra.scale[g2] * d, acc_a[t]);
                S::template dot32x<G == 16>(wb, xv, rb.scale[g] * d, rb.scale[g2] * d, acc_b[t]);
            }
        }
        for (int t = 0; t < NT; ++t) {
            oa[t] = S::hsum(acc_a[t]) + row_bias(ra, a, t0 + t);
            ob[t] = S::hsum(acc_b[t]) + row_bias(rb, a, t0 + t);
        }
    }

    static float row_bias(const DecodedRow& r, const MatmulArgs& a, int64_t t) {
        if constexpr (D::HAS_BIAS)
            return bias_dot(r.bias, a, t);
        else
            return 0.0f;
    }

    // Panel rows [p0, p1) decoded in scratch, every token: 2-row x 4-token tiles where they fit.
    static void panel_tokens(const MatmulArgs& a, const Scratch& s, int64_t p0, int64_t p1) {
        const int64_t ng = a.cols / G;
        int64_t t0 = 0;
        if constexpr (!INT) {
            constexpr int NT = simd_has_pair_dot<S>::value ? 8 : 4;
            for (; t0 + NT <= a.ntok; t0 += NT) {
                int64_t r = p0;
                for (; r + 2 <= p1; r += 2) {
                    float oa[NT], ob[NT];
                    dot_rows2<NT>(row_at(s, r - p0, a.cols, ng), row_at(s, r + 1 - p0, a.cols, ng), a, t0, oa, ob);
                    for (int t = 0; t < NT; ++t) {
                        a.y[(t0 + t) * a.rows + r] = oa[t];
                        a.y[(t0 + t) * a.rows + r + 1] = ob[t];
                    }
                }
                for (; r < p1; ++r) dot_tokens(row_at(s, r - p0, a.cols, ng), a, {}, r, t0, t0 + NT);
            }
        }
        for (; t0 < a.ntok; t0 += kMaxTok) {
            const int64_t t1 = std::min(a.ntok, t0 + kMaxTok);
            const TokenGroup g = group(a, s, t0, t1);
            int64_t r = p0;
            if constexpr (INT && simd_has_pair_idot<S>::value)
                for (; r + 2 <= p1; r += 2)
                    dot_tokens2_int(row_at(s, r - p0, a.cols, ng), row_at(s, r + 1 - p0, a.cols, ng), a, g, r, t0, t1);
            for (; r < p1; ++r) dot_tokens(row_at(s, r - p0, a.cols, ng), a, g, r, t0, t1);
        }
    }

    // Kept out of line: FusedKernel::rows (and avx512's GridKernel, Q20Kernel) call it for prefill, and
    // inlined there by GCC 12 the AVX2 float-scale panels ran a fifth slower (Q4_0, Q5_0, Q8_0, 2048 x 2048
    // weights x 512 tokens on Zen 5: 93 against 120 GMAC/s; integer-scale types and AVX-512 unchanged).
    [[gnu::noinline]] static void rows(const MatmulArgs& a, int64_t r0, int64_t r1, const Scratch& s) {
        const int64_t nb = a.cols / QK, ng = a.cols / G;
        const int64_t panel = a.ntok > kMaxTok ? kPanelRows : 1;
        const TokenGroup g = panel > 1 ? TokenGroup{} : group(a, s, 0, a.ntok);
        for (int64_t p0 = r0; p0 < r1; p0 += panel) {
            const int64_t p1 = std::min(r1, p0 + panel);
            for (int64_t r = p0; r < p1; ++r) {
                const auto* blocks = reinterpret_cast<const typename D::Block*>(a.w + r * a.row_bytes);
                decode_row(blocks, nb, row_at(s, r - p0, a.cols, ng));
            }
            if (panel > 1)
                panel_tokens(a, s, p0, p1);
            else
                dot_tokens(row_at(s, 0, a.cols, ng), a, g, p0, 0, a.ntok);
        }
    }

    static DecodedRow row_at(const Scratch& s, int64_t i, int64_t cols, int64_t ng) {
        return {s.q + i * cols, s.scale + i * ng, s.bias + i * (cols / 16), s.isc + i * ng,
                s.dsuper + i * (cols / 256 + 1)};
    }
};

// Decode path (ntok <= kMaxTok) for types the ISA decodes into registers: no trip through scratch memory.
// Prefill falls back to QuantKernel's decoded panels.
template <class S, class D>
struct FusedKernel {
    using Q = QuantKernel<S, D>;
    using P = typename S::template Codes<D::TYPE>;
    static constexpr int QK = D::QK, G = D::G, NG = QK / G, NCH = QK / 32, AB = Q::AB;
    static constexpr bool UCODES = Q::UCODES;

    template <int NT>
    static void dot_row(const MatmulArgs& a, int64_t r, int64_t t0, float* bias16, float* out) {
        const int64_t cols = a.cols, nb = cols / QK;
        const auto* blocks = reinterpret_cast<const typename D::Block*>(a.w + r * a.row_bytes);
        typename S::Acc acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = S::zero();
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_weights(blocks + b);
            typename S::Raw raw[NCH];
            int16_t isc[NG];
            float bias[NG];
            const float ds = P::scales(blocks[b], isc, bias);
            P::codes(blocks[b], raw);
            if constexpr (Q::INT) {
                for (int h = 0; h < QK / AB; ++h) {
                    typename S::IAcc ia[NT];
                    if constexpr (simd_has_chunk_pairs<S>::value) {
                        static_assert(AB % 64 == 0, "whole chunk pairs per activation block");
                        typename S::IAcc2 ia2[NT];
                        for (int t = 0; t < NT; ++t) ia2[t] = S::izero2();
                        for (int k = h * AB / 32; k < (h + 1) * AB / 32; k += 2) {
                            const typename S::IW2 w = S::make_iw2(raw[k], raw[k + 1]);
                            const int g = 32 * k / G, g2 = 32 * (k + 1) / G;
                            const typename S::IScale2 sv = S::iscale2(isc[g], isc[G == 16 ? g + 1 : g], isc[g2],
                                                                      isc[G == 16 ? g2 + 1 : g2]);
                            for (int t = 0; t < NT; ++t) {
                                const int8_t* x = a.xq + (t0 + t) * cols + b * QK + 32 * k;
                                S::template idot64<UCODES>(w, x, sv, ia2[t]);
                            }
                        }
                        for (int t = 0; t < NT; ++t) ia[t] = S::ifold(ia2[t]);
                    } else {
                        for (int t = 0; t < NT; ++t) ia[t] = S::izero();
                        for (int k = h * AB / 32; k < (h + 1) * AB / 32; ++k) {
                            const typename S::W w = S::make_w(raw[k]);
                            const int g = 32 * k / G;
                            const typename S::IScale sv =
                                S::template iscale<G == 16>(isc[g], isc[G == 16 ? g + 1 : g]);
                            for (int t = 0; t < NT; ++t) {
                                const int8_t* x = a.xq + (t0 + t) * cols + b * QK + 32 * k;
                                S::template idot32<UCODES>(w, x, sv, ia[t]);
                            }
                        }
                    }
                    const int64_t xb = b * (QK / AB) + h;
                    for (int t = 0; t < NT; ++t) S::iflush(ia[t], ds * a.xd[(t0 + t) * (cols / AB) + xb], acc[t]);
                }
            } else {
                for (int k = 0; k < NCH; ++k) {
                    const typename S::W w = S::make_w(raw[k]);
                    const int64_t c = b * QK + 32 * k;
                    for (int t = 0; t < NT; ++t) {
                        const float d = ds * a.xd[(t0 + t) * (cols / 32) + c / 32];
                        S::template dot32<false>(w, a.xq + (t0 + t) * cols + c, d, d, acc[t]);
                    }
                }
            }
            if constexpr (D::HAS_BIAS) Q::spread_bias(bias, bias16 + b * (QK / 16));
        }
        for (int t = 0; t < NT; ++t) {
            out[t] = S::hsum(acc[t]);
            if constexpr (D::HAS_BIAS) out[t] += Q::bias_dot(bias16, a, t0 + t);
        }
    }

    // The float-scale types without biases (Q8_0, Q5_0) two rows at a time where the ISA has the prefill
    // tile's two-row product (S::dot32x2, activations in the offset form): both rows' codes in one register
    // meet each token's activations once. Each row's int32 lanes are dot32's and its float steps
    // (ds * xd, then one multiply-add per chunk, in chunk order) too, so the results are dot_row's to the bit.
    static constexpr bool PAIRS = !Q::INT && !D::HAS_BIAS && simd_has_pair_dot<S>::value;

    template <int NT>
    static void dot_rows2(const MatmulArgs& a, int64_t r, float* oa, float* ob) {
        const int64_t cols = a.cols, nb = cols / QK;
        const auto* ba = reinterpret_cast<const typename D::Block*>(a.w + r * a.row_bytes);
        const auto* bb = reinterpret_cast<const typename D::Block*>(a.w + (r + 1) * a.row_bytes);
        typename S::Acc2 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = S::zero2();
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_weights(ba + b);
            prefetch_weights(bb + b);
            typename S::Raw ra[NCH], rb[NCH];
            int16_t isc[NG];
            float bias[NG];
            const float da = P::scales(ba[b], isc, bias), db = P::scales(bb[b], isc, bias);
            constexpr bool BOTH = simd_has_codes2<S, D::TYPE>::value;
            static_assert(!BOTH || NCH == 1, "codes2 decodes one 32-code chunk of each row");
            if constexpr (!BOTH) {
                P::codes(ba[b], ra);
                P::codes(bb[b], rb);
            }
            const typename S::Acc2 ws = S::scales2(da, da, db, db);
            for (int k = 0; k < NCH; ++k) {
                typename S::W2 w;
                if constexpr (BOTH)
                    w = S::make_w2(P::codes2(ba[b], bb[b]));
                else
                    w = S::make_w2(ra[k], rb[k]);
                const int64_t c = b * QK + 32 * k;
                for (int t = 0; t < NT; ++t) S::dot32x2(w, a.xu + t * cols + c, ws, a.xd[t * (cols / 32) + c / 32], acc[t]);
            }
        }
        for (int t = 0; t < NT; ++t) {
            oa[t] = S::hsum(S::lo(acc[t]));
            ob[t] = S::hsum(S::hi(acc[t]));
        }
    }

    // f(std::integral_constant<int, ntok>) for ntok in 1 .. kMaxTok.
    template <class F>
    static void with_ntok(int64_t ntok, F&& f) {
        switch (ntok) {
            case 1: return f(std::integral_constant<int, 1>{});
            case 2: return f(std::integral_constant<int, 2>{});
            case 3: return f(std::integral_constant<int, 3>{});
            case 4: return f(std::integral_constant<int, 4>{});
            case 5: return f(std::integral_constant<int, 5>{});
            case 6: return f(std::integral_constant<int, 6>{});
            case 7: return f(std::integral_constant<int, 7>{});
            default: return f(std::integral_constant<int, 8>{});
        }
    }

    static void rows(const MatmulArgs& a, int64_t r0, int64_t r1, const Scratch& s) {
        if (a.ntok > kMaxTok) return Q::rows(a, r0, r1, s);
        with_ntok(a.ntok, [&](auto nt) {
            constexpr int NT = decltype(nt)::value;
            float out[NT], out2[NT];
            int64_t r = r0;
            if constexpr (PAIRS)
                for (; r + 2 <= r1; r += 2) {
                    dot_rows2<NT>(a, r, out, out2);
                    for (int t = 0; t < NT; ++t) {
                        a.y[t * a.rows + r] = out[t];
                        a.y[t * a.rows + r + 1] = out2[t];
                    }
                }
            for (; r < r1; ++r) {
                dot_row<NT>(a, r, 0, s.bias, out);
                for (int t = 0; t < NT; ++t) a.y[t * a.rows + r] = out[t];
            }
        });
    }
};

// Exact mode for quantized weights: each row dequantized to f32 (scale * q + bias, as dequantize does) and
// dotted with the float activations, so a quantized model computes what its dequantized twin does, up to
// float rounding (for tests that compare quantized files against a float reference).
template <class S, class D>
struct ExactKernel {
    static void rows(const MatmulArgs& a, int64_t r0, int64_t r1, const Scratch& s) {
        const int64_t nb = a.cols / D::QK;
        for (int64_t r = r0; r < r1; ++r) {
            const auto* blocks = reinterpret_cast<const typename D::Block*>(a.w + r * a.row_bytes);
            for (int64_t b = 0; b < nb; ++b) {
                D::decode(blocks[b], s.q, s.scale, s.bias);
                for (int i = 0; i < D::QK; ++i) {
                    const float v = s.scale[i / D::G] * float(s.q[i]);
                    s.row[b * D::QK + i] = D::HAS_BIAS ? v + s.bias[i / D::G] : v;
                }
            }
            for (int64_t t = 0; t < a.ntok; ++t) a.y[t * a.rows + r] = S::dot_f32(s.row, a.x + t * a.cols, a.cols);
        }
    }
};

// Does the ISA have a 2-row x 3-token float tile (S::dot_f32_2x3)?
template <class S, class = void>
struct simd_has_f32_tile : std::false_type {};
template <class S>
struct simd_has_f32_tile<S, std::void_t<decltype(&S::dot_f32_2x3)>> : std::true_type {};

// F32 / F16 / BF16 weights: rows converted to f32 once, then dotted with every token. Every output is
// S::dot_f32(row, token) bit for bit, whichever path (decode, prefill panel, tile) computes it.
template <class S, int TYPE>
struct FloatKernel {
    // Row r as f32: in place for F32, else converted into dst.
    static const float* row_f32(const MatmulArgs& a, int64_t r, float* dst) {
        const uint8_t* src = a.w + r * a.row_bytes;
        if constexpr (TYPE == RG_TYPE_F32) {
            return reinterpret_cast<const float*>(src);
        } else if constexpr (TYPE == RG_TYPE_F16) {
            S::f16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, a.cols);
        } else {
            S::bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, a.cols);
        }
        return dst;
    }

    // One row against tokens [t0, ntok).
    static void row_tokens(const MatmulArgs& a, const float* wr, int64_t r, int64_t t0) {
        int64_t t = t0;
        for (; t + 4 <= a.ntok; t += 4) {
            float out[4];
            S::dot_f32x4(wr, a.x + t * a.cols, a.cols, a.cols, out);
            for (int k = 0; k < 4; ++k) a.y[(t + k) * a.rows + r] = out[k];
        }
        for (; t < a.ntok; ++t) a.y[t * a.rows + r] = S::dot_f32(wr, a.x + t * a.cols, a.cols);
    }

    // Prefill: panels of kPanelRows rows (converted once, cache-resident) against every token. Where the ISA
    // has the 2-row x 3-token tile, blocks of kTileTokens tokens go over the panel kTileCols columns at a
    // time (partial sums kept in scratch), so a token triple's chunk stays in L1 while the panel's row pairs
    // pass over it; leftover tokens (ntok % 3) and an odd last row take dot_f32.
    static void panel_rows(const MatmulArgs& a, int64_t r0, int64_t r1, const Scratch& s) {
        const float* wr[kPanelRows];
        const int64_t n16 = a.cols / 16 * 16;
        for (int64_t p0 = r0; p0 < r1; p0 += kPanelRows) {
            const int64_t np = std::min<int64_t>(kPanelRows, r1 - p0);
            for (int64_t i = 0; i < np; ++i) wr[i] = row_f32(a, p0 + i, s.panel + i * a.cols);
            int64_t t = 0;
            if constexpr (simd_has_f32_tile<S>::value) {
                for (int64_t nt; (nt = std::min<int64_t>(kTileTokens, (a.ntok - t) / 3 * 3)) > 0; t += nt) {
                    const int64_t n_tiles = np / 2 * (nt / 3);
                    float* acc = s.acc;  // [row pair][token triple][2][3][16]
                    std::fill(acc, acc + n_tiles * kTileAcc, 0.0f);
                    for (int64_t c0 = 0; c0 < n16; c0 += kTileCols) {
                        const int64_t c1 = std::min<int64_t>(n16, c0 + kTileCols);
                        for (int64_t k = 0; k < nt; k += 3)
                            for (int64_t i = 0; i + 2 <= np; i += 2)
                                S::dot_f32_2x3(wr[i], wr[i + 1], a.x + (t + k) * a.cols, a.cols, c0, c1,
                                               acc + (i / 2 * (nt / 3) + k / 3) * kTileAcc);
                    }
                    for (int64_t i = 0; i < np; ++i)
                        for (int64_t k = 0; k < nt; ++k) {
                            const float* x = a.x + (t + k) * a.cols;
                            const int64_t tile = i / 2 * (nt / 3) + k / 3;
                            const float* part = acc + tile * kTileAcc + (i % 2 * 3 + k % 3) * 16;
                            a.y[(t + k) * a.rows + p0 + i] = i < np / 2 * 2
                                                                 ? S::dot_f32_finish(part, wr[i], x, a.cols)
                                                                 : S::dot_f32(wr[i], x, a.cols);
                        }
                }
            }
            for (int64_t i = 0; i < np; ++i) row_tokens(a, wr[i], p0 + i, t);
        }
    }

    static void rows(const MatmulArgs& a, int64_t r0, int64_t r1, const Scratch& s) {
        if (a.ntok > kMaxTok) return panel_rows(a, r0, r1, s);
        for (int64_t r = r0; r < r1; ++r) {
            // the next row's first prefetch_bytes, as the quantized kernels keep theirs ahead of each block
            const char* next = reinterpret_cast<const char*>(a.w + (r + 1) * a.row_bytes);
            for (int64_t o = 0; o < std::min<int64_t>(a.row_bytes, prefetch_bytes); o += 64) __builtin_prefetch(next + o);
            row_tokens(a, row_f32(a, r, s.row), r, 0);
        }
    }
};

template <class S>
KernelTable make_kernel_table() {
    KernelTable table{};
    table.by_type[RG_TYPE_F32] = &FloatKernel<S, RG_TYPE_F32>::rows;
    table.by_type[RG_TYPE_F16] = &FloatKernel<S, RG_TYPE_F16>::rows;
    table.by_type[RG_TYPE_BF16] = &FloatKernel<S, RG_TYPE_BF16>::rows;
    for (int t : {RG_TYPE_F32, RG_TYPE_F16, RG_TYPE_BF16}) table.exact_by_type[t] = table.by_type[t];
    table.quantize = &S::quantize_activations;
#define RG_KERNEL_(T)                                                                                    \
    if constexpr (simd_has_codes<S, T>::value)                                                             \
        table.by_type[T] = &FusedKernel<S, BlockDecoder<T>>::rows;                                         \
    else                                                                                                   \
        table.by_type[T] = &QuantKernel<S, BlockDecoder<T>>::rows;                                         \
    table.act_block[T] = QuantKernel<S, BlockDecoder<T>>::AB;                                            \
    table.act_offset[T] = QuantKernel<S, BlockDecoder<T>>::OFFSET;                                       \
    table.exact_by_type[T] = &ExactKernel<S, BlockDecoder<T>>::rows;
    RG_FOR_EACH_QUANT_TYPE(RG_KERNEL_)
#undef RG_KERNEL_
    return table;
}

}  // namespace regolith::cpu
