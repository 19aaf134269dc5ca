// Elementwise ops over rows (Backend::unary, glu, add, hc_mix, hc_write): one thread per output element.
// Grid: threadgroup (x, y) takes every tgpg.x-th stretch of ntg columns of row y (hc_write: of stream
// y % hc of token y / hc), so rows of any stride need no division per element, and a SIMD-group reads and
// writes 32 consecutive floats (coalesced). The host picks ntg = up to 256 threads and enough column
// threadgroups to cover a row (capped; each thread then loops). unary is one kernel per op (a template), so
// no per-element switch. Everything is memory-bound: one or two loads and a store per element.
//
// Numerics follow the CPU reference (csrc/cpu/elementwise.cpp, vision.cpp) operation by operation; Metal's
// exp / tanh differ from the host's libm by a few ulp (the suite's elementwise tolerance). Metal has no erf:
// rg_erf below.
#include "compat.h"

#include "args.h"
#include "common.h"

// Unary ops, numbered as regolith::Unary.
enum RgUnaryOp : uint {
    RG_UNARY_SILU = 0,
    RG_UNARY_SIGMOID = 1,
    RG_UNARY_SILU_DIV = 2,
    RG_UNARY_TWO_SIGMOID_DIV = 3,
    RG_UNARY_GELU_TANH_EXP = 4,
    RG_UNARY_GELU_ERF = 5,
    RG_UNARY_SOFTCAP = 6,
    RG_UNARY_SCALE = 7,
};

// erf(x) in float. Method: minimax polynomials from the Remez exchange algorithm (E. Remez, 1934), fitted for
// this file in mpmath, on two ranges as in W. J. Cody, "Rational Chebyshev approximations for the error
// function", Math. Comp. 23 (1969):
//   |x| < 1:      erf(x) = x + x P(x^2), P of degree 6 minimising the relative error of erf (1.2e-9);
//   1 <= |x|:     erf(x) = 1 - exp(Q(u)), u = min(|x|, 4) - 1 (exact), Q of degree 6 ~ log erfc(1 + u) with
//                 its error weighted by erfc (so the error of erf itself) minimised (1.0e-9); the expansion
//                 around u = 0 keeps Q's rounding small where erfc is largest. Above 3.92 the result rounds
//                 to 1.
// Checked exhaustively over every float against double erf: at most 1.0 ulp with a correctly rounded exp;
// Metal's precise exp adds at most erfc(1) = 0.16 times its own error (relative) to the result. erf(-x) =
// -erf(x); erf(+-inf) = +-1; NaN stays NaN.
inline float rg_erf(float x) {
    const float a = fabs(x);
    float r;
    if (a < 1.0f) {
        const float s = x * x;
        float q = 7.85386073e-05f;
        q = fma(q, s, -0.000801019371f);
        q = fma(q, s, 0.00518832775f);
        q = fma(q, s, -0.0268538129f);
        q = fma(q, s, 0.112835854f);
        q = fma(q, s, -0.37612626f);
        q = fma(q, s, 0.128379166f);
        r = fma(a, q, a);
    } else {
        const float u = (a > 4.0f ? 4.0f : a) - 1.0f;
        float q = 0.000185573939f;
        q = fma(q, u, -0.00182616292f);
        q = fma(q, u, 0.00989089161f);
        q = fma(q, u, -0.0415006876f);
        q = fma(q, u, -0.84311831f);
        q = fma(q, u, -2.6389668f);
        q = fma(q, u, -1.84960556f);
        r = 1.0f - exp(q);
    }
    return copysign(r, x);
}

// The vision tower's GELU, tanh form: 0.5 x (1 + tanh u), tanh u = sign(u) (1 - e) / (1 + e), e = e^(-2|u|).
inline float rg_gelu_tanh_exp(float x) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
    const float u = beta * (x + kappa * x * x * x);
    const float e = exp(-2.0f * fabs(u));
    return 0.5f * x * (1.0f + copysign((1.0f - e) / (1.0f + e), u));
}

// The dense models' FFN GELU, tanh form as x sigmoid(2u).
inline float rg_gelu_tanh_sigmoid(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + exp(-2.0f * u));
}

template <uint OP>
inline float rg_unary_op(float v, float p) {
    switch (OP) {
        case RG_UNARY_SILU:
            return rg_silu(v);
        case RG_UNARY_SIGMOID:
            return rg_sigmoid(v);
        case RG_UNARY_SILU_DIV:
            return rg_silu(v / p);
        case RG_UNARY_TWO_SIGMOID_DIV:
            return 2.0f * rg_sigmoid(v / p);
        case RG_UNARY_GELU_TANH_EXP:
            return rg_gelu_tanh_exp(v);
        case RG_UNARY_GELU_ERF:
            return 0.5f * v * (1.0f + rg_erf(v * 0.70710678118654752f));
        case RG_UNARY_SOFTCAP:
            return p * tanh(v / p);
        default:
            return v * p;  // RG_UNARY_SCALE
    }
}

