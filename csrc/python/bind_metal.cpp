// The Metal emulator's test hooks: run one kernel of the emulator's library on numpy buffers, and choose the
// order threads run in between waits (tests/test_metal_emulator.py).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "metal/emu/kernel_registry.h"

namespace {

using Buffer = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void emu_dispatch(const std::string& kernel, std::vector<Buffer> buffers,
                  std::tuple<uint32_t, uint32_t, uint32_t> grid, uint32_t threads, uint32_t shmem) {
    const regolith::metal_emu::KernelEntry* k = regolith::metal_emu::find_kernel(kernel.c_str());
    if (!k) throw nb::value_error(("the emulator has no kernel " + kernel).c_str());
    if (int(buffers.size()) != k->n_buffers)
        throw nb::value_error((kernel + " takes " + std::to_string(k->n_buffers) + " buffers").c_str());
    std::vector<uint8_t*> bindings;
    for (Buffer& b : buffers) bindings.push_back(b.data());
    const uint32_t g[3] = {std::get<0>(grid), std::get<1>(grid), std::get<2>(grid)};
    nb::gil_scoped_release release;
    k->run(kernel.c_str(), bindings.data(), g, threads, shmem);
}

}  // namespace

void init_metal(nb::module_& m) {
    m.def(
        "metal_emu_dispatch", &emu_dispatch, nb::arg("kernel"), nb::arg("buffers"), nb::arg("grid"),
        nb::arg("threads"), nb::arg("shmem") = 0,
        "Run a kernel of the Metal emulator now on uint8 numpy buffers (bound in order), grid x threads with "
        "shmem bytes of threadgroup memory; errors the emulator finds raise.");
    m.def("metal_emu_set_order", &regolith::metal_emu::set_reverse_order, nb::arg("reverse"),
          "Run the emulator's threads in decreasing order between waits (True) or increasing (False).");
}
