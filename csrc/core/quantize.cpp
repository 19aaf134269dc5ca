#include "core/quantize.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/errors.h"
#include "core/half.h"
#include "core/quant.h"
#include "core/types.h"

namespace regolith {
namespace {

// ---- numpy-compatible scalar primitives ---------------------------------------------------------------

// numpy's float32 -> (u)int8 cast on x86-64: truncate to int32 (cvttss2si), keep the low byte. NaN, inf and
// values outside int32 give INT32_MIN, whose low byte is 0.
inline uint8_t np_cast_u8(float v) {
    if (!(std::fabs(v) < 2147483648.0f)) return 0;
    return uint8_t(uint32_t(int32_t(v)));
}

// numpy's float32 -> float16 (npy_floatbits_to_halfbits): round to nearest even; a NaN keeps its top payload
// bits without forcing the quiet bit (a payload that would vanish becomes 1).
inline uint16_t np_fp16(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        uint16_t h = uint16_t(((x >> 16) & 0x8000) | 0x7c00 | ((x & 0x7fffff) >> 13));
        return (h & 0x3ff) ? h : uint16_t(h | 1);
    }
    return fp32_to_fp16(f);
}

// numpy's max/min reductions: any NaN gives the default NaN (payload and sign dropped); among equal values
// (+0 and -0) the last one wins.
inline float np_nan() { return f32_from_bits(0x7fc00000u); }

inline float np_max(const float* x, int n) {
    float m = x[0];
    for (int i = 0; i < n; ++i) {
        if (x[i] != x[i]) return np_nan();
        if (!(m > x[i])) m = x[i];
    }
    return m;
}

inline float np_min(const float* x, int n) {
    float m = x[0];
    for (int i = 0; i < n; ++i) {
        if (x[i] != x[i]) return np_nan();
        if (!(m < x[i])) m = x[i];
    }
    return m;
}

inline float np_amax(const float* x, int n) {
    float m = std::fabs(x[0]);
    for (int i = 0; i < n; ++i) {
        const float a = std::fabs(x[i]);
        if (a != a) return np_nan();
        if (a > m) m = a;
    }
    return m;
}

// x[argmax |x|]: the first element of largest magnitude, the first NaN if there is one (numpy argmax).
inline float np_absmax_signed(const float* x, int n) {
    int im = 0;
    float am = std::fabs(x[0]);
    if (am != am) return x[0];
    for (int i = 1; i < n; ++i) {
        const float a = std::fabs(x[i]);
        if (a != a) return x[i];
        if (a > am) {
            am = a;
            im = i;
        }
    }
    return x[im];
}

inline void store_half(rg_half* dst, float v) { *dst = np_fp16(v); }

// ---- plain and legacy 32-element types (gguf-py's numpy quantizers, bit for bit) ---------------------

void quantize_f16(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = np_fp16(x[i]);
}

void quantize_bf16(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, x += QK8_0) {
        const float d = np_amax(x, QK8_0) / 127.0f;
        const float id = d == 0.0f ? 0.0f : 1.0f / d;
        store_half(&y[b].d, d);
        for (int j = 0; j < QK8_0; ++j) y[b].qs[j] = int8_t(np_cast_u8(std::round(x[j] * id)));
    }
}

// Q4_0 / Q5_0: d = x[argmax|x|] / -(2^(bits-1)); q = trunc(x/d + 2^(bits-1) + 0.5) clipped to the code range.
template <int kHalfRange>
void symmetric_codes(const float* x, int n, float* d_out, uint8_t* q) {
    const float max = np_absmax_signed(x, n);
    const float d = max / float(-kHalfRange);
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    for (int j = 0; j < n; ++j) {
        const uint8_t v = np_cast_u8(x[j] * id + (float(kHalfRange) + 0.5f));
        q[j] = v < 2 * kHalfRange - 1 ? v : uint8_t(2 * kHalfRange - 1);
    }
    *d_out = d;
}

