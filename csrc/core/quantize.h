// Reference quantizers: float32 rows -> GGUF block bytes.
//
// Byte-identical to gguf-py's numpy quantizers (x86-64) for F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0,
// including blocks holding inf/NaN and subnormals (numpy casts non-finite floats to integer code 0 there, and
// so do we). Q4_K, Q6_K and IQ4_NL follow llama.cpp's reference quantizers (make_qkx2_quants-style
// scale/min search, make_qx_quants, IQ4_NL's best-scale search); Q2_0 follows upstream ggml's
// quantize_row_q2_0_ref. Single-threaded: callers parallelise over rows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace regolith {

// True if quantize_row() can produce this type.
bool can_quantize(uint32_t type);

// Bytes of n elements of `type`. Throws regolith::Error for types quantize_row() does not produce or n not a
// multiple of the block size.
size_t quantized_row_bytes(uint32_t type, int64_t n);

// Quantize n floats to quantized_row_bytes(type, n) bytes at dst. Throws regolith::Error as above.
void quantize_row(uint32_t type, const float* src, void* dst, int64_t n);

}  // namespace regolith
