// Internal: one QSA attention layer of a qwen4exp GGUF, for tests against the transformers reference.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "component.h"
#include "model/qsa_attention.h"
#include "numpy_out.h"

namespace {

using regolith::QsaAttention;
using regolith::QsaState;

using Positions = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

struct QsaAttentionLayer {
    QsaAttentionLayer(const std::string& path, int64_t layer) : c(path), attn(c.weights(), layer) {}

    F32Out forward(F32Rows x, Positions positions, QsaState& state) {
        const int64_t ntok = int64_t(x.shape(0)), hidden = attn.shape().hidden;
        if (int64_t(x.shape(1)) != hidden)
            throw nb::value_error(("x must have shape (ntok, " + std::to_string(hidden) + ")").c_str());
        if (int64_t(positions.shape(0)) != ntok) throw nb::value_error("positions must have shape (ntok,)");
        std::vector<int64_t> pos3(size_t(3 * ntok));  // text: the position on every M-RoPE section
        for (int64_t t = 0; t < ntok; ++t) std::fill_n(&pos3[size_t(3 * t)], 3, positions.data()[t]);
        const regolith::Tensor xt = c.upload(x.data(), ntok, hidden), y = c.ws->f32(ntok, hidden);
        {
            nb::gil_scoped_release release;
            attn.forward(*c.ws, xt, pos3.data(), state, y);
        }
        F32Out out = c.download(y);
        c.ws->reset();
        return out;
    }

    ComponentFile c;
    QsaAttention attn;
};

}  // namespace

void init_qsa(nb::module_& m) {
    nb::class_<QsaState>(m, "QsaState", "KV, indexer keys and block keys of one QSA layer.")
        .def_prop_ro("size", &QsaState::size, "Tokens held.")
        .def_prop_ro("max_ctx", &QsaState::max_ctx)
        .def_prop_ro("n_blocks", &QsaState::n_blocks, "Complete compressed blocks.")
        .def("truncate", &QsaState::truncate, nb::arg("n"), "Keep the first n tokens.");

    nb::class_<QsaAttentionLayer>(m, "QsaAttentionLayer", "QSA attention layer `layer` of a qwen4exp GGUF.")
        .def(nb::init<const std::string&, int64_t>(), nb::arg("gguf_path"), nb::arg("layer"))
        .def(
            "new_state", [](const QsaAttentionLayer& l, int64_t max_ctx) { return l.attn.new_state(*l.c.be, max_ctx); },
            nb::arg("max_ctx"))
        .def("forward", &QsaAttentionLayer::forward, nb::arg("x"), nb::arg("positions"), nb::arg("state"),
             nb::sig("def forward(self, x: numpy.ndarray[float32], positions: numpy.ndarray[int64], state: QsaState) "
                     "-> numpy.ndarray[float32]"),
             "y (ntok, hidden) for x (ntok, hidden) after the state's tokens; appends the tokens to the state.")
        .def_prop_ro("block_topk", [](const QsaAttentionLayer& l) { return l.attn.shape().block_topk(); })
        .def_prop_ro("compress_ratio", [](const QsaAttentionLayer& l) { return l.attn.shape().compress_ratio; });
}
