// Gated DeltaNet (model/gated_delta_net.h has the equations): the causal depthwise conv with its state, the
// q/k normalisation and gates, and the delta-rule recurrence per value head on the thread pool (the head
// scan itself, one token at a time or in chunks, is cpu/gdn_scan_impl.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

#include "core/thread_pool.h"
#include "cpu/gdn_scan.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/nn.h"

namespace regolith::cpu {

namespace {

using nn::dot;
using nn::sigmoid;
using nn::silu;

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold 20

// The widest head scan the active kernel set allows (each computes the portable result bit for bit).
GdnHeadScan head_scan_kernel() {
    switch (active_isa()) {
#if defined(RG_HAVE_AVX512)
        case Isa::Avx512:
            return gdn_head_scan_avx512;
#endif
#if defined(RG_HAVE_AVX2)
        case Isa::Avx2:
        case Isa::AvxVnni:
            return gdn_head_scan_avx2;
#endif
        default:
            return gdn_head_scan_portable;
    }
}

// Subnormal floats cost a microcode assist per operation on x86, and the scan makes them wherever a head's
// decay is strong (exps of cumulated log decays, states decaying towards zero): a prefill at Flash-Next's
// shapes ran 2x slower with its random A_log than with mild decays. The scan flushes subnormal inputs and
// results to zero instead (MXCSR FTZ + DAZ; FPCR.FZ on arm64), on the calling thread while it runs.
class FlushSubnormals {
public:
#if defined(__x86_64__) || defined(_M_X64)
    FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
    ~FlushSubnormals() { _mm_setcsr(saved_); }

private:
    unsigned saved_;
#elif defined(__aarch64__)
    FlushSubnormals() {
        asm volatile("mrs %0, fpcr" : "=r"(saved_));
        asm volatile("msr fpcr, %0" : : "r"(saved_ | (uint64_t(1) << 24)));
    }
    ~FlushSubnormals() { asm volatile("msr fpcr, %0" : : "r"(saved_)); }

private:
    uint64_t saved_;
#endif
};

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
        // v head h reads k head h % n_k (tiled order) or h / (n_v / n_k) (grouped); heads spread over the pool.
        const GdnHeadScan scan = head_scan_kernel();
        default_pool()->parallel_for(nv, 1, [&](int64_t h0, int64_t h1) {
            const FlushSubnormals flush;
            for (int64_t h = h0; h < h1; ++h) {
                const int64_t kh = d.grouped ? h / (nv / nk) : h % nk;
                const GdnHead in{conv + kh * dk, conv + kd + kh * dk, conv + 2 * kd + h * dv, cs, gt + h, bt + h, gs};
                float* after = s.after ? s.after.row(0) + h * hs : nullptr;
                const int64_t as = s.after ? s.after.stride / int64_t(sizeof(float)) : 0;
                scan(in, s.ntok, dk, dv, chunk, {s.state.row(0) + h * hs, core + h * dv, os, after, as});
            }
        });
    }
}

}  // namespace regolith::cpu
