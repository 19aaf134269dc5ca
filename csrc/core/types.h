// Type traits for GGUF tensor types: names, block geometry, and which ones regolith computes with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "quant.h"

namespace regolith {

struct TypeTraits {
    std::string_view name;  // ggml's name, e.g. "Q4_K"
    int64_t block_elems;    // elements per block (1 for plain types)
    int64_t block_bytes;    // bytes per block
    bool supported;         // regolith can dequantize it and multiply with it
};

// Traits for a GGUF type id; nullptr for ids GGUF does not define.
const TypeTraits* type_traits(uint32_t type_id);

// Bytes used by n elements of a type (n must be a multiple of the block size).
inline int64_t type_row_bytes(const TypeTraits& t, int64_t n) { return n / t.block_elems * t.block_bytes; }

// Type id for a ggml type name ("Q4_K"); -1 if unknown.
int type_from_name(std::string_view name);

}  // namespace regolith
