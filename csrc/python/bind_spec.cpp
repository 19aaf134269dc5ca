// Bindings of the speculative-decoding core (regolith.speculative wraps them).
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "bindings.h"
#include "core/suffix_drafter.h"

using regolith::SuffixDrafter;

namespace {

using Ids = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

}  // namespace

void init_spec(nb::module_& m) {
    nb::class_<SuffixDrafter>(m, "SuffixDrafter", "Suffix-automaton drafter (core/suffix_drafter.h).")
        .def(nb::init<>())
        .def_prop_ro("size", &SuffixDrafter::size)
        .def_prop_ro("text", &SuffixDrafter::text)
        .def(
            "append", [](SuffixDrafter& d, Ids ids) { d.append(ids.data(), int64_t(ids.shape(0))); }, nb::arg("ids"))
        .def("push", [](SuffixDrafter& d, int32_t id) { d.append(&id, 1); }, nb::arg("id"))
        .def("truncate", &SuffixDrafter::truncate, nb::arg("n"))
        .def(
            "propose",
            [](const SuffixDrafter& d, int64_t max_tokens, int64_t min_match) {
                regolith::SuffixDraft r = d.propose(max_tokens, min_match);
                return nb::make_tuple(r.tokens, r.match_len);
            },
            nb::arg("max_tokens"), nb::arg("min_match") = 1,
            "(tokens, match_len): what followed the latest earlier occurrence of the longest repeated suffix.");
}