template <uint OP>
kernel void rg_unary(constant RgUnaryArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                     device char* y [[buffer(2)]], RG_THREAD_IDS) {
    device const float* xr = rg_row<float>(x, a.x, tgpig.y);
    device float* yr = rg_row<float>(y, a.y, tgpig.y);
    for (int64_t i = int64_t(tgpig.x) * ntg + tiitg; i < a.x.cols; i += int64_t(tgpg.x) * ntg)
        yr[i] = rg_unary_op<OP>(xr[i], a.p);
}
RG_INSTANTIATE("rg_unary_silu", rg_unary, RG_UNARY_SILU)
RG_INSTANTIATE("rg_unary_sigmoid", rg_unary, RG_UNARY_SIGMOID)
RG_INSTANTIATE("rg_unary_silu_div", rg_unary, RG_UNARY_SILU_DIV)
RG_INSTANTIATE("rg_unary_two_sigmoid_div", rg_unary, RG_UNARY_TWO_SIGMOID_DIV)
RG_INSTANTIATE("rg_unary_gelu_tanh_exp", rg_unary, RG_UNARY_GELU_TANH_EXP)
RG_INSTANTIATE("rg_unary_gelu_erf", rg_unary, RG_UNARY_GELU_ERF)
RG_INSTANTIATE("rg_unary_softcap", rg_unary, RG_UNARY_SOFTCAP)
RG_INSTANTIATE("rg_unary_scale", rg_unary, RG_UNARY_SCALE)

// y = act(gate) * up; ACT: 0 SiLU, 1 GELU (tanh form), 2 sigmoid; 3 gpt-oss's clamped SwiGLU of both.
template <uint ACT>
kernel void rg_glu(constant RgBinaryArgs& a [[buffer(0)]], device const char* gate [[buffer(1)]],
                   device const char* up [[buffer(2)]], device char* y [[buffer(3)]], RG_THREAD_IDS) {
    device const float* g = rg_row<float>(gate, a.a, tgpig.y);
    device const float* u = rg_row<float>(up, a.b, tgpig.y);
    device float* yr = rg_row<float>(y, a.y, tgpig.y);
    for (int64_t i = int64_t(tgpig.x) * ntg + tiitg; i < a.a.cols; i += int64_t(tgpg.x) * ntg)
        yr[i] = ACT == 3 ? rg_swiglu_oai(g[i], u[i])
                         : (ACT == 1 ? rg_gelu_tanh_sigmoid(g[i]) : ACT == 2 ? rg_sigmoid(g[i]) : rg_silu(g[i])) * u[i];
}
RG_INSTANTIATE("rg_glu_silu", rg_glu, 0u)
RG_INSTANTIATE("rg_glu_gelu_tanh", rg_glu, 1u)
RG_INSTANTIATE("rg_glu_sigmoid", rg_glu, 2u)
RG_INSTANTIATE("rg_glu_swiglu_oai", rg_glu, 3u)

// y = a + b; b's stride is 0 (from the host) when its one row is added to every row. y may be a or b.
kernel void rg_add(constant RgBinaryArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                   device const char* z [[buffer(2)]], device char* y [[buffer(3)]], RG_THREAD_IDS) {
    device const float* xr = rg_row<float>(x, a.a, tgpig.y);
    device const float* zr = rg_row<float>(z, a.b, tgpig.y);
    device float* yr = rg_row<float>(y, a.y, tgpig.y);
    for (int64_t i = int64_t(tgpig.x) * ntg + tiitg; i < a.a.cols; i += int64_t(tgpg.x) * ntg)
        yr[i] = xr[i] + zr[i];
}
RG_KERNEL(rg_add)

// mixed[t][i] = (sum over streams s, in order, of sigmoid(gate[t][s H + i]) xn[t][s H + i]) / hc; row t = y.
kernel void rg_hc_mix(constant RgBinaryArgs& a [[buffer(0)]], device const char* gate [[buffer(1)]],
                      device const char* xn [[buffer(2)]], device char* mixed [[buffer(3)]], RG_THREAD_IDS) {
    const int64_t hidden = a.y.cols;
    device const float* g = rg_row<float>(gate, a.a, tgpig.y);
    device const float* x = rg_row<float>(xn, a.b, tgpig.y);
    device float* m = rg_row<float>(mixed, a.y, tgpig.y);
    for (int64_t i = int64_t(tgpig.x) * ntg + tiitg; i < hidden; i += int64_t(tgpg.x) * ntg) {
        float acc = 0.0f;
        for (int64_t s = 0; s < a.hc; ++s) acc += rg_sigmoid(g[s * hidden + i]) * x[s * hidden + i];
        m[i] = acc / float(a.hc);
    }
}
RG_KERNEL(rg_hc_mix)

// streams[t][s H + i] += w[t][s] * out[t][i], t = y / hc, s = y % hc.
kernel void rg_hc_write(constant RgBinaryArgs& a [[buffer(0)]], device const char* out [[buffer(1)]],
                        device const char* w [[buffer(2)]], device char* streams [[buffer(3)]],
                        RG_THREAD_IDS) {
    const int64_t hidden = a.a.cols, t = int64_t(tgpig.y) / a.hc, s = int64_t(tgpig.y) % a.hc;
    device const float* o = rg_row<float>(out, a.a, t);
    const float wt = rg_row<float>(w, a.b, t)[s];
    device float* dst = rg_row<float>(streams, a.y, t) + s * hidden;
    for (int64_t i = int64_t(tgpig.x) * ntg + tiitg; i < hidden; i += int64_t(tgpg.x) * ntg)
        dst[i] += wt * o[i];
}
RG_KERNEL(rg_hc_write)
