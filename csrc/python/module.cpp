#include "bindings.h"
#include "core/errors.h"
#include "core/sampler.h"

namespace {

// Raise the Python-side class (defined in regolith/errors.py so it can subclass RegolithError).
void raise_as(const char* cls, const char* msg) {
    nb::object type = nb::module_::import_("regolith.errors").attr(cls);
    PyErr_SetString(type.ptr(), msg);
}

}  // namespace

NB_MODULE(_core, m) {
    m.doc() = "regolith C++ core";
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const regolith::GGUFError& e) {
            raise_as("GGUFError", e.what());
        } catch (const regolith::ModelFormatError& e) {
            raise_as("ModelFormatError", e.what());
        } catch (const regolith::StateError& e) {
            raise_as("SessionError", e.what());
        } catch (const regolith::IoError& e) {
            // OSError(errno, message, filename) becomes the errno's subclass (FileNotFoundError, ...).
            PyObject* err = PyObject_CallFunction(PyExc_OSError, "iss", e.err, e.reason.c_str(), e.path.c_str());
            if (err) {
                PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err)), err);
                Py_DECREF(err);
            }
        } catch (const regolith::SamplingError& e) {
            raise_as("SamplingError", e.what());
        } catch (const regolith::Error& e) {
            raise_as("RegolithError", e.what());
        }
    });
    init_types(m);
    init_backends(m);
    init_gguf(m);
    init_dequant(m);
    init_quantize(m);
    init_kernels(m);
    init_qsa(m);
    init_gdn(m);
    init_ple(m);
    init_state(m);
    init_model(m);
    init_sampler(m);
    init_spec(m);
    init_arena(m);
    init_vision(m);
    init_metal(m);
}
