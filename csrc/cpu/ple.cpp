// The PLE layer's gate and dilated causal conv (model/ple.h has the equations).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/nn.h"

namespace regolith::cpu {

void ple_gate(const Rows& key, const Rows& query, const Rows& value, const Rows& norm_key, const Rows& norm_query,
              const Rows& norm_conv, int64_t hc, float eps, const Rows& gated, const Rows& normed) {
    const int64_t D = value.cols;
    const float inv_sqrt_d = float(1.0 / std::sqrt(double(D)));
    for (int64_t t = 0; t < key.rows; ++t) {
        float* gt = gated.row(t);  // [hc][D]
        for (int64_t s = 0; s < hc; ++s) {
            const float* k = key.row(t) + s * D;
            const float* q = query.row(t) + s * D;
            const float* gk = norm_key.row(0) + s * D;
            const float* gq = norm_query.row(0) + s * D;
            const float ik = nn::inv_rms(k, D, eps), iq = nn::inv_rms(q, D, eps);
            double dot = 0.0;
            for (int64_t d = 0; d < D; ++d) dot += double((k[d] * ik) * gk[d]) * double((q[d] * iq) * gq[d]);
            float g = float(dot) * inv_sqrt_d;
            const float sgn = g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f);
            g = std::sqrt(std::max(std::fabs(g), 1e-6f)) * sgn;  // signed square root
            const float sig = nn::sigmoid(g);
            const float* v = value.row(t);
            for (int64_t d = 0; d < D; ++d) gt[s * D + d] = sig * v[d];
            nn::rms_norm(gt + s * D, D, norm_conv.row(0) + s * D, eps, normed.row(t) + s * D);
        }
    }
}

void ple_conv(const Rows& normed, const Rows& w, int64_t dilation, const std::vector<PleConvSeqRows>& seqs,
              const Rows& out) {
    const int64_t C = normed.cols, K = w.cols, hist = (K - 1) * dilation;
    const float* wc = w.row(0);  // [C][K]
    std::vector<float> xs;      // [hist + ntok][C]: the state's history, then the sequence's normed rows
    for (const PleConvSeqRows& s : seqs) {
        xs.resize(size_t((hist + s.ntok) * C));
        if (hist > 0) std::memcpy(xs.data(), s.state.row(0), size_t(hist * C) * sizeof(float));
        for (int64_t t = 0; t < s.ntok; ++t)
            std::memcpy(&xs[size_t((hist + t) * C)], normed.row(s.t0 + t), size_t(C) * sizeof(float));
        // tap k reads (K-1-k) * dilation tokens back
        for (int64_t t = 0; t < s.ntok; ++t) {
            float* o = out.row(s.t0 + t);
            for (int64_t c = 0; c < C; ++c) {
                float acc = 0.0f;
                for (int64_t k = 0; k < K; ++k) acc += wc[c * K + k] * xs[size_t((hist + t - (K - 1 - k) * dilation) * C + c)];
                o[c] += nn::silu(acc);
            }
        }
        if (hist > 0) std::memcpy(s.state.row(0), &xs[size_t(s.ntok * C)], size_t(hist * C) * sizeof(float));
    }
}

}  // namespace regolith::cpu
