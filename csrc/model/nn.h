// Small float32 building blocks shared by the model layers (row-wise, single-threaded; the heavy work is
// in Backend::matmul). Results match the torch reference up to float rounding.
#pragma once

#include <cmath>
#include <cstdint>

namespace regolith::nn {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// y = x / rms(x) * w over n elements (w may be null: no scale). y may alias x.
inline void rms_norm(const float* x, int64_t n, const float* w, float eps, float* y) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const float inv = 1.0f / std::sqrt(float(ss / double(n)) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = w ? x[i] * inv * w[i] : x[i] * inv;
}

// In-place softmax over n logits.
inline void softmax(float* x, int64_t n) {
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = std::fmax(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = float(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace regolith::nn
