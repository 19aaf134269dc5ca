#include "model/gated_delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "model/nn.h"

namespace regolith {

namespace {

using nn::dot;
using nn::sigmoid;
using nn::silu;

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold 20

// y[j] += a * x[j]
void axpy(float a, const float* x, float* y, int64_t n) {
    for (int64_t j = 0; j < n; ++j) y[j] += a * x[j];
}

// Per-token inputs of one value head after the conv, as strided views into the [ntok][conv_dim] buffer.
struct HeadInputs {
    const float* q;     // q of token t: q + t * stride, [k_dim], normalised and scaled
    const float* k;     // [k_dim], normalised
    const float* v;     // [v_dim]
    int64_t stride;     // conv_dim
    const float* g;     // g of token t: g[t * n_v], log decay (<= 0)
    const float* beta;  // beta[t * n_v]
    int64_t gstride;    // n_v_heads
};

// The delta rule one token at a time (transformers' torch_recurrent_gated_delta_rule).
// S: [k_dim][v_dim]; out of token t: out + t * ostride, [v_dim].
void recurrent_scan(const HeadInputs& in, int64_t ntok, int64_t dk, int64_t dv, float* S, float* out,
                    int64_t ostride) {
    std::vector<float> delta(static_cast<size_t>(dv));  // [v_dim]
    for (int64_t t = 0; t < ntok; ++t) {
        const float* q = in.q + t * in.stride;
        const float* k = in.k + t * in.stride;
        const float* v = in.v + t * in.stride;
        const float decay = std::exp(in.g[t * in.gstride]), b = in.beta[t * in.gstride];
        for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
        std::fill(delta.begin(), delta.end(), 0.0f);
        for (int64_t i = 0; i < dk; ++i) axpy(k[i], S + i * dv, delta.data(), dv);  // kv_mem = S^T k
        for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - delta[j]) * b;
        for (int64_t i = 0; i < dk; ++i) axpy(k[i], delta.data(), S + i * dv, dv);  // S += k delta^T
        float* o = out + t * ostride;
        std::fill(o, o + dv, 0.0f);
        for (int64_t i = 0; i < dk; ++i) axpy(q[i], S + i * dv, o, dv);  // o = S^T q
    }
}

// The same recurrence in chunks of C tokens (transformers' torch_chunk_gated_delta_rule, WY/UT form):
// within a chunk, with cum = cumsum(g) and T = I + strict_lower(beta_i k_i.k_j exp(cum_i - cum_j)),
//   U = T^-1 (beta v),  W = T^-1 (beta exp(cum) k),  v_new = U - W S
//   o_i = exp(cum_i) q_i S + sum_{j<=i} (q_i.k_j) exp(cum_i - cum_j) v_new_j
//   S  <- exp(cum_last) S + sum_j exp(cum_last - cum_j) k_j v_new_j^T
void chunked_scan(const HeadInputs& in, int64_t ntok, int64_t dk, int64_t dv, int64_t C, float* S, float* out,
                  int64_t ostride) {
    std::vector<float> cum(static_cast<size_t>(C));           // [C]
    std::vector<float> A(static_cast<size_t>(C * C));         // [C][C], strictly lower part used
    std::vector<float> U(static_cast<size_t>(C * dv));        // [C][v_dim]: new values, then v_new
    std::vector<float> W(static_cast<size_t>(C * dk));        // [C][k_dim]
    std::vector<float> dS(static_cast<size_t>(dk * dv));      // [k_dim][v_dim]: this chunk's state update
    for (int64_t c0 = 0; c0 < ntok; c0 += C) {
        const int64_t L = std::min(C, ntok - c0);
        auto q = [&](int64_t i) { return in.q + (c0 + i) * in.stride; };
        auto k = [&](int64_t i) { return in.k + (c0 + i) * in.stride; };
        auto v = [&](int64_t i) { return in.v + (c0 + i) * in.stride; };
        auto beta = [&](int64_t i) { return in.beta[(c0 + i) * in.gstride]; };
        float acc = 0.0f;
        for (int64_t i = 0; i < L; ++i) cum[i] = acc += in.g[(c0 + i) * in.gstride];

        for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < i; ++j) A[i * C + j] = beta(i) * dot(k(i), k(j), dk) * std::exp(cum[i] - cum[j]);

        // Forward substitution: X_i = B_i - sum_{j<i} A_ij X_j.
        for (int64_t i = 0; i < L; ++i) {
            float* u = &U[i * dv];
            float* w = &W[i * dk];
            const float bi = beta(i), bdi = beta(i) * std::exp(cum[i]);
            for (int64_t j = 0; j < dv; ++j) u[j] = v(i)[j] * bi;
            for (int64_t j = 0; j < dk; ++j) w[j] = k(i)[j] * bdi;
            for (int64_t j = 0; j < i; ++j) {
                axpy(-A[i * C + j], &U[j * dv], u, dv);
                axpy(-A[i * C + j], &W[j * dk], w, dk);
            }
        }
        // v_new = U - W S (reads the state before this chunk).
        for (int64_t i = 0; i < L; ++i)
            for (int64_t m = 0; m < dk; ++m) axpy(-W[i * dk + m], S + m * dv, &U[i * dv], dv);

        for (int64_t i = 0; i < L; ++i) {
            float* o = out + (c0 + i) * ostride;
            std::fill(o, o + dv, 0.0f);
            const float di = std::exp(cum[i]);
            for (int64_t m = 0; m < dk; ++m) axpy(q(i)[m] * di, S + m * dv, o, dv);
            for (int64_t j = 0; j <= i; ++j)
                axpy(dot(q(i), k(j), dk) * std::exp(cum[i] - cum[j]), &U[j * dv], o, dv);
        }

        const float last = cum[L - 1], dlast = std::exp(last);
        std::fill(dS.begin(), dS.end(), 0.0f);
        for (int64_t j = 0; j < L; ++j) {
            const float dj = std::exp(last - cum[j]);
            for (int64_t m = 0; m < dk; ++m) axpy(k(j)[m] * dj, &U[j * dv], &dS[m * dv], dv);
        }
        for (int64_t i = 0; i < dk * dv; ++i) S[i] = S[i] * dlast + dS[i];
    }
}

}  // namespace

