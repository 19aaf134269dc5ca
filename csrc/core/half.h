// IEEE binary16 and bfloat16 conversions, exact and portable (no ISA intrinsics; CUDA device code converts
// finite binary16 values with the hardware instruction, which is exact too).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/isa_namespace.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace regolith {
inline namespace RG_ISA_NS {

RG_HD inline float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

RG_HD inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Exact: every binary16 value (subnormals, inf, NaN payloads) maps to the same float32 value.
RG_HD inline float fp16_to_fp32(uint16_t h) {
#if defined(__CUDA_ARCH__)
    if ((h & 0x7c00) != 0x7c00) return __half2float(__ushort_as_half(h));  // finite: the hardware conversion is exact
#endif
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    // zero or subnormal: man * 2^-24
    const float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

// Round to nearest even, overflow to inf, NaN stays NaN (quiet).
RG_HD inline uint16_t fp32_to_fp16(float f) {
    const uint32_t x = f32_bits(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00 | ((ax >> 13) & 0x3ff));  // NaN
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);                          // rounds to >= 65520: inf
    if (ax < 0x38800000u) {                                                          // subnormal half or zero
        // value * 2^24 rounded to nearest even integer gives the subnormal mantissa
        const float v = f32_from_bits(ax) * 16777216.0f;
        const uint32_t m = uint32_t(v);
        const float frac = v - float(m);
        uint32_t r = m + (frac > 0.5f || (frac == 0.5f && (m & 1)));
        return uint16_t(sign | r);
    }
    uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15 (in the bits above the 13 dropped ones)
    r += 0x0fffu + ((r >> 13) & 1);  // round to nearest even
    return uint16_t(sign | (r >> 13));
}

RG_HD inline float bf16_to_fp32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet bit forced), as torch and gguf do.
RG_HD inline uint16_t fp32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return uint16_t(x >> 16);
}

}  // namespace RG_ISA_NS
}  // namespace regolith