// Q4_1 / Q5_1: d = (max - min) / (2^bits - 1); q = trunc((x - min)/d + 0.5) clipped.
template <int kMaxCode>
void affine_codes(const float* x, int n, float* d_out, float* m_out, uint8_t* q) {
    const float max = np_max(x, n);
    const float min = np_min(x, n);
    const float d = (max - min) / float(kMaxCode);
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    for (int j = 0; j < n; ++j) {
        const uint8_t v = np_cast_u8((x[j] - min) * id + 0.5f);
        q[j] = v < kMaxCode ? v : uint8_t(kMaxCode);
    }
    *d_out = d;
    *m_out = min;
}

// Low nibbles: element j in qs[j] bits 0-3, element j+16 in bits 4-7. Fifth bits: bit j of a LE uint32.
inline void pack_nibbles(const uint8_t* q, uint8_t* qs) {
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t((q[j] & 0x0f) | (q[j + 16] << 4));
}

inline void pack_fifth_bits(const uint8_t* q, uint8_t* qh) {
    uint32_t h = 0;
    for (int j = 0; j < 32; ++j) h |= uint32_t((q[j] >> 4) & 1) << j;
    for (int k = 0; k < 4; ++k) qh[k] = uint8_t(h >> (8 * k));
}

void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb) {
    uint8_t q[QK4_0];
    for (int64_t b = 0; b < nb; ++b, x += QK4_0) {
        float d;
        symmetric_codes<8>(x, QK4_0, &d, q);
        store_half(&y[b].d, d);
        pack_nibbles(q, y[b].qs);
    }
}

void quantize_q5_0(const float* x, block_q5_0* y, int64_t nb) {
    uint8_t q[QK5_0];
    for (int64_t b = 0; b < nb; ++b, x += QK5_0) {
        float d;
        symmetric_codes<16>(x, QK5_0, &d, q);
        store_half(&y[b].d, d);
        pack_fifth_bits(q, y[b].qh);
        pack_nibbles(q, y[b].qs);
    }
}

void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb) {
    uint8_t q[QK4_1];
    for (int64_t b = 0; b < nb; ++b, x += QK4_1) {
        float d, m;
        affine_codes<15>(x, QK4_1, &d, &m, q);
        store_half(&y[b].d, d);
        store_half(&y[b].m, m);
        pack_nibbles(q, y[b].qs);
    }
}

void quantize_q5_1(const float* x, block_q5_1* y, int64_t nb) {
    uint8_t q[QK5_1];
    for (int64_t b = 0; b < nb; ++b, x += QK5_1) {
        float d, m;
        affine_codes<31>(x, QK5_1, &d, &m, q);
        store_half(&y[b].d, d);
        store_half(&y[b].m, m);
        pack_fifth_bits(q, y[b].qh);
        pack_nibbles(q, y[b].qs);
    }
}

// ---- types without a gguf-py quantizer: finite input only ----------------------------------------------

void require_finite(const float* x, int64_t n, uint32_t type) {
    for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) {
            throw Error("cannot quantize a non-finite value (" + std::to_string(x[i]) + " at index " +
                        std::to_string(i) + ") to " + std::string(type_traits(type)->name) +
                        "; replace inf/NaN before quantizing");
        }
    }
}

// clamp(nearest_int(v), lo, hi): round half to even as llama.cpp's nearest_int, but clamping first so that
// huge, infinite or NaN (-> lo) arguments stay defined. Adding and removing 1.5*2^23 rounds |v| < 2^22 to an
// integer in the current (nearest-even) rounding mode.
inline int round_clamp(float v, int lo, int hi) {
    v = v > float(lo) ? v : float(lo);
    v = v < float(hi) ? v : float(hi);
    return int((v + 12582912.0f) - 12582912.0f);
}

// Q2_0 (upstream quantize_row_q2_0_ref): d = max|x|, code = clamp(roundf(x/d) + 1, 0, 3), 2 bits LSB-first.
void quantize_q2_0(const float* x, block_q2_0* y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, x += QK2_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK2_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
        const float id = amax > 0.0f ? 1.0f / amax : 0.0f;
        store_half(&y[b].d, amax);
        std::memset(y[b].qs, 0, sizeof(y[b].qs));
        for (int j = 0; j < QK2_0; ++j) {
            // Subnormal amax makes id inf and x*id +-inf or NaN: code 0, as x86's (int) cast gives.
            const float r = std::round(x[j] * id);
            int q = std::fabs(r) < 2147483648.0f ? int(r) + 1 : 0;
            q = q < 0 ? 0 : (q > 3 ? 3 : q);
            y[b].qs[j / 4] |= uint8_t(q << (2 * (j % 4)));
        }
    }
}

