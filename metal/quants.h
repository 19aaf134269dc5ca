// Dequantization of every weight type, for the kernels: the meaning of each block layout of core/quant.h,
// bit-exact with the CPU's dequantizer (core/block_decode.h: x = scale * q (+ bias), the same float
// operations in the same order, one rounding each), 32 elements at a time.
//
//     RgQuant<TYPE>::QK                        elements per block (a multiple of 32)
//     RgQuant<TYPE>::BYTES                     bytes per block (sizeof the block of core/quant.h)
//     RgQuant<TYPE>::dequant32(block, part, out)
//         out[0..32) = elements [32 part, 32 part + 32) of the block starting at `block`
//
// Blocks sit at multiples of their size from a row's start, so a block is aligned only as its own fields
// need (2 bytes where it has a half). F32, F16 and BF16 are blocks of 32 elements here, so one kernel
// template covers every type. The conformance suite's get_rows cases (exact) compare every type with the
// CPU bit for bit.
#pragma once

#include "compat.h"
#include "core/quant.h"
#include "core/quant_tables.h"

template <uint TYPE>
struct RgQuant;

template <>
struct RgQuant<RG_TYPE_F32> {
    static constexpr int QK = 32, BYTES = 128;
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const float* x = (device const float*)block;
        for (int j = 0; j < 32; ++j) out[j] = x[j];
    }
};

template <>
struct RgQuant<RG_TYPE_F16> {
    static constexpr int QK = 32, BYTES = 64;
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const half* x = (device const half*)block;
        for (int j = 0; j < 32; ++j) out[j] = float(x[j]);
    }
};

template <>
struct RgQuant<RG_TYPE_BF16> {
    static constexpr int QK = 32, BYTES = 64;
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const ushort* x = (device const ushort*)block;
        for (int j = 0; j < 32; ++j) out[j] = as_type<float>(uint(x[j]) << 16);
    }
};

// gguf: x * d
template <>
struct RgQuant<RG_TYPE_Q8_0> {
    static constexpr int QK = QK8_0, BYTES = sizeof(block_q8_0);
    static void dequant32(device const uchar* block, int part, thread float* out) {
        device const block_q8_0* b = (device const block_q8_0*)block;
        const float d = float(b->d);
        for (int j = 0; j < 32; ++j) out[j] = d * float(b->qs[j]);
    }
};
