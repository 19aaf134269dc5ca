// Small float32 building blocks of the CPU kernels (row-wise, single-threaded). Results match the torch
// reference up to float rounding; every kernel that computes one of these uses this one definition.
#pragma once

#include <cmath>
#include <cstdint>

namespace regolith::nn {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// gpt-oss's clamped SwiGLU (Glu::SwigluOai), in transformers' order of operations.
inline float swiglu_oai(float g, float u) {
    const float c = std::fmin(g, 7.0f), v = std::fmax(std::fmin(u, 7.0f), -7.0f);
    return (v + 1.0f) * (c * sigmoid(c * 1.702f));
}

// Dot product with 8 partial sums, so the compiler can vectorise without reassociating (-ffp-contract=off,
// no fast-math).
inline float dot(const float* a, const float* b, int64_t n) {
    float p[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) p[l] += a[i + l] * b[i + l];
    float s = ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

// 1 / sqrt(mean(x^2) + eps) over n elements: the sum in double, the mean rounded to float as torch's float32
// mean is, the rest in double with one final rounding.
inline float inv_rms(const float* x, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
    return float(1.0 / std::sqrt(double(float(ss / double(n))) + double(eps)));
}

// y = x * inv_rms(x) * w over n elements, in that order (transformers'); w may be null: no scale. y may alias x.
inline void rms_norm(const float* x, int64_t n, const float* w, float eps, float* y) {
    const float inv = inv_rms(x, n, eps);
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
