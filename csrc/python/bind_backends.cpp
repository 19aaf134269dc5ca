// The backends of this build and their conformance suite (regolith.backends wraps them).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "core/backend.h"
#include "core/backend_check.h"
#include "core/buffers.h"
#include "core/types.h"
#include "numpy_out.h"

namespace {

using F32Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// Backend::store_rows of x on a backend: the stored rows' bytes [rows][row bytes] and, for i8, the scales.
nb::tuple store_rows(const std::string& backend, const std::string& kv_type, F32Rows x) {
    regolith::Backend& be = regolith::backend_by_name(backend);
    const int64_t rows = int64_t(x.shape(0)), cols = int64_t(x.shape(1));
    uint32_t type = RG_TYPE_COUNT;
    for (uint32_t t : {RG_TYPE_F32, RG_TYPE_F16, RG_TYPE_Q8_0, RG_TYPE_I8})
        if (kv_type == regolith::cache_type_name(t)) type = t;
    if (type == RG_TYPE_COUNT) throw nb::value_error(("not a cache type: '" + kv_type + "'").c_str());
    if (type == RG_TYPE_Q8_0 && cols % QK8_0 != 0) throw nb::value_error("q8_0 rows are whole blocks of 32");
    const size_t row = size_t(regolith::type_row_bytes(*regolith::type_traits(type), cols));
    uint8_t* bytes;
    auto out = new_array<uint8_t>({size_t(rows), row}, &bytes);
    float* scales;
    auto out_scales = new_array<float>({size_t(rows), size_t(1)}, &scales);
    {
        nb::gil_scoped_release release;
        regolith::Workspace ws(be);
        const regolith::Tensor xt = ws.f32(rows, cols), dst = ws.alloc(type, rows, cols);
        const regolith::Tensor sc = type == RG_TYPE_I8 ? ws.f32(rows, 1) : regolith::Tensor{};
        be.write(xt, x.data());
        be.store_rows(xt, dst, sc);
        be.read(dst, bytes);
        if (sc) be.read(sc, scales);
    }
    if (type == RG_TYPE_I8) return nb::make_tuple(out, out_scales);
    return nb::make_tuple(out, nb::none());
}

}  // namespace

void init_backends(nb::module_& m) {
    m.def("store_rows", &store_rows, nb::arg("backend"), nb::arg("kv_type"), nb::arg("x"),
          "Backend.store_rows of float32 rows x into an attention cache of kv_type ('f32', 'f16', 'q8_0', "
          "'i8'): "
          "(the rows' bytes as uint8 (rows, row bytes), the i8 row scales (rows, 1) or None).");
    m.def("backend_names", &regolith::backend_names, "The backends this build has, the reference first.");
    m.def(
        "backend_cache_types",
        [](const std::string& name) {
            const regolith::Backend& be = regolith::backend_by_name(name);
            std::vector<std::string> out;
            for (uint32_t t : {RG_TYPE_F32, RG_TYPE_F16, RG_TYPE_Q8_0, RG_TYPE_I8})
                if (be.supports_cache(t)) out.push_back(regolith::cache_type_name(t));
            return out;
        },
        nb::arg("backend"), "The attention cache types the backend has kernels for (Backend::supports_cache).");
    m.def(
        "device_memory",
        [](const std::string& name) -> nb::object {
            uint64_t free_bytes = 0, total_bytes = 0;
            if (!regolith::backend_by_name(name).device_memory(&free_bytes, &total_bytes)) return nb::none();
            return nb::make_tuple(free_bytes, total_bytes);
        },
        nb::arg("backend"),
        "(free, total) bytes of the backend's own device memory (a GPU's VRAM); None where its memory is the "
        "host's RAM.");
    m.def(
        "backend_device", [](const std::string& name) { return regolith::backend_by_name(name).device_name(); },
        nb::arg("backend"), "The device the backend runs on (a GPU's name); empty for the host's CPU.");
    m.def(
        "check_backend",
        [](const std::string& name, const std::string& filter, uint64_t seed, uint64_t ref_seed) {
            regolith::Backend& be = regolith::backend_by_name(name);
            std::vector<regolith::OpCheck> results;
            {
                nb::gil_scoped_release release;
                results = regolith::check_backend(be, regolith::cpu_backend(), filter, seed, ref_seed);
            }
            nb::list out;
            for (const regolith::OpCheck& r : results) {
                nb::dict d;
                d["op"] = r.op;
                d["case"] = r.shape;
                d["nmse"] = r.nmse;
                d["tolerance"] = r.tolerance;
                d["passed"] = r.passed;
                d["error"] = r.error;
                d["skipped"] = r.skipped;
                out.append(d);
            }
            return out;
        },
        nb::arg("backend"), nb::arg("filter") = "", nb::arg("seed") = 1, nb::arg("ref_seed") = 0,
        "Run the conformance cases whose op contains `filter` on `backend` and on the CPU (inputs from `seed`; "
        "`ref_seed`, if not 0, for the CPU's): a list of {op, case, nmse, tolerance, passed, error}.");
}
