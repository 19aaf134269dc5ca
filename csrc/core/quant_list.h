// The quantized types that have a BlockDecoder, for code that instantiates per-type kernels.
#pragma once

#include <type_traits>

#include "core/block_decode.h"

namespace regolith {

// Calls f(std::integral_constant<int, TYPE>{}) for every quantized type with a BlockDecoder.
template <class F>
void for_each_quant_type(F&& f) {
    f(std::integral_constant<int, RG_TYPE_Q4_0>{});
    f(std::integral_constant<int, RG_TYPE_Q8_0>{});
    f(std::integral_constant<int, RG_TYPE_Q4_K>{});
}

}  // namespace regolith