constexpr float kGroupMaxEps = 1e-15f;

// Q4_K sub-block fit (llama.cpp's make_qkx2_quants): x ~ scale * L - min_out with L in [0, nmax], weighted
// squared error. Starts from the min/max grid, then tries nstep+1 grid densities around nmax/(max - min),
// each followed by a weighted least-squares refit of (scale, min), keeping the best. Returns the scale;
// *min_out (>= 0) is the min as subtracted.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* min_out, float rmin,
                    float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *min_out = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = uint8_t(round_clamp(iscale * (x[i] - min), 0, nmax));
        const float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (diff * diff);
    }
    uint8_t trial[QK_K];
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = round_clamp(iscale * (x[i] - min), 0, nmax);
            trial[i] = uint8_t(l);
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; ++i) {
            const float diff = this_scale * trial[i] + this_min - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best_error) {
            std::memcpy(L, trial, size_t(n));
            best_error = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *min_out = -min;
    return scale;
}

// Q6_K sub-block fit (llama.cpp's make_qx_quants, rmse_type 1): symmetric x ~ scale * (L - nmax),
// L - nmax in [-nmax, nmax - 1], weights x^2. The largest-magnitude element is mapped to -nmax (the side with
// the extra code); 18 nearby grid densities are tried and the least-squares scale of the best kept.
float fit_symmetric_scale(int n, int nmax, const float* x, int8_t* L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.0f;
    }
    auto code = [nmax](float v) { return round_clamp(v, -nmax, nmax - 1); };
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = code(iscale * x[i]);
        L[i] = int8_t(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = code(iscale * x[i]);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + code(iscale * x[i]));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q4_K: 8 sub-blocks of 32, each x ~ d*sc_j*q - dmin*m_j, q in [0, 15], sc_j and m_j 6-bit.
void quantize_q4_k(const float* x, block_q4_K* y, int64_t nb) {
    uint8_t L[QK_K];
    float weights[32], scales[QK_K / 32], mins[QK_K / 32];
    for (int64_t b = 0; b < nb; ++b, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 32; ++j) {
            const float* xs = x + 32 * j;
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
            const float av_x = std::sqrt(sum_x2 / 32);
            for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
            scales[j] = fit_scale_min(32, 15, xs, weights, L + 32 * j, &mins[j], -1.0f, 0.1f, 20);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
        const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
        uint8_t* s = y[b].scales;
        uint8_t ls[QK_K / 32], lm[QK_K / 32];
        for (int j = 0; j < QK_K / 32; ++j) {
            ls[j] = uint8_t(round_clamp(inv_scale * scales[j], 0, 63));
            lm[j] = uint8_t(round_clamp(inv_min * mins[j], 0, 63));
        }
        // 6-bit packing: j < 4 in the low 6 bits of s[j] (scale) and s[j+4] (min); j >= 4 has its low nibbles
        // in s[j+4] and its top 2 bits in the top bits of s[j-4] (scale) and s[j] (min).
        for (int j = 0; j < 4; ++j) {
            s[j] = uint8_t((ls[j] & 63) | ((ls[j + 4] >> 4) << 6));
            s[j + 4] = uint8_t((lm[j] & 63) | ((lm[j + 4] >> 4) << 6));
            s[j + 8] = uint8_t((ls[j + 4] & 0xf) | ((lm[j + 4] & 0xf) << 4));
        }
        store_half(&y[b].d, max_scale / 63.0f);
        store_half(&y[b].dmin, max_min / 63.0f);
        const float d_all = fp16_to_fp32(y[b].d), dmin_all = fp16_to_fp32(y[b].dmin);
        // Re-round against the scales as stored.
        for (int j = 0; j < QK_K / 32; ++j) {
            const float d = d_all * ls[j];
            if (!d) continue;
            const float dm = dmin_all * lm[j];
            for (int i = 0; i < 32; ++i) {
                L[32 * j + i] = uint8_t(round_clamp((x[32 * j + i] + dm) / d, 0, 15));
            }
        }
        // 64 elements per 32 bytes: the first 32 in the low nibbles, the next 32 in the high nibbles.
        for (int k = 0; k < QK_K / 64; ++k)
            for (int l = 0; l < 32; ++l)
                y[b].qs[32 * k + l] = uint8_t(L[64 * k + l] | (L[64 * k + 32 + l] << 4));
    }
}

