// Internal bindings of the qwen4exp PLE layer (tests and, later, the Python model).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cerrno>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "bindings.h"
#include "component.h"
#include "numpy_out.h"
#include "core/gguf_set.h"
#include "model/ple.h"

using regolith::GgufSet;
using regolith::PleHashParams;
using regolith::PleLayer;
using regolith::PleState;

namespace {

using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Context = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Hidden = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Rows = nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>;
using Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

// A PLE layer together with the mapped file and backend weights it uses.
struct PyPleLayer {
    std::unique_ptr<ComponentFile> c;
    std::unique_ptr<PleLayer> layer;
};

Rows ngram_rows(Tokens tokens, Context context, int64_t eos_token_id, std::vector<int64_t> multipliers,
                std::vector<int64_t> head_offsets, std::vector<int64_t> head_vocab_sizes,
                int64_t heads_per_ngram) {
    PleHashParams p;
    p.ngram_size = int64_t(multipliers.size());
    p.heads_per_ngram = heads_per_ngram;
    p.eos_token_id = eos_token_id;
    p.multipliers = std::move(multipliers);
    p.head_offsets = std::move(head_offsets);
    p.head_vocab_sizes = std::move(head_vocab_sizes);
    const int64_t heads = p.n_heads();
    if (p.ngram_size < 2 || heads_per_ngram < 1)
        throw nb::value_error("need >= 2 multipliers and >= 1 head per n-gram");
    if (int64_t(p.head_offsets.size()) != heads || int64_t(p.head_vocab_sizes.size()) != heads)
        throw nb::value_error(
            "head_offsets and head_vocab_sizes need (len(multipliers)-1)*heads_per_ngram entries");
    for (int64_t s : p.head_vocab_sizes)
        if (s < 1) throw nb::value_error("head_vocab_sizes must be positive");
    if (int64_t(context.shape(0)) != p.ngram_size - 1)
        throw nb::value_error("context needs len(multipliers)-1 ids");
    const int64_t ntok = int64_t(tokens.shape(0));
    int64_t* rows = nullptr;
    Rows out = new_array({size_t(ntok), size_t(heads)}, &rows);
    regolith::ple_ngram_rows(p, context.data(), tokens.data(), ntok, rows);
    return out;
}

Out forward(PyPleLayer& self, Tokens tokens, Hidden hidden, PleState& state) {
    const int64_t ntok = int64_t(tokens.shape(0)), C = self.layer->shape().channels();
    if (int64_t(hidden.shape(0)) != ntok || int64_t(hidden.shape(1)) != C)
        throw nb::value_error(("hidden must have shape (ntok, hc*hidden) = (" + std::to_string(ntok) + ", " +
                               std::to_string(C) + ")")
                                  .c_str());
    const regolith::Tensor h = self.c->upload(hidden.data(), ntok, C), out = self.c->ws->f32(ntok, C);
    {
        nb::gil_scoped_release release;
        self.layer->forward(*self.c->ws, tokens.data(), h, state, out);
    }
    Out result = self.c->download(out);
    self.c->ws->reset();
    return result;
}

}  // namespace

void init_ple(nb::module_& m) {
    nb::class_<PleState>(m, "PleState", "Decoding state of one sequence for one PLE layer.")
        .def_prop_ro(
            "context", [](const PleState& s) { return s.context; }, "Previous token ids, oldest first.");

    m.def("ple_ngram_rows", &ngram_rows, nb::arg("tokens"), nb::arg("context"), nb::arg("eos_token_id"),
          nb::arg("multipliers"), nb::arg("head_offsets"), nb::arg("head_vocab_sizes"),
          nb::arg("heads_per_ngram"),
          "PLE table row ids (ntok, n_heads) int64 of int32 tokens following `context` (ngram_size-1 int64 "
          "ids).");

    nb::class_<PyPleLayer>(m, "PleLayer",
                           "The PLE layer of one qwen4exp decoder layer, table rows read on demand.")
        .def(
            "__init__",
            [](PyPleLayer* self, const std::string& path, int64_t layer, int64_t cache_bytes, bool direct) {
                // Build everything first: nanobind does not destroy an object whose __init__ throws.
                std::unique_ptr<GgufSet> file;
                try {
                    file = std::make_unique<GgufSet>(path);
                } catch (const std::system_error& e) {
                    errno = e.code().value();
                    PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
                    throw nb::python_error();
                }
                regolith::PleReadOptions read;
                read.cache_bytes = cache_bytes;
                read.direct = direct;
                auto c = std::make_unique<ComponentFile>(std::move(file));
                auto ple = std::make_unique<PleLayer>(c->weights(), layer, read);
                new (self) PyPleLayer();
                self->c = std::move(c);
                self->layer = std::move(ple);
            },
            nb::arg("gguf_path"), nb::arg("layer"), nb::arg("cache_bytes") = 0, nb::arg("direct") = true,
            "Load the PLE of decoder layer `layer`; raises ModelFormatError when the file lacks or "
            "contradicts it.")
        .def("new_state", [](const PyPleLayer& s) { return s.layer->new_state(*s.c->be); })
        .def("forward", &forward, nb::arg("token_ids"), nb::arg("hidden"), nb::arg("state"),
             "PLE addend (ntok, hc*hidden) float32 for int32 token_ids (ntok,) and streams hidden (ntok, "
             "hc*hidden); "
             "advances state.")
        .def_prop_ro("rows_read", [](const PyPleLayer& s) { return s.layer->table().rows_read(); })
        .def_prop_ro("cache_hits", [](const PyPleLayer& s) { return s.layer->table().stats().cache_hits; })
        .def_prop_ro("bytes_read", [](const PyPleLayer& s) { return s.layer->table().bytes_read(); })
        .def_prop_ro("rows_per_token", [](const PyPleLayer& s) { return s.layer->rows_per_token(); })
        .def_prop_ro("table_rows", [](const PyPleLayer& s) { return s.layer->table().rows(); })
        .def_prop_ro("channels", [](const PyPleLayer& s) { return s.layer->shape().channels(); });
}
