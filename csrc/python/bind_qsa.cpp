// Internal: one QSA attention layer of a qwen4exp GGUF, for tests against the transformers reference.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "numpy_out.h"
#include "core/gguf.h"
#include "core/ops.h"
#include "model/qsa_attention.h"

namespace {

using regolith::QsaAttention;
using regolith::QsaState;

using Hidden = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Positions = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

// Owns the mapped file the layer's weights point into.
struct QsaAttentionLayer {
    QsaAttentionLayer(const std::string& path, int64_t layer)
        : file(std::make_shared<regolith::GgufFile>(path)),
          attn(make(*file, layer)) {}

    static QsaAttention make(const regolith::GgufFile& f, int64_t layer) {
        const regolith::QsaShape shape = regolith::qsa_shape_from_gguf(f, layer);
        return QsaAttention(shape, regolith::qsa_weights_from_gguf(f, layer, shape), regolith::cpu_backend());
    }

    Out forward(Hidden x, Positions positions, QsaState& state) const {
        const int64_t ntok = int64_t(x.shape(0)), hidden = attn.shape().hidden;
        if (int64_t(x.shape(1)) != hidden)
            throw nb::value_error(("x must have shape (ntok, " + std::to_string(hidden) + ")").c_str());
        if (int64_t(positions.shape(0)) != ntok) throw nb::value_error("positions must have shape (ntok,)");
        float* y;
        Out out = new_array({size_t(ntok), size_t(hidden)}, &y);
        {
            nb::gil_scoped_release release;
            attn.forward(x.data(), positions.data(), ntok, state, y);
        }
        return out;
    }

    std::shared_ptr<regolith::GgufFile> file;
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
            "new_state", [](const QsaAttentionLayer& l, int64_t max_ctx) { return l.attn.new_state(max_ctx); },
            nb::arg("max_ctx"))
        .def("forward", &QsaAttentionLayer::forward, nb::arg("x"), nb::arg("positions"), nb::arg("state"),
             nb::sig("def forward(self, x: numpy.ndarray[float32], positions: numpy.ndarray[int64], state: QsaState) "
                     "-> numpy.ndarray[float32]"),
             "y (ntok, hidden) for x (ntok, hidden) after the state's tokens; appends the tokens to the state.")
        .def_prop_ro("block_topk", [](const QsaAttentionLayer& l) { return l.attn.shape().block_topk(); })
        .def_prop_ro("compress_ratio", [](const QsaAttentionLayer& l) { return l.attn.shape().compress_ratio; });
}