GdnState::GdnState(const GdnShape& s)
    : conv(size_t(std::max<int64_t>(s.conv_kernel - 1, 0) * s.conv_dim())),
      recurrent(size_t(s.n_v_heads * s.k_dim * s.v_dim)) {}

void GdnState::reset() {
    std::fill(conv.begin(), conv.end(), 0.0f);
    std::fill(recurrent.begin(), recurrent.end(), 0.0f);
}

void GdnState::copy_from(const GdnState& other) {
    if (other.conv.size() != conv.size() || other.recurrent.size() != recurrent.size())
        throw Error("GdnState::copy_from: states of different shapes");
    std::copy(other.conv.begin(), other.conv.end(), conv.begin());
    std::copy(other.recurrent.begin(), other.recurrent.end(), recurrent.begin());
}

GatedDeltaNet::GatedDeltaNet(const GdnShape& shape, const GdnWeights& weights, Backend& backend)
    : shape_(shape), w_(weights), backend_(&backend) {
    if (shape.n_k_heads <= 0 || shape.n_v_heads % shape.n_k_heads != 0 || shape.conv_kernel < 1)
        throw Error("GatedDeltaNet: n_v_heads must be a positive multiple of n_k_heads and conv_kernel >= 1");
    // [kernel][conv_dim], so that the conv runs along contiguous channels.
    const int64_t K = shape.conv_kernel, cd = shape.conv_dim();
    conv_t_.resize(size_t(K * cd));
    for (int64_t c = 0; c < cd; ++c)
        for (int64_t i = 0; i < K; ++i) conv_t_[i * cd + c] = weights.conv1d[c * K + i];
}

