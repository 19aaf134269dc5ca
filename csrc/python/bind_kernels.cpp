#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "core/ops.h"
#include "core/thread_pool.h"
#include "core/types.h"
#include "cpu/isa.h"

namespace {

using Weights = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Acts = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

Out matmul(uint32_t type, Weights w, int64_t cols, Acts x) {
    const regolith::TypeTraits* t = regolith::type_traits(type);
    if (!t) throw nb::value_error(("unknown type id " + std::to_string(type)).c_str());
    if (int64_t(x.shape(1)) != cols) throw nb::value_error("x must have shape (ntok, cols)");
    if (cols % t->block_elems != 0 || int64_t(w.shape(1)) != regolith::type_row_bytes(*t, cols))
        throw nb::value_error("weight rows must hold exactly cols elements of the type");
    const int64_t rows = int64_t(w.shape(0)), ntok = int64_t(x.shape(0));
    float* y = new float[size_t(rows * ntok)];
    nb::capsule owner(y, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
        nb::gil_scoped_release release;
        regolith::WeightView view{type, w.data(), rows, cols, int64_t(w.shape(1))};
        regolith::cpu_backend().matmul(view, x.data(), ntok, y);
    }
    return Out(y, {size_t(ntok), size_t(rows)}, owner);
}

}  // namespace

void init_kernels(nb::module_& m) {
    m.def("matmul", &matmul, nb::arg("type_id"), nb::arg("w"), nb::arg("cols"), nb::arg("x"),
          "y[t, r] = sum_c W[r, c] x[t, c] on the CPU backend. w: uint8 (rows, row_bytes); x: float32 (ntok, cols).");
    m.def(
        "set_isa", [](const std::string& name) { regolith::cpu::set_active_isa(regolith::cpu::isa_from_name(name)); },
        nb::arg("name"), "Select the CPU kernels: 'scalar', 'avx2' or 'neon'.");
    m.def("isa", [] { return std::string(regolith::cpu::isa_name(regolith::cpu::active_isa())); });
    m.def("available_isas", [] {
        std::vector<std::string> out;
        for (auto isa : regolith::cpu::available_isas()) out.emplace_back(regolith::cpu::isa_name(isa));
        return out;
    });
    m.def("set_threads", &regolith::set_default_threads, nb::arg("n"), "Threads for CPU kernels (0: all cores).");
    m.def("threads", &regolith::default_threads);
}
