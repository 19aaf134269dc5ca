// Internal binding of one Gated DeltaNet layer loaded from a GGUF, for tests against transformers.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "component.h"
#include "model/gated_delta_net.h"
#include "numpy_out.h"

using regolith::GdnShape;
using regolith::GdnStates;

namespace {

struct PyGdnState {
    regolith::Backend* be;
    GdnShape shape;
    std::shared_ptr<GdnStates> state;  // one row

    PyGdnState(regolith::Backend& b, const GdnShape& s) : be(&b), shape(s), state(std::make_shared<GdnStates>(b, s, 1)) {
        state->zero(b);
    }
    PyGdnState copy() const {
        PyGdnState c(*be, shape);
        c.state->copy_row(*be, *state, 0, 0);
        return c;
    }
};

class PyGdnLayer {
public:
    PyGdnLayer(const std::string& path, int64_t layer, const std::string& gate)
        : c_(path), net_(c_.weights(), layer, parse_gate(gate)) {}

    const GdnShape& shape() const { return net_.shape(); }
    PyGdnState new_state() const { return PyGdnState(*c_.be, net_.shape()); }

    F32Out forward(F32Rows x, PyGdnState& st) {
        const GdnShape& s = net_.shape();
        if (int64_t(x.shape(1)) != s.hidden)
            throw nb::value_error(("x must have shape (ntok, " + std::to_string(s.hidden) + ")").c_str());
        if (st.state->conv.t.cols != s.conv_state() || st.state->recurrent.t.cols != s.recurrent_state())
            throw nb::value_error("the state was made for another layer shape");
        const int64_t ntok = int64_t(x.shape(0));
        const regolith::Tensor xt = c_.upload(x.data(), ntok, s.hidden), y = c_.ws->f32(ntok, s.hidden);
        {
            nb::gil_scoped_release release;
            net_.forward(*c_.ws, xt, *st.state, 0, y);
        }
        F32Out out = c_.download(y);
        c_.ws->reset();
        return out;
    }

private:
    static regolith::GdnGateAct parse_gate(const std::string& g) {
        if (g == "sigmoid") return regolith::GdnGateAct::Sigmoid;
        if (g == "silu") return regolith::GdnGateAct::Silu;
        throw nb::value_error("gate must be 'sigmoid' or 'silu'");
    }

    ComponentFile c_;
    regolith::GatedDeltaNet net_;
};

// A new numpy array holding a copy of the backend tensor t, shaped `shape`.
template <size_t N>
nb::ndarray<nb::numpy, float, nb::ndim<N>> read_copy(regolith::Backend& be, const regolith::Tensor& t,
                                                      const size_t (&shape)[N]) {
    float* p;
    auto a = new_array(shape, &p);
    be.read(t, p);
    return a;
}

}  // namespace

void init_gdn(nb::module_& m) {
    nb::class_<PyGdnState>(m, "GdnState", "Decoding state of one Gated DeltaNet layer (conv + recurrent).")
        .def_prop_ro(
            "conv",
            [](const PyGdnState& s) {
                const size_t shape[2] = {size_t(s.shape.conv_kernel - 1), size_t(s.shape.conv_dim())};
                return read_copy(*s.be, s.state->conv.t, shape);
            },
            nb::rv_policy::move, "float32 (kernel-1, conv_dim) copy: the last conv inputs, oldest first, GGUF channel order.")
        .def_prop_ro(
            "recurrent",
            [](const PyGdnState& s) {
                const size_t shape[3] = {size_t(s.shape.n_v_heads), size_t(s.shape.k_dim), size_t(s.shape.v_dim)};
                return read_copy(*s.be, s.state->recurrent.t, shape);
            },
            nb::rv_policy::move, "float32 (n_v_heads, k_dim, v_dim) copy of the delta-rule state, GGUF (tiled) head order.")
        .def("reset", [](PyGdnState& s) { s.state->zero(*s.be); })
        .def("copy", &PyGdnState::copy)
        .def(
            "copy_from", [](PyGdnState& s, const PyGdnState& o) { s.state->copy_row(*s.be, *o.state, 0, 0); },
            nb::arg("other"));

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
