// Bindings of the speculative-decoding core (regolith.speculative wraps them).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/errors.h"
#include "core/suffix_drafter.h"
#include "model/qwen4exp.h"
#include "numpy_out.h"

using regolith::SuffixDrafter;

namespace {

using Ids = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Positions = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

// A qwen4exp model's MTP head with its own attention state, for tests against a reference.
struct MtpHeadHandle {
    std::unique_ptr<regolith::Qwen4ExpModel> model;
    regolith::MtpCache state;
    std::unique_ptr<regolith::Workspace> ws;
};

}  // namespace

void init_spec(nb::module_& m) {
    nb::class_<SuffixDrafter>(m, "SuffixDrafter", "Suffix-automaton drafter (core/suffix_drafter.h).")
        .def(nb::init<>())
        .def_prop_ro("size", &SuffixDrafter::size)
        .def_prop_ro("text", &SuffixDrafter::text)
        .def(
            "append", [](SuffixDrafter& d, Ids ids) { d.append(ids.data(), int64_t(ids.shape(0))); }, nb::arg("ids"))
        .def(
            "push",
            [](SuffixDrafter& d, int32_t id) {
                d.append(&id, 1);
                return d.match_len();
            },
            nb::arg("id"), "Appends one token; returns the match length a draft proposed now would continue.")
        .def("set_wakes", &SuffixDrafter::set_wakes, nb::arg("wakes"),
             "Per match length (the last entry for every longer one): whether it wakes the speculator.")
        .def("push_wakes", &SuffixDrafter::push_wakes, nb::arg("id"), nb::arg("expected"),
             "Appends one token when the text holds `expected` tokens (else -1, nothing appended); returns "
             "whether the new match length wakes the speculator (set_wakes), 1 or 0.")
        .def("truncate", &SuffixDrafter::truncate, nb::arg("n"))
        .def_prop_ro("match_len", &SuffixDrafter::match_len,
                     "The match length a draft proposed now would continue (0: none).")
        .def(
            "propose",
            [](const SuffixDrafter& d, int64_t max_tokens, int64_t min_match) {
                regolith::SuffixDraft r = d.propose(max_tokens, min_match);
                return nb::make_tuple(r.tokens, r.match_len);
            },
            nb::arg("max_tokens"), nb::arg("min_match") = 1,
            "(tokens, match_len): what followed the latest earlier occurrence of the longest repeated suffix.");

    nb::class_<MtpHeadHandle>(m, "MtpHeadBlock",
                              "A qwen4exp, qwen35moe or qwen3next GGUF's MTP head over its own attention state.")
        .def("__init__",
             [](MtpHeadHandle* self, const std::string& path, int64_t max_ctx) {
                 auto model = std::make_unique<regolith::Qwen4ExpModel>(std::vector<std::vector<std::string>>{{path}});
                 if (!model->mtp()) throw regolith::ModelFormatError(path + " has no MTP head");
                 regolith::MtpCache st = model->mtp()->new_state(model->backend(), max_ctx);
                 auto ws = std::make_unique<regolith::Workspace>(model->backend());
                 new (self) MtpHeadHandle{std::move(model), std::move(st), std::move(ws)};
             },
             nb::arg("path"), nb::arg("max_ctx"))
        .def(
            "forward",
            [](MtpHeadHandle& self, Rows h, Ids tokens, Positions positions) {
                const regolith::MtpHead& head = *self.model->mtp();
                const int64_t n = int64_t(tokens.shape(0)), H = head.hidden();
                if (int64_t(h.shape(0)) != n || int64_t(h.shape(1)) != H || int64_t(positions.shape(0)) != n)
                    throw nb::value_error("h must be [n][hidden] and positions [n] for n tokens");
                regolith::Backend& be = self.model->backend();
                regolith::Workspace& ws = *self.ws;
                const regolith::Tensor ht = ws.f32(n, H), o = ws.f32(n, H), lg = ws.f32(n, head.vocab());
                be.write(ht, h.data());
                head.forward(ws, ht, tokens.data(), positions.data(), self.state, o);
                head.logits(ws, o, lg);
                float *o_out, *l_out;
                Out o_arr = new_array({size_t(n), size_t(H)}, &o_out);
                Out l_arr = new_array({size_t(n), size_t(head.vocab())}, &l_out);
                be.read(o, o_out);
                be.read(lg, l_out);
                ws.reset();
                return nb::make_tuple(o_arr, l_arr);
            },
            nb::arg("h"), nb::arg("tokens"), nb::arg("positions"),
            "(o, logits) for the pairs (h[t], tokens[t]) at positions[t]; they join the head's state.");
}
