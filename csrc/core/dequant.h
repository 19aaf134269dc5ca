// Dequantization of a row of any supported GGUF type to float32, bit-exact with gguf-py's numpy reference.
#pragma once

#include <cstdint>
#include <vector>

namespace regolith {

// Decode n elements of type `type` (a GGUF type id) from src into dst[n]. src holds n / block_elems
// consecutive blocks; it need not be aligned. Plain types (F32, F16, BF16) convert exactly, NaN payloads
// included. Throws regolith::Error for a type regolith cannot decode or an n that is not a whole number
// of blocks.
void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);

// The quantized types whose decoders have decode_part (core/block_decode.h), and dequantize_row of one
// of them through its 32-element parts: the same floats, or an Error for a type without parts.
std::vector<uint32_t> part_decoded_types();
void dequantize_row_by_parts(uint32_t type, const void* src, float* dst, int64_t n);

}  // namespace regolith
