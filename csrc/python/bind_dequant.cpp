#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "numpy_out.h"
#include "core/dequant.h"
#include "core/types.h"

namespace {

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Floats = nb::ndarray<nb::numpy, float, nb::ndim<1>>;

Floats dequantize_impl(uint32_t type_id, Bytes data, int64_t n, bool by_parts) {
    const regolith::TypeTraits* t = regolith::type_traits(type_id);
    if (!t) throw nb::value_error(("unknown ggml type id " + std::to_string(type_id)).c_str());
    if (n < 0 || n % t->block_elems != 0)
        throw nb::value_error((std::string(t->name) + ": n = " + std::to_string(n) +
                               " is not a multiple of the block size " + std::to_string(t->block_elems))
                                  .c_str());
    const int64_t want = regolith::type_row_bytes(*t, n);
    if (int64_t(data.shape(0)) != want)
        throw nb::value_error((std::string(t->name) + ": " + std::to_string(n) + " elements need " +
                               std::to_string(want) + " bytes, got " + std::to_string(data.shape(0)))
                                  .c_str());
    float* out;
    Floats result = new_array({size_t(n)}, &out);
    {
        nb::gil_scoped_release release;
        if (by_parts)
            regolith::dequantize_row_by_parts(type_id, data.data(), out, n);  // may throw: owner frees out
        else
            regolith::dequantize_row(type_id, data.data(), out, n);
    }
    return result;
}

Floats dequantize(uint32_t type_id, Bytes data, int64_t n) { return dequantize_impl(type_id, data, n, false); }
Floats dequantize_parts(uint32_t type_id, Bytes data, int64_t n) { return dequantize_impl(type_id, data, n, true); }

}  // namespace

void init_dequant(nb::module_& m) {
    m.def("dequantize", &dequantize, nb::arg("type_id"), nb::arg("data"), nb::arg("n"),
          "Decode n elements of a GGUF type from a 1-D C-contiguous uint8 array to float32 (bit-exact with "
          "gguf-py). Raises ValueError when the byte count does not match n.");
    m.def("dequantize_parts", &dequantize_parts, nb::arg("type_id"), nb::arg("data"), nb::arg("n"),
          "As dequantize, through the decoders' 32-element parts (the way GPU kernels split a block among lanes); "
          "RegolithError for a type without them.");
    m.def("part_decoded_types", &regolith::part_decoded_types,
          "GGUF type ids whose blocks decode in 32-element parts.");
}
