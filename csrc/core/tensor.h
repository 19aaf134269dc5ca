// Tensors as the core sees them: a handle to backend-owned memory plus a 2-D shape, never a pointer.
//
// A Tensor names `rows` rows of `cols` elements of one GGUF type in a BackendBuffer, row r starting
// `offset + r * row_bytes` bytes into the buffer. Higher-rank data is flattened into rows by its users (their
// comments give the full shape, e.g. `// [ntok][n_head][head_dim] as rows ntok * n_head`). The buffer is an
// opaque backend object: the core cannot reach its memory except through Backend::read / write / copy.
#pragma once

#include <cstdint>

#include "core/quant.h"

namespace regolith {

// Backend-owned memory. Each backend derives its own buffer type; the core only passes handles around.
class BackendBuffer {
public:
    virtual ~BackendBuffer() = default;
};

// Bytes of one element of the plain (non-block) types; 0 for quantized block types.
constexpr int64_t element_bytes(uint32_t type) {
    switch (type) {
        case RG_TYPE_F32:
        case RG_TYPE_I32:
            return 4;
        case RG_TYPE_F16:
        case RG_TYPE_BF16:
        case RG_TYPE_I16:
            return 2;
        case RG_TYPE_I8:
            return 1;
        case RG_TYPE_I64:
        case RG_TYPE_F64:
            return 8;
        default:
            return 0;
    }
}

struct Tensor {
    BackendBuffer* buffer = nullptr;
    uint64_t offset = 0;  // bytes from the start of the buffer to row 0
    uint32_t type = RG_TYPE_F32;
    int64_t rows = 0, cols = 0;
    int64_t row_bytes = 0;  // stride between rows, >= the bytes of one row

    explicit operator bool() const { return buffer != nullptr; }
    int64_t elt() const { return element_bytes(type); }

    // Rows [r0, r0 + n).
    Tensor row_range(int64_t r0, int64_t n) const {
        Tensor t = *this;
        t.offset += uint64_t(r0 * row_bytes);
        t.rows = n;
        return t;
    }
    // Columns [c0, c0 + n) of every row (plain types).
    Tensor col_range(int64_t c0, int64_t n) const {
        Tensor t = *this;
        t.offset += uint64_t(c0 * elt());
        t.cols = n;
        return t;
    }
    // The same contiguous elements seen as rows x cols (plain types; rows * cols == this->rows * this->cols).
    Tensor reshaped(int64_t r, int64_t c) const {
        Tensor t = *this;
        t.rows = r;
        t.cols = c;
        t.row_bytes = c * elt();
        return t;
    }
    // Every row `step`-th row of this one, starting at row r0: n rows (a strided view, e.g. one stream of
    // [ntok][hc][hidden] rows).
    Tensor every(int64_t r0, int64_t step, int64_t n) const {
        Tensor t = row_range(r0, 1);
        t.rows = n;
        t.row_bytes = row_bytes * step;
        return t;
    }
    bool contiguous() const { return elt() > 0 && row_bytes == cols * elt(); }
};

}  // namespace regolith
