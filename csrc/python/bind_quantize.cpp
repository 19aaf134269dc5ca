#include <nanobind/ndarray.h>

#include <cstring>

#include "bindings.h"
#include "numpy_out.h"
#include "core/errors.h"
#include "core/quantize.h"

namespace {

using FloatRow = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using ByteRow = nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>;

ByteRow quantize(uint32_t type_id, FloatRow data) {
    const int64_t n = int64_t(data.shape(0));
    const size_t nbytes = regolith::quantized_row_bytes(type_id, n);  // validates type and length
    uint8_t* out;
    ByteRow row = new_array({nbytes}, &out);
    {
        nb::gil_scoped_release release;
        regolith::quantize_row(type_id, data.data(), out, n);
    }
    return row;
}

}  // namespace

void init_quantize(nb::module_& m) {
    m.def("quantize", &quantize, nb::arg("type_id"), nb::arg("data").noconvert(),
          nb::sig("def quantize(type_id: int, data: numpy.ndarray[dtype=float32, shape=(*), order='C']) "
                  "-> numpy.ndarray[dtype=uint8, shape=(*)]"),
          "Quantize a 1-D C-contiguous float32 array (length a multiple of the block size) to GGUF block "
          "bytes. Raises RegolithError for unsupported types, bad lengths, or inf/NaN where the type "
          "cannot hold them.");
    m.def(
        "can_quantize", [](uint32_t type_id) { return regolith::can_quantize(type_id); }, nb::arg("type_id"),
        "Whether quantize() produces this GGUF type id.");
}
