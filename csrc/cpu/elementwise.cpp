// Elementwise ops over rows: activations, gated linear units, sums, and the hyper-connection mixer's
// stream mix and write-back.
#include <cmath>

#include "cpu/kernels.h"
#include "cpu/nn.h"

namespace regolith::cpu {

namespace {

using nn::sigmoid;
using nn::silu;

// gelu with the tanh approximation (transformers' gelu_pytorch_tanh, ggml's gelu) in the form
// 0.5 x (1 + tanh(u)) = x * sigmoid(2u): one exp, and no cancellation for negative u.
float gelu_tanh(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + std::exp(-2.0f * u));
}

template <class F>
void map_rows(const Rows& x, const Rows& y, F f) {
    for_rows(x.rows, x.cols, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* a = x.row(r);
            float* b = y.row(r);
            for (int64_t i = 0; i < x.cols; ++i) b[i] = f(a[i]);
        }
    });
}

}  // namespace

void unary(const Rows& x, Unary op, float p, const Rows& y) {
    switch (op) {
        case Unary::Silu:
            return map_rows(x, y, [](float v) { return silu(v); });
        case Unary::Sigmoid:
            return map_rows(x, y, [](float v) { return sigmoid(v); });
        case Unary::SiluDiv:
            return map_rows(x, y, [p](float v) { return silu(v / p); });
        case Unary::TwoSigmoidDiv:
            return map_rows(x, y, [p](float v) { return 2.0f * sigmoid(v / p); });
        case Unary::Softcap:
            return map_rows(x, y, [p](float v) { return p * std::tanh(v / p); });
        case Unary::Scale:
            return map_rows(x, y, [p](float v) { return v * p; });
        case Unary::GeluTanhExp:
        case Unary::GeluErf:
            return gelu_rows(x, op, y);
    }
}

void glu(const Rows& gate, const Rows& up, Glu act, const Rows& y) {
    for_rows(gate.rows, gate.cols, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* g = gate.row(r);
            const float* u = up.row(r);
            float* o = y.row(r);
            if (act == Glu::GeluTanh)
                for (int64_t i = 0; i < gate.cols; ++i) o[i] = gelu_tanh(g[i]) * u[i];
            else if (act == Glu::Sigmoid)
                for (int64_t i = 0; i < gate.cols; ++i) o[i] = sigmoid(g[i]) * u[i];
            else if (act == Glu::SwigluOai)
                for (int64_t i = 0; i < gate.cols; ++i) o[i] = nn::swiglu_oai(g[i], u[i]);
            else
                for (int64_t i = 0; i < gate.cols; ++i) o[i] = silu(g[i]) * u[i];
        }
    });
}

void add(const Rows& a, const Rows& b, const Rows& y) {
    const bool broadcast = b.rows == 1 && a.rows != 1;
    for_rows(a.rows, a.cols, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* x = a.row(r);
            const float* z = b.row(broadcast ? 0 : r);
            float* o = y.row(r);
            for (int64_t i = 0; i < a.cols; ++i) o[i] = x[i] + z[i];
        }
    });
}

void hc_mix(const Rows& gate, const Rows& xn, int64_t hc, const Rows& mixed) {
    const int64_t hidden = mixed.cols;
    for_rows(mixed.rows, gate.cols, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            const float* g = gate.row(t);
            const float* x = xn.row(t);
            float* m = mixed.row(t);
            for (int64_t i = 0; i < hidden; ++i) {
                float acc = 0.0f;
                for (int64_t s = 0; s < hc; ++s) acc += sigmoid(g[s * hidden + i]) * x[s * hidden + i];
                m[i] = acc / float(hc);
            }
        }
    });
}

void hc_write(const Rows& out, const Rows& w, int64_t hc, const Rows& streams) {
    const int64_t hidden = out.cols;
    for_rows(out.rows, streams.cols, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            const float* o = out.row(t);
            const float* wt = w.row(t);
            float* st = streams.row(t);
            for (int64_t s = 0; s < hc; ++s) {
                float* dst = st + s * hidden;
                for (int64_t i = 0; i < hidden; ++i) dst[i] += wt[s] * o[i];
            }
        }
    });
}

}  // namespace regolith::cpu