void GatedDeltaNet::forward(const float* x, int64_t ntok, GdnState& state, float* y, GdnState* after) const {
    const GdnShape& s = shape_;
    const int64_t K = s.conv_kernel, cd = s.conv_dim(), kd = s.key_dim(), vd = s.value_dim();
    const int64_t nk = s.n_k_heads, nv = s.n_v_heads, dk = s.k_dim, dv = s.v_dim;
    if (ntok <= 0) return;
    if (state.conv.size() != size_t((K - 1) * cd) || state.recurrent.size() != size_t(nv * dk * dv))
        throw Error("GatedDeltaNet::forward: state was made for another layer shape");
    for (int64_t t = 0; after && t < ntok; ++t)
        if (after[t].conv.size() != state.conv.size() || after[t].recurrent.size() != state.recurrent.size())
            throw Error("GatedDeltaNet::forward: a per-token state was made for another layer shape");

    std::vector<float> ext(size_t((K - 1 + ntok) * cd));  // [kernel-1 + ntok][conv_dim]: conv history + qkv
    std::vector<float> z(size_t(ntok * vd));              // [ntok][value_dim]
    std::vector<float> g(size_t(ntok * nv));              // [ntok][n_v]: alpha x, then log decay
    std::vector<float> beta(size_t(ntok * nv));           // [ntok][n_v]: beta x, then sigmoid
    std::copy(state.conv.begin(), state.conv.end(), ext.begin());
    float* qkv = ext.data() + (K - 1) * cd;  // [ntok][conv_dim]
    const MatmulJob in[] = {{w_.qkv, x, ntok, qkv},
                            {w_.gate, x, ntok, z.data()},
                            {w_.alpha, x, ntok, g.data()},
                            {w_.beta, x, ntok, beta.data()}};
    backend_->matmul_batch(in, 4);

    // Causal depthwise conv + SiLU: conv[t][c] = sum_i w[c][i] ext[t + i][c] (ext row t + K-1 is token t).
    std::vector<float> conv(size_t(ntok * cd));  // [ntok][conv_dim]: q | k | v
    for (int64_t t = 0; t < ntok; ++t) {
        float* o = &conv[t * cd];
        for (int64_t i = 0; i < K; ++i) {
            const float* e = &ext[(t + i) * cd];
            const float* w = &conv_t_[i * cd];
            for (int64_t c = 0; c < cd; ++c) o[c] += w[c] * e[c];
        }
        for (int64_t c = 0; c < cd; ++c) o[c] = silu(o[c]);
    }
    std::copy(ext.end() - (K - 1) * cd, ext.end(), state.conv.begin());
    if (after)  // conv history after token t: ext rows t+1 .. t+K-1
        for (int64_t t = 0; t < ntok; ++t) {
            std::copy(ext.begin() + (t + 1) * cd, ext.begin() + (t + K) * cd, after[t].conv.begin());
        }

    // L2-normalise q and k per head (FLA's eps 1e-6 inside the sqrt); q also by k_dim^-1/2.
    const float q_scale = 1.0f / std::sqrt(float(dk));
    for (int64_t t = 0; t < ntok; ++t)
        for (int64_t h = 0; h < 2 * nk; ++h) {
            float* p = &conv[t * cd + h * dk];
            const float inv = 1.0f / std::sqrt(dot(p, p, dk) + 1e-6f);
            for (int64_t j = 0; j < dk; ++j) p[j] *= inv;
            if (h < nk)
                for (int64_t j = 0; j < dk; ++j) p[j] *= q_scale;
        }
    for (int64_t t = 0; t < ntok; ++t)
        for (int64_t h = 0; h < nv; ++h) {
            float& gi = g[t * nv + h];
            gi = w_.a[h] * softplus(gi + w_.dt_bias[h]);
            beta[t * nv + h] = sigmoid(beta[t * nv + h]);
        }

    // The recurrence per value head, heads spread over the pool; v head h reads k head h % n_k (tiled).
    std::vector<float> core(size_t(ntok * vd));  // [ntok][n_v][v_dim]
    default_pool()->parallel_for(nv, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
            const int64_t kh = h % nk;
            const HeadInputs in{&conv[kh * dk], &conv[kd + kh * dk], &conv[2 * kd + h * dv], cd,
                                &g[h], &beta[h], nv};
            float* S = &state.recurrent[size_t(h * dk * dv)];
            if (after) {
                for (int64_t t = 0; t < ntok; ++t) {
                    const HeadInputs it{in.q + t * cd, in.k + t * cd, in.v + t * cd, cd, in.g + t * nv, in.beta + t * nv, nv};
                    recurrent_scan(it, 1, dk, dv, S, &core[t * vd + h * dv], vd);
                    std::copy(S, S + dk * dv, &after[t].recurrent[size_t(h * dk * dv)]);
                }
            } else if (ntok == 1)
                recurrent_scan(in, ntok, dk, dv, S, &core[h * dv], vd);
            else
                chunked_scan(in, ntok, dk, dv, kChunk, S, &core[h * dv], vd);
        }
    });

    // Gated RMSNorm per (token, head): rms_norm(o) * norm * act(z). Not nn::rms_norm: FLA's order is
    // norm * (o * inv) with the float32 sum of squares, kept as the layer was validated against it.
    for (int64_t r = 0; r < ntok * nv; ++r) {
        float* o = &core[r * dv];
        const float* zr = &z[r * dv];
        const float inv = 1.0f / std::sqrt(dot(o, o, dv) / float(dv) + s.eps);
        for (int64_t j = 0; j < dv; ++j) {
            const float gate = s.gate_act == GdnGateAct::Sigmoid ? sigmoid(zr[j]) : silu(zr[j]);
            o[j] = w_.norm[j] * (o[j] * inv) * gate;
        }
    }
    backend_->matmul(w_.out, core.data(), ntok, y);
}

}  // namespace regolith
