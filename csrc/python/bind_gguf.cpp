#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <system_error>

#include "bindings.h"
#include "core/gguf_set.h"
#include "core/types.h"

using regolith::GgufArray;
using regolith::GgufSet;
using regolith::GgufTensor;
using regolith::GgufValue;
using regolith::GgufValueType;

namespace {

// Strings decode as UTF-8 with invalid bytes replaced by U+FFFD (keys are validated by the parser).
PyObject* str_to_py(std::string_view s) {
    return PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace");
}

template <class T>
T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// Element i of a fixed-size scalar array as a new Python reference.
PyObject* scalar_to_py(GgufValueType type, const uint8_t* p) {
    switch (type) {
        case GgufValueType::UINT8:
            return PyLong_FromUnsignedLong(*p);
        case GgufValueType::INT8:
            return PyLong_FromLong(int8_t(*p));
        case GgufValueType::UINT16:
            return PyLong_FromUnsignedLong(load<uint16_t>(p));
        case GgufValueType::INT16:
            return PyLong_FromLong(load<int16_t>(p));
        case GgufValueType::UINT32:
            return PyLong_FromUnsignedLong(load<uint32_t>(p));
        case GgufValueType::INT32:
            return PyLong_FromLong(load<int32_t>(p));
        case GgufValueType::FLOAT32:
            return PyFloat_FromDouble(load<float>(p));
        case GgufValueType::BOOL:
            return PyBool_FromLong(*p);
        case GgufValueType::UINT64:
            return PyLong_FromUnsignedLongLong(load<uint64_t>(p));
        case GgufValueType::INT64:
            return PyLong_FromLongLong(load<int64_t>(p));
        case GgufValueType::FLOAT64:
            return PyFloat_FromDouble(load<double>(p));
        default:
            return nullptr;
    }
}

PyObject* value_to_py(const GgufValue& v);

PyObject* array_to_py(const GgufArray& a) {
    PyObject* list = PyList_New(Py_ssize_t(a.size));
    if (!list) return nullptr;
    size_t esize = 0;
    if (a.data) {
        switch (a.type) {
            case GgufValueType::UINT8:
            case GgufValueType::INT8:
            case GgufValueType::BOOL:
                esize = 1;
                break;
            case GgufValueType::UINT16:
            case GgufValueType::INT16:
                esize = 2;
                break;
            case GgufValueType::UINT32:
            case GgufValueType::INT32:
            case GgufValueType::FLOAT32:
                esize = 4;
                break;
            default:
                esize = 8;
        }
    }
    for (uint64_t i = 0; i < a.size; ++i) {
        PyObject* item = a.data ? scalar_to_py(a.type, a.data + i * esize) : value_to_py(a.items[i]);
        if (!item) {
            Py_DECREF(list);
            return nullptr;
        }
        PyList_SET_ITEM(list, Py_ssize_t(i), item);
    }
    return list;
}

PyObject* value_to_py(const GgufValue& v) {
    if (const auto* s = std::get_if<std::string_view>(&v)) return str_to_py(*s);
    if (const auto* a = std::get_if<GgufArray>(&v)) return array_to_py(*a);
    return std::visit(
        [](const auto& x) -> PyObject* {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, bool>)
                return PyBool_FromLong(x);
            else if constexpr (std::is_floating_point_v<T>)
                return PyFloat_FromDouble(x);
            else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
                return PyLong_FromLongLong(x);
            else if constexpr (std::is_integral_v<T>)
                return PyLong_FromUnsignedLongLong(x);
            else
                return nullptr;  // string and array handled above
        },
        static_cast<const regolith::GgufVariant&>(v));
}

nb::object checked(PyObject* o) {
    if (!o) throw nb::python_error();
    return nb::steal(o);
}

const GgufTensor& tensor_named(const GgufSet& f, const std::string& name) {
    const GgufTensor* t = f.find_tensor(name);
    if (!t) throw nb::key_error(("no tensor named '" + name + "'").c_str());
    return *t;
}

}  // namespace

void init_gguf(nb::module_& m) {
    nb::class_<GgufSet>(m, "GGUFSet",
                        "The memory-mapped, validated GGUF files of one model (use regolith.gguf.open): its shards "
                        "and side files.")
        .def(
            "__init__",
            [](GgufSet* self, const std::vector<std::vector<std::string>>& groups) {
                int err = 0;
                std::string failed;
                {
                    nb::gil_scoped_release release;
                    try {
                        new (self) GgufSet(groups);
                    } catch (const std::system_error& e) {
                        err = e.code().value();
                        failed = e.what();
                    }
                }
                if (err) {
                    errno = err;
                    // GgufFile's system_error says which path; report the first group member it names.
                    std::string path = groups.empty() || groups[0].empty() ? "" : groups[0][0];
                    for (const auto& g : groups)
                        for (const auto& p : g)
                            if (failed.find(p) != std::string::npos) path = p;
                    PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
                    throw nb::python_error();
                }
            },
            nb::arg("groups"),
            "Map and parse a model's files: groups[0] its shards in order, groups[1:] side files (each its "
            "shards); raises GGUFError for a malformed file, ModelFormatError for an inconsistent set.")
        .def_prop_ro("version", [](const GgufSet& s) { return s.main().version(); })
        .def_prop_ro("alignment", [](const GgufSet& s) { return s.main().alignment(); })
        .def(
            "files",
            [](const GgufSet& s) {
                nb::list out;
                for (size_t i = 0; i < s.n_files(); ++i)
                    out.append(nb::make_tuple(s.path(i), s.file(i).file_size(), s.file(i).data_offset()));
                return out;
            },
            "List of (path, size in bytes, offset of the tensor data section) of each file, in set order.")
        .def(
            "metadata",
            [](const GgufSet& f) {
                nb::dict d;
                for (const auto& [key, value] : f.metadata())
                    d[checked(str_to_py(key))] = checked(value_to_py(value));
                return d;
            },
            "Metadata as a dict in file order (arrays become lists, strings decode UTF-8 with replacement).")
        .def(
            "metadata_types",
            [](const GgufSet& f) {
                nb::dict d;
                for (const auto& [key, value] : f.metadata())
                    d[checked(str_to_py(key))] = uint32_t(value.type());
                return d;
            },
            "GGUF value type id of each metadata entry.")
        .def(
            "metadata_array_types",
            [](const GgufSet& f) {
                nb::dict d;
                for (const auto& [key, value] : f.metadata())
                    if (const auto* a = std::get_if<regolith::GgufArray>(&value))
                        d[checked(str_to_py(key))] = uint32_t(a->type);
                return d;
            },
            "GGUF element type id of each array metadata entry.")
        .def(
            "tensors",
            [](const GgufSet& f) {
                nb::list out;
                for (const GgufTensor& t : f.tensors()) {
                    nb::list dims;
                    for (uint32_t d = 0; d < t.n_dims; ++d) dims.append(t.ne[d]);
                    out.append(nb::make_tuple(checked(str_to_py(t.name)), dims, t.type, t.offset, t.nbytes,
                                              t.row_bytes, t.file));
                }
                return out;
            },
            "List of (name, ggml dims (ne0 first), type id, absolute offset in its file, nbytes, row_bytes, file "
            "index).")
        .def(
            "tensor_data",
            [](const GgufSet& f, const std::string& name) {
                const GgufTensor& t = tensor_named(f, name);
                size_t shape[1] = {size_t(t.nbytes)};
                return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(f.tensor_data(t), 1, shape,
                                                                          nb::find(&f));
            },
            nb::arg("name"), "Zero-copy read-only uint8 view of a tensor's bytes; keeps the files mapped.");
}
