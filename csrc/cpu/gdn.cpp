// Gated DeltaNet (model/gated_delta_net.h has the equations): the causal depthwise conv with its state, the
// q/k normalisation and gates, and the delta-rule recurrence — one token at a time (transformers'
// torch_recurrent_gated_delta_rule) or in chunks (torch_chunk_gated_delta_rule, WY/UT form) — per value head
// on the thread pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/kernels.h"
#include "cpu/nn.h"

namespace regolith::cpu {

namespace {

using nn::dot;
using nn::sigmoid;
using nn::silu;

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold 20

// y[j] += a * x[j]
void axpy(float a, const float* x, float* y, int64_t n) {
    for (int64_t j = 0; j < n; ++j) y[j] += a * x[j];
}

// Per-token inputs of one value head after the conv, as strided views into the [ntok][conv_dim] rows.
struct HeadInputs {
    const float* q;     // q of token t: q + t * stride, [k_dim], normalised and scaled
    const float* k;     // [k_dim], normalised
    const float* v;     // [v_dim]
    int64_t stride;     // floats between tokens
    const float* g;     // g of token t: g[t * gstride], log decay (<= 0)
    const float* beta;  // beta[t * gstride]
    int64_t gstride;
};

// The delta rule one token at a time. S: [k_dim][v_dim]; out of token t: out + t * ostride, [v_dim].
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

// The same recurrence in chunks of C tokens: within a chunk, with cum = cumsum(g) and
// T = I + strict_lower(beta_i k_i.k_j exp(cum_i - cum_j)),
//   U = T^-1 (beta v),  W = T^-1 (beta exp(cum) k),  v_new = U - W S
//   o_i = exp(cum_i) q_i S + sum_{j<=i} (q_i.k_j) exp(cum_i - cum_j) v_new_j
//   S  <- exp(cum_last) S + sum_j exp(cum_last - cum_j) k_j v_new_j^T
void chunked_scan(const HeadInputs& in, int64_t ntok, int64_t dk, int64_t dv, int64_t C, float* S, float* out,
                  int64_t ostride) {
    std::vector<float> cum(static_cast<size_t>(C));       // [C]
    std::vector<float> A(static_cast<size_t>(C * C));     // [C][C], strictly lower part used
    std::vector<float> U(static_cast<size_t>(C * dv));    // [C][v_dim]: new values, then v_new
    std::vector<float> W(static_cast<size_t>(C * dk));    // [C][k_dim]
    std::vector<float> dS(static_cast<size_t>(dk * dv));  // [k_dim][v_dim]: this chunk's state update
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
            for (int64_t j = 0; j <= i; ++j) axpy(dot(q(i), k(j), dk) * std::exp(cum[i] - cum[j]), &U[j * dv], o, dv);
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

void ssm_conv(const Rows& x, const Rows& w_t, const std::vector<ConvSeqRows>& seqs, const Rows& out) {
    const int64_t K = w_t.rows, cd = x.cols, hist = K - 1;
    std::vector<float> ext;  // [kernel-1 + ntok][conv_dim]: the conv history, then the sequence's inputs
    for (const ConvSeqRows& s : seqs) {
        ext.resize(size_t((hist + s.ntok) * cd));
        if (hist > 0) std::memcpy(ext.data(), s.state.row(0), size_t(hist * cd) * sizeof(float));
        for (int64_t t = 0; t < s.ntok; ++t)
            std::memcpy(&ext[size_t((hist + t) * cd)], x.row(s.t0 + t), size_t(cd) * sizeof(float));
        // conv[t][c] = sum_i w[i][c] ext[t + i][c] (ext row t + K-1 is token t), then SiLU
        for (int64_t t = 0; t < s.ntok; ++t) {
            float* o = out.row(s.t0 + t);
            std::fill(o, o + cd, 0.0f);
            for (int64_t i = 0; i < K; ++i) {
                const float* e = &ext[size_t((t + i) * cd)];
                const float* w = w_t.row(i);
                for (int64_t c = 0; c < cd; ++c) o[c] += w[c] * e[c];
            }
            for (int64_t c = 0; c < cd; ++c) o[c] = silu(o[c]);
        }
        if (hist > 0) std::memcpy(s.state.row(0), &ext[size_t(s.ntok * cd)], size_t(hist * cd) * sizeof(float));
        if (s.after && hist > 0)  // the history after token t: ext rows t+1 .. t+K-1
            for (int64_t t = 0; t < s.ntok; ++t)
                std::memcpy(s.after.row(t), &ext[size_t((t + 1) * cd)], size_t(hist * cd) * sizeof(float));
    }
}

void gdn_prepare(const Rows& qkv, const Rows& g, const Rows& beta, const Rows& a, const Rows& dt_bias,
                 const GdnDims& d) {
    const int64_t nk = d.n_k_heads, nv = d.n_v_heads, dk = d.k_dim;
    // L2-normalise q and k per head (FLA's eps 1e-6 inside the sqrt); q also by k_dim^-1/2.
    const float q_scale = 1.0f / std::sqrt(float(dk));
    for (int64_t t = 0; t < qkv.rows; ++t)
        for (int64_t h = 0; h < 2 * nk; ++h) {
            float* p = qkv.row(t) + h * dk;
            const float inv = 1.0f / std::sqrt(dot(p, p, dk) + 1e-6f);
            for (int64_t j = 0; j < dk; ++j) p[j] *= inv;
            if (h < nk)
                for (int64_t j = 0; j < dk; ++j) p[j] *= q_scale;
        }
    const float *ar = a.row(0), *dt = dt_bias.row(0);
    for (int64_t t = 0; t < g.rows; ++t)
        for (int64_t h = 0; h < nv; ++h) {
            float& gi = g.row(t)[h];
            gi = ar[h] * softplus(gi + dt[h]);
            float& bi = beta.row(t)[h];
            bi = sigmoid(bi);
        }
}

void gdn_scan(const Rows& qkv, const Rows& g, const Rows& beta, const std::vector<GdnSeqRows>& seqs,
              const GdnDims& d, int64_t chunk, const Rows& out) {
    const int64_t nk = d.n_k_heads, nv = d.n_v_heads, dk = d.k_dim, dv = d.v_dim, kd = d.key_dim();
    const int64_t cs = qkv.stride / int64_t(sizeof(float)), gs = g.stride / int64_t(sizeof(float));
    const int64_t os = out.stride / int64_t(sizeof(float)), hs = dk * dv;
    for (const GdnSeqRows& s : seqs) {
        const float* conv = qkv.row(s.t0);
        const float* gt = g.row(s.t0);
        const float* bt = beta.row(s.t0);
        float* core = out.row(s.t0);
        // v head h reads k head h % n_k (tiled order); heads spread over the pool.
        default_pool()->parallel_for(nv, 1, [&](int64_t h0, int64_t h1) {
            for (int64_t h = h0; h < h1; ++h) {
                const int64_t kh = h % nk;
                const HeadInputs in{conv + kh * dk, conv + kd + kh * dk, conv + 2 * kd + h * dv, cs, gt + h, bt + h, gs};
                float* S = s.state.row(0) + h * hs;
                if (s.after) {
                    for (int64_t t = 0; t < s.ntok; ++t) {
                        const HeadInputs it{in.q + t * cs, in.k + t * cs, in.v + t * cs, cs, in.g + t * gs, in.beta + t * gs, gs};
                        recurrent_scan(it, 1, dk, dv, S, core + t * os + h * dv, os);
                        std::memcpy(s.after.row(t) + h * hs, S, size_t(hs) * sizeof(float));
                    }
                } else if (s.ntok == 1) {
                    recurrent_scan(in, 1, dk, dv, S, core + h * dv, os);
                } else {
                    chunked_scan(in, s.ntok, dk, dv, chunk, S, core + h * dv, os);
                }
            }
        });
    }
}

}  // namespace regolith::cpu
