// The vision tower's own ops (model/vision.h): the bilinear position grid, the rotated and padded q/k and
// transposed v of one frame's attention, its softmax and GELUs. exp_nonpos keeps their exponentials
// branch-free, so the loops vectorise (this file builds with -fno-trapping-math; results are unchanged).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/exp_nonpos.h"
#include "cpu/kernels.h"

namespace regolith::cpu {

namespace {

// sum over x[0..n) in double, in 8 interleaved lanes combined in a fixed order (no serial chain).
double sum_lanes(const float* x, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += double(x[i + j]);
    for (; i < n; ++i) acc[0] += double(x[i]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// transformers' gelu_pytorch_tanh (the ViT blocks), tanh(u) = sign(u) (1 - e) / (1 + e) with e = e^(-2|u|).
float gelu_tanh(float x) {
    const float beta = float(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    const float u = beta * (x + kappa * x * x * x);
    const float e = exp_nonpos(-2.0f * std::fabs(u));
    return 0.5f * x * (1.0f + std::copysign((1.0f - e) / (1.0f + e), u));
}
// torch.nn.GELU() (the merger), in float.
float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * float(M_SQRT1_2))); }

}  // namespace

void gelu_rows(const Rows& x, Unary op, const Rows& y) {
    for_rows(x.rows, x.cols, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* a = x.row(r);
            float* b = y.row(r);
            if (op == Unary::GeluErf)
                for (int64_t i = 0; i < x.cols; ++i) b[i] = gelu_erf(a[i]);
            else
                for (int64_t i = 0; i < x.cols; ++i) b[i] = gelu_tanh(a[i]);
        }
    });
}

void add_interpolated(const Rows& table, const Rows& idx, const Rows& w, const Rows& x) {
    const int64_t H = x.cols;
    for_rows(x.rows, 4 * H, [&](int64_t r0, int64_t r1) {
        std::vector<float> pos(static_cast<size_t>(H));
        for (int64_t r = r0; r < r1; ++r) {
            std::fill(pos.begin(), pos.end(), 0.0f);
            for (int j = 0; j < 4; ++j) {
                const float* pe = table.row(idx.row<int32_t>(r)[j]);
                const float wgt = w.row(r)[j];
                for (int64_t d = 0; d < H; ++d) pos[size_t(d)] += pe[d] * wgt;
            }
            float* xr = x.row(r);
            for (int64_t d = 0; d < H; ++d) xr[d] += pos[size_t(d)];
        }
    });
}

void vision_qkv(const Rows& qkv, const Rows& table, int64_t n_head, const Rows& q, const Rows& k, const Rows& vt) {
    const int64_t n = qkv.rows, H = qkv.cols / 3, hd = H / n_head, half = hd / 2, hp = q.cols;
    for_rows(n, qkv.cols, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* cr = table.row(r);
            const float* sr = cr + half;
            for (int64_t h = 0; h < n_head; ++h) {
                const float* row = qkv.row(r) + h * hd;
                for (int64_t part = 0; part < 2; ++part) {  // q, k rotated: pairs (j, j + hd/2); zero padding
                    const float* src = row + part * H;
                    float* dst = (part == 0 ? q : k).row(h * n + r);
                    for (int64_t j = 0; j < half; ++j) {
                        const float a = src[j], bb = src[j + half];
                        dst[j] = a * cr[j] - bb * sr[j];
                        dst[j + half] = bb * cr[j] + a * sr[j];
                    }
                    std::fill(dst + hd, dst + hp, 0.0f);
                }
                for (int64_t d = 0; d < hd; ++d) vt.row(h * hd + d)[r] = row[2 * H + d];
            }
        }
    });
}

// (std::max, not std::fmax: scores are never NaN, and fmax is a libm call per element.)
void softmax_scaled(const Rows& x, float scale) {
    const int64_t n = x.cols;
    for_rows(x.rows, n, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            float* s = x.row(r);
            float lane[8];
            for (int j = 0; j < 8; ++j) lane[j] = -std::numeric_limits<float>::infinity();
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                for (int j = 0; j < 8; ++j) lane[j] = std::max(lane[j], s[i + j] * scale);
            for (; i < n; ++i) lane[0] = std::max(lane[0], s[i] * scale);
            const float mx = std::max(std::max(std::max(lane[0], lane[1]), std::max(lane[2], lane[3])),
                                      std::max(std::max(lane[4], lane[5]), std::max(lane[6], lane[7])));
            for (i = 0; i < n; ++i) s[i] = exp_nonpos(s[i] * scale - mx);
            const float inv = float(1.0 / sum_lanes(s, n));
            for (i = 0; i < n; ++i) s[i] *= inv;
        }
    });
}

}  // namespace regolith::cpu
