// Norms over rows: RMSNorm (transformers' float32 form), Gated DeltaNet's gated RMSNorm, LayerNorm.
#include <cmath>

#include "cpu/kernels.h"
#include "cpu/nn.h"

namespace regolith::cpu {

namespace {

// sum over x[0..n) of f(x[i]) in double, in 8 interleaved lanes combined in a fixed order (no serial chain).
template <class F>
double sum_lanes(const float* x, int64_t n, F f) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += f(double(x[i + j]));
    for (; i < n; ++i) acc[0] += f(double(x[i]));
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void rms_norm(const Rows& x, const Rows& w, float eps, const Rows& y) {
    const int64_t n = x.cols;
    for_rows(x.rows, n, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* xr = x.row(r);
            float* yr = y.row(r);
            const float inv = nn::inv_rms(xr, n, eps);
            if (w) {
                const float* wr = w.row(r % w.rows);
                for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * wr[i];
            } else {
                for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv;
            }
        }
    });
}

// FLA's order: norm * (o * inv) with the float32 sum of squares (dot8), as the layer was validated against it.
void rms_norm_gated(const Rows& x, const Rows& z, const Rows& w, float eps, Unary act, const Rows& y) {
    const int64_t n = x.cols;
    const float* wr = w.row(0);
    for (int64_t r = 0; r < x.rows; ++r) {
        const float* o = x.row(r);
        const float* zr = z.row(r);
        float* yr = y.row(r);
        const float inv = 1.0f / std::sqrt(nn::dot(o, o, n) / float(n) + eps);
        for (int64_t j = 0; j < n; ++j) {
            const float gate = act == Unary::Sigmoid ? nn::sigmoid(zr[j]) : nn::silu(zr[j]);
            yr[j] = wr[j] * (o[j] * inv) * gate;
        }
    }
}

void layer_norm(const Rows& x, const Rows& w, const Rows& b, float eps, const Rows& y) {
    const int64_t n = x.cols;
    const float *wr = w.row(0), *br = b.row(0);
    for_rows(x.rows, n, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* xr = x.row(r);
            float* yr = y.row(r);
            const double mean = sum_lanes(xr, n, [](double v) { return v; }) / double(n);
            const double var = sum_lanes(xr, n, [mean](double v) { return (v - mean) * (v - mean); }) / double(n);
            const float m = float(mean), rstd = float(1.0 / std::sqrt(var + double(eps)));
            for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - m) * rstd * wr[i] + br[i];
        }
    });
}

}  // namespace regolith::cpu
