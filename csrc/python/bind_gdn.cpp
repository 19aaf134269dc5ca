// Internal binding of one Gated DeltaNet layer loaded from a GGUF, for tests against transformers.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "numpy_out.h"
#include "core/gguf.h"
#include "core/ops.h"
#include "model/gated_delta_net.h"

using regolith::GdnShape;
using regolith::GdnState;

namespace {

using In = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

struct PyGdnState {
    GdnShape shape;
    GdnState state;
};

class PyGdnLayer {
public:
    PyGdnLayer(const std::string& path, int64_t layer, const std::string& gate)
        : file_(std::make_unique<regolith::GgufFile>(path)),
          layer_(regolith::load_gdn_layer(*file_, layer, parse_gate(gate))),
          net_(layer_.shape, layer_.weights, regolith::cpu_backend()) {}

    const GdnShape& shape() const { return layer_.shape; }
    PyGdnState new_state() const { return {layer_.shape, net_.new_state()}; }

    Out forward(In x, PyGdnState& st) {
        const GdnShape& s = layer_.shape;
        if (int64_t(x.shape(1)) != s.hidden)
            throw nb::value_error(("x must have shape (ntok, " + std::to_string(s.hidden) + ")").c_str());
        const int64_t ntok = int64_t(x.shape(0));
        float* y;
        Out out = new_array({size_t(ntok), size_t(s.hidden)}, &y);
        {
            nb::gil_scoped_release release;
            net_.forward(x.data(), ntok, st.state, y);
        }
        return out;
    }

private:
    static regolith::GdnGateAct parse_gate(const std::string& g) {
        if (g == "sigmoid") return regolith::GdnGateAct::Sigmoid;
        if (g == "silu") return regolith::GdnGateAct::Silu;
        throw nb::value_error("gate must be 'sigmoid' or 'silu'");
    }

    std::unique_ptr<regolith::GgufFile> file_;
    regolith::GdnLayer layer_;
    regolith::GatedDeltaNet net_;
};

// A writable numpy view of a state vector, kept alive by the state object.
template <size_t N>
nb::ndarray<nb::numpy, float, nb::ndim<N>> view(std::vector<float>& v, const size_t (&shape)[N], nb::handle owner) {
    return nb::ndarray<nb::numpy, float, nb::ndim<N>>(v.data(), N, shape, owner);
}

}  // namespace

void init_gdn(nb::module_& m) {
    nb::class_<PyGdnState>(m, "GdnState", "Decoding state of one Gated DeltaNet layer (conv + recurrent).")
        .def_prop_ro(
            "conv",
            [](nb::handle self) {
                auto& s = nb::cast<PyGdnState&>(self);
                const size_t shape[2] = {size_t(s.shape.conv_kernel - 1), size_t(s.shape.conv_dim())};
                return view(s.state.conv, shape, self);
            },
            "float32 (kernel-1, conv_dim) view: the last conv inputs, oldest first, GGUF channel order.")
        .def_prop_ro(
            "recurrent",
            [](nb::handle self) {
                auto& s = nb::cast<PyGdnState&>(self);
                const size_t shape[3] = {size_t(s.shape.n_v_heads), size_t(s.shape.k_dim), size_t(s.shape.v_dim)};
                return view(s.state.recurrent, shape, self);
            },
            "float32 (n_v_heads, k_dim, v_dim) view of the delta-rule state, GGUF (tiled) head order.")
        .def("reset", [](PyGdnState& s) { s.state.reset(); })
        .def("copy", [](const PyGdnState& s) { return PyGdnState(s); })
        .def(
            "copy_from", [](PyGdnState& s, const PyGdnState& o) { s.state.copy_from(o.state); }, nb::arg("other"));

    nb::class_<PyGdnLayer>(m, "GatedDeltaNetLayer", "One qwen4exp Gated DeltaNet layer read from a GGUF (internal).")
        .def(nb::init<const std::string&, int64_t, const std::string&>(), nb::arg("gguf_path"), nb::arg("layer"),
             nb::arg("gate") = "sigmoid")
        .def("new_state", &PyGdnLayer::new_state)
        .def("forward", &PyGdnLayer::forward, nb::arg("x"), nb::arg("state"),
             "x: float32 (ntok, hidden) -> float32 (ntok, hidden); advances state by ntok tokens.")
        .def_prop_ro("shape", [](const PyGdnLayer& l) {
            const GdnShape& s = l.shape();
            nb::dict d;
            d["hidden"] = s.hidden;
            d["n_k_heads"] = s.n_k_heads;
            d["n_v_heads"] = s.n_v_heads;
            d["k_dim"] = s.k_dim;
            d["v_dim"] = s.v_dim;
            d["conv_kernel"] = s.conv_kernel;
            d["eps"] = s.eps;
            return d;
        });
}
