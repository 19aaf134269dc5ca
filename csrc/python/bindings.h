// One init_<area> per binding file, gathered in module.cpp.
#pragma once

#include <nanobind/nanobind.h>

#include <exception>

namespace nb = nanobind;

// Submits a window's or a backend's recorded ops (ModelWindow::submit, Backend::submit) when a binding
// returns, normally or by an exception: no thread goes back to Python holding a GPU backend's graph capture,
// which would leave every other thread's ops waiting (the server makes windows in one thread and evaluates
// them in another). A submit failing while an exception is already in flight is dropped (that exception is
// the one to report).
template <class T>
class SubmitOnReturn {
public:
    explicit SubmitOnReturn(T& t) : t_(t), in_flight_(std::uncaught_exceptions()) {}
    ~SubmitOnReturn() noexcept(false) {
        if (std::uncaught_exceptions() == in_flight_) {
            t_.submit();
            return;
        }
        try {
            t_.submit();
        } catch (...) {
        }
    }
    SubmitOnReturn(const SubmitOnReturn&) = delete;
    SubmitOnReturn& operator=(const SubmitOnReturn&) = delete;

private:
    T& t_;
    int in_flight_;
};

void init_types(nb::module_& m);
void init_backends(nb::module_& m);
void init_arena(nb::module_& m);
void init_gguf(nb::module_& m);
void init_dequant(nb::module_& m);
void init_quantize(nb::module_& m);
void init_kernels(nb::module_& m);
void init_qsa(nb::module_& m);
void init_gdn(nb::module_& m);
void init_ple(nb::module_& m);
void init_state(nb::module_& m);
void init_model(nb::module_& m);
void init_sampler(nb::module_& m);
void init_spec(nb::module_& m);
void init_vision(nb::module_& m);
void init_metal(nb::module_& m);
