// Reference quantizers: float32 rows -> GGUF block bytes.
//
// Byte-identical to gguf-py's numpy quantizers (x86-64) for F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0,
// including all-zero blocks, subnormals and blocks holding inf/NaN: numpy casts non-finite floats to integer
// code 0 there, and so do we. Caveat: numpy's max/min reductions (Q4_1, Q5_1, Q8_0) choose among NaNs, and
// between +0 and -0, by SIMD lane order, which depends on the machine; we store the default NaN and let the
// last of equal zeros win, so a block holding a non-default NaN, or both +0 and -0 as its min or max, may
// differ from gguf in its fp16 scale/min bits (never in its codes or decoded values).
//
// Q4_K, Q6_K, IQ4_NL and Q2_0 implement the algorithms of llama.cpp's quantize_row_q4_K_ref
// (make_qkx2_quants scale/min search), quantize_row_q6_K_ref (make_qx_quants), quantize_iq4_nl without an
// importance matrix (the best-scale search llama-quantize runs, 7 tries each side) and quantize_row_q2_0_ref;
// on finite input their bytes equal those functions' when compiled without fp contraction. These four reject
// inf/NaN. Single-threaded: callers parallelise over rows.
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

// The seed's int8 row with one scale (the I8 attention cache, Backend::store_rows): returns s = max|x| / 127
// and q[i] = round(x[i] * (1 / s)) (0 where s is 0), rounded as Q8_0's codes are.
float quantize_i8_row(const float* x, int8_t* q, int64_t n);

}  // namespace regolith