// Q6_K: 16 sub-blocks of 16, x ~ d*sc_j*(q - 32), q 6-bit, sc_j int8.
void quantize_q6_k(const float* x, block_q6_K* y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t b = 0; b < nb; ++b, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            scales[j] = fit_symmetric_scale(16, 32, x + 16 * j, L + 16 * j);
            const float a = std::fabs(scales[j]);
            if (a > max_abs_scale) {
                max_abs_scale = a;
                max_scale = scales[j];
            }
        }
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(&y[b], 0, sizeof(block_q6_K));
            continue;
        }
        const float iscale = -128.0f / max_scale;
        store_half(&y[b].d, 1 / iscale);
        for (int j = 0; j < QK_K / 16; ++j) {
            y[b].scales[j] = int8_t(round_clamp(iscale * scales[j], -128, 127));
        }
        const float d_all = fp16_to_fp32(y[b].d);
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = d_all * y[b].scales[j];
            if (!d) continue;
            for (int i = 0; i < 16; ++i) {
                L[16 * j + i] = int8_t(round_clamp(x[16 * j + i] / d, -32, 31) + 32);
            }
        }
        // Per 128 elements: ql holds low nibbles (elements l, l+64 in byte l; l+32, l+96 in byte l+32),
        // qh the top 2 bits of elements l, l+32, l+64, l+96 in byte l.
        uint8_t* ql = y[b].ql;
        uint8_t* qh = y[b].qh;
        for (int k = 0; k < QK_K; k += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t* q = reinterpret_cast<const uint8_t*>(L) + k + l;
                ql[l] = uint8_t((q[0] & 0xf) | ((q[64] & 0xf) << 4));
                ql[l + 32] = uint8_t((q[32] & 0xf) | ((q[96] & 0xf) << 4));
                qh[l] =
                    uint8_t((q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
            }
        }
    }
}

constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

