// Elementwise ops over rows (one thread per element): activations, gated linear units, sums, and the
// hyper-connection mixer's stream mix and write-back.
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__device__ float gelu_tanh_sigmoid(float x) {  // the dense models' FFN: x * sigmoid(2u)
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

__device__ float gelu_tanh_exp(float x) {  // the vision tower's: 0.5 x (1 + tanh u)
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
    const float u = beta * (x + kappa * x * x * x);
    const float e = expf(-2.0f * fabsf(u));
    return 0.5f * x * (1.0f + copysignf((1.0f - e) / (1.0f + e), u));
}

__global__ void unary_k(View x, Unary op, float p, View y) {
    pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= x.rows * x.cols) return;
    const int64_t r = i / x.cols, c = i % x.cols;
    const float v = x.row(r)[c];
    float o = v;
    switch (op) {
        case Unary::Silu: o = siluf_(v); break;
        case Unary::Sigmoid: o = sigmoidf_(v); break;
        case Unary::SiluDiv: o = siluf_(v / p); break;
        case Unary::TwoSigmoidDiv: o = 2.0f * sigmoidf_(v / p); break;
        case Unary::GeluTanhExp: o = gelu_tanh_exp(v); break;
        case Unary::GeluErf: o = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
        case Unary::Softcap: o = p * tanhf(v / p); break;
        case Unary::Scale: o = v * p; break;
    }
    y.row(r)[c] = o;
}

__global__ void glu_k(View g, View u, Glu act, View y) {
    pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= g.rows * g.cols) return;
    const int64_t r = i / g.cols, c = i % g.cols;
    const float v = g.row(r)[c];
    if (act == Glu::SwigluOai) {
        y.row(r)[c] = swiglu_oai_(v, u.row(r)[c]);
        return;
    }
    const float a = act == Glu::GeluTanh ? gelu_tanh_sigmoid(v) : act == Glu::Sigmoid ? sigmoidf_(v) : siluf_(v);
    y.row(r)[c] = a * u.row(r)[c];
}

__global__ void add_k(View a, View b, View y) {
    pdl_begin();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= a.rows * a.cols) return;
    const int64_t r = i / a.cols, c = i % a.cols;
    y.row(r)[c] = a.row(r)[c] + b.row(b.rows == 1 ? 0 : r)[c];
}

__global__ void hc_mix_k(View gate, View xn, int64_t hc, View mixed) {
    pdl_begin();
    const int64_t hidden = mixed.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= mixed.rows * hidden) return;
    const int64_t t = i / hidden, c = i % hidden;
    const float* g = gate.row(t);
    const float* x = xn.row(t);
    float acc = 0.0f;
    for (int64_t s = 0; s < hc; ++s) acc += sigmoidf_(g[s * hidden + c]) * x[s * hidden + c];
    mixed.row(t)[c] = acc / float(hc);
}

__global__ void hc_write_k(View out, View w, int64_t hc, View streams) {
    pdl_begin();
    const int64_t hidden = out.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= out.rows * hc * hidden) return;
    const int64_t t = i / (hc * hidden), s = i / hidden % hc, c = i % hidden;
    streams.row(t)[s * hidden + c] += w.row(t)[s] * out.row(t)[c];
}

}  // namespace

void unary(cudaStream_t s, const View& x, Unary op, float p, const View& y) {
    if (x.rows * x.cols == 0) return;
    launch(unary_k, grid(x.rows * x.cols, 256), 256, 0, s, x, op, p, y);
    RG_LAUNCHED("unary");
}

void glu(cudaStream_t s, const View& gate, const View& up, Glu act, const View& y) {
    if (gate.rows * gate.cols == 0) return;
    launch(glu_k, grid(gate.rows * gate.cols, 256), 256, 0, s, gate, up, act, y);
    RG_LAUNCHED("glu");
}

void add(cudaStream_t s, const View& a, const View& b, const View& y) {
    if (a.rows * a.cols == 0) return;
    launch(add_k, grid(a.rows * a.cols, 256), 256, 0, s, a, b, y);
    RG_LAUNCHED("add");
}

void hc_mix(cudaStream_t s, const View& gate, const View& xn, int64_t hc, const View& mixed) {
    if (mixed.rows == 0) return;
    launch(hc_mix_k, grid(mixed.rows * mixed.cols, 256), 256, 0, s, gate, xn, hc, mixed);
    RG_LAUNCHED("hc_mix");
}

void hc_write(cudaStream_t s, const View& out, const View& w, int64_t hc, const View& streams) {
    if (out.rows == 0) return;
    launch(hc_write_k, grid(out.rows * hc * out.cols, 256), 256, 0, s, out, w, hc, streams);
    RG_LAUNCHED("hc_write");
}

}  // namespace regolith::cuda
