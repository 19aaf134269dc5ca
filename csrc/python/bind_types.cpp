#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "bindings.h"
#include "core/types.h"

void init_types(nb::module_& m) {
    m.def(
        "type_info",
        [](uint32_t type_id) -> nb::object {
            const regolith::TypeTraits* t = regolith::type_traits(type_id);
            if (!t) return nb::none();
            return nb::make_tuple(std::string(t->name), t->block_elems, t->block_bytes, t->supported);
        },
        nb::arg("type_id"), "(name, block_elems, block_bytes, supported) for a GGUF type id, or None.");
    m.def("type_count", [] { return int(RG_TYPE_COUNT); });
}