// Index of the table value nearest to v (ties to the lower), as llama.cpp's best_index_int8.
inline int nearest_iq4nl(float v) {
    if (v <= kIq4nlValues[0]) return 0;
    if (v >= kIq4nlValues[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < kIq4nlValues[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - kIq4nlValues[hi - 1] < kIq4nlValues[hi] - v ? hi - 1 : hi;
}

// IQ4_NL (llama.cpp's quantize_iq4_nl without an importance matrix, 7 tries each side): x ~ d * kvalue[q].
// Weighted (x^2) least-squares scale for the max->-127 grid and 15 grid densities around it; best kept.
void quantize_iq4_nl(const float* x, block_iq4_nl* y, int64_t nb) {
    constexpr int kTries = 7;
    uint8_t L[QK4_NL];
    for (int64_t b = 0; b < nb; ++b, x += QK4_NL) {
        float amax = 0, max = 0;
        for (int j = 0; j < QK4_NL; ++j) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        float d = 0;
        if (!(amax < kGroupMaxEps)) {
            auto sums = [&](float id, float* sumqx, float* sumq2) {
                *sumqx = *sumq2 = 0;
                for (int j = 0; j < QK4_NL; ++j) {
                    const float q = kIq4nlValues[nearest_iq4nl(id * x[j])];
                    const float w = x[j] * x[j];
                    *sumqx += w * q * x[j];
                    *sumq2 += w * q * q;
                }
            };
            float sumqx, sumq2;
            d = -max / kIq4nlValues[0];
            sums(1 / d, &sumqx, &sumq2);
            d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
            float best = d * sumqx;
            for (int t = -kTries; t <= kTries; ++t) {
                sums((t + kIq4nlValues[0]) / max, &sumqx, &sumq2);
                if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
        }
        store_half(&y[b].d, d);
        const float id = d ? 1 / d : 0.0f;
        for (int j = 0; j < QK4_NL; ++j) L[j] = uint8_t(nearest_iq4nl(id * x[j]));
        pack_nibbles(L, y[b].qs);
    }
}

int64_t block_elems_of(uint32_t type) {
    switch (type) {
        case RG_TYPE_F16:
        case RG_TYPE_BF16:
            return 1;
        case RG_TYPE_Q4_0:
        case RG_TYPE_Q4_1:
        case RG_TYPE_Q5_0:
        case RG_TYPE_Q5_1:
        case RG_TYPE_Q8_0:
        case RG_TYPE_IQ4_NL:
        case RG_TYPE_Q2_0:
        case RG_TYPE_Q4_K:
        case RG_TYPE_Q6_K:
            return type_traits(type)->block_elems;
        default:
            return 0;
    }
}

int64_t checked_blocks(uint32_t type, int64_t n) {
    const int64_t qk = block_elems_of(type);
    if (qk == 0) {
        const TypeTraits* t = type_traits(type);
        throw Error("quantizing to " + (t ? std::string(t->name) : "type id " + std::to_string(type)) +
                    " is not supported; supported: F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_0 Q4_K Q6_K IQ4_NL");
    }
    if (n < 0 || n % qk != 0) {
        throw Error("row length " + std::to_string(n) + " is not a multiple of the " +
                    std::string(type_traits(type)->name) + " block size " + std::to_string(qk));
    }
    return n / qk;
}

}  // namespace

bool can_quantize(uint32_t type) { return block_elems_of(type) != 0; }

size_t quantized_row_bytes(uint32_t type, int64_t n) {
    return size_t(checked_blocks(type, n) * type_traits(type)->block_bytes);
}

void quantize_row(uint32_t type, const float* src, void* dst, int64_t n) {
    const int64_t nb = checked_blocks(type, n);
    switch (type) {
        case RG_TYPE_F16:
            return quantize_f16(src, static_cast<uint16_t*>(dst), n);
        case RG_TYPE_BF16:
            return quantize_bf16(src, static_cast<uint16_t*>(dst), n);
        case RG_TYPE_Q4_0:
            return quantize_q4_0(src, static_cast<block_q4_0*>(dst), nb);
        case RG_TYPE_Q4_1:
            return quantize_q4_1(src, static_cast<block_q4_1*>(dst), nb);
        case RG_TYPE_Q5_0:
            return quantize_q5_0(src, static_cast<block_q5_0*>(dst), nb);
        case RG_TYPE_Q5_1:
            return quantize_q5_1(src, static_cast<block_q5_1*>(dst), nb);
        case RG_TYPE_Q8_0:
            return quantize_q8_0(src, static_cast<block_q8_0*>(dst), nb);
        default:
            break;
    }
    require_finite(src, n, type);
    switch (type) {
        case RG_TYPE_Q2_0:
            return quantize_q2_0(src, static_cast<block_q2_0*>(dst), nb);
        case RG_TYPE_Q4_K:
            return quantize_q4_k(src, static_cast<block_q4_K*>(dst), nb);
        case RG_TYPE_Q6_K:
            return quantize_q6_k(src, static_cast<block_q6_K*>(dst), nb);
        case RG_TYPE_IQ4_NL:
            return quantize_iq4_nl(src, static_cast<block_iq4_nl*>(dst), nb);
        default:
            break;
    }
}

float quantize_i8_row(const float* x, int8_t* q, int64_t n) {
    const float s = np_amax(x, int(n)) / 127.0f;
    const float is = s == 0.0f ? 0.0f : 1.0f / s;
    for (int64_t i = 0; i < n; ++i) q[i] = int8_t(np_cast_u8(std::round(x[i] * is)));
    return s;
}

}  // namespace regolith
