// Kernel names per weight type: the kernels instantiated through RG_METAL_WEIGHT_TYPES (metal/quants.h) are
// named rg_<op>_<name>, name the lower-case GGUF type name.
#pragma once

#include <cctype>
#include <cstdint>
#include <string>

#include "core/errors.h"
#include "core/types.h"

namespace regolith::metal {

// The lower-case GGUF name of a weight type ("q4_k"): every type regolith supports has its kernels.
inline std::string metal_type_name(uint32_t type) {
    const TypeTraits* t = type_traits(type);
    if (!t || !t->supported)
        throw Error("metal: no kernels for tensor type " + (t ? std::string(t->name) : std::to_string(type)));
    std::string name(t->name);
    for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
    return name;
}

}  // namespace regolith::metal
