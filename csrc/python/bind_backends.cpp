// The backends of this build and their conformance suite (regolith.backends wraps them).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "core/backend.h"
#include "core/backend_check.h"

void init_backends(nb::module_& m) {
    m.def("backend_names", &regolith::backend_names, "The backends this build has, the reference first.");
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
                out.append(d);
            }
            return out;
        },
        nb::arg("backend"), nb::arg("filter") = "", nb::arg("seed") = 1, nb::arg("ref_seed") = 0,
        "Run the conformance cases whose op contains `filter` on `backend` and on the CPU (inputs from `seed`; "
        "`ref_seed`, if not 0, for the CPU's): a list of {op, case, nmse, tolerance, passed, error}.");
}
