// e^x for x <= 0, branch-free so loops over it vectorise (the sampler's softmax, vision attention and GELU).
#pragma once

#include <cstdint>
#include <cstring>

namespace regolith {

// e^x for x <= 0 (0 below -87, so -inf gives 0; exp(0) == 1 exactly). Cephes' expf: x = n ln2 + r with
// |r| <= ln2/2 (Cody-Waite), a degree-6 polynomial for e^r, times 2^n built in the exponent bits. Checked
// exhaustively over [-87, 0]: within 1 ulp of e^x and monotone, so weights order like logits. Plain float
// operations in a fixed order give the same bits on every platform (libm expf differs between C libraries),
// and the branch-free form vectorises.
inline float exp_nonpos(float x) {
    const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer held in the low bits
    const float xc = x < -87.0f ? -87.0f : x;
    const float t = xc * 1.44269504088896341f + magic;
    const float n = t - magic;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    const float z = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * z + r + 1.0f;
    int32_t t_bits, magic_bits;
    std::memcpy(&t_bits, &t, 4);
    std::memcpy(&magic_bits, &magic, 4);
    const int32_t scale_bits = (t_bits - magic_bits + 127) * (1 << 23);
    float scale;
    std::memcpy(&scale, &scale_bits, 4);
    return x < -87.0f ? 0.0f : y * scale;
}

}  // namespace regolith
