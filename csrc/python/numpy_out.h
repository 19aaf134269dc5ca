// New numpy arrays for binding results: the buffer is owned by the array (freed with it, or by the capsule
// if the computation that fills it throws).
#pragma once

#include <cstddef>

#include <nanobind/ndarray.h>

namespace nb = nanobind;

// A new uninitialised C-contiguous numpy array of `shape`; *data points to its elements (at least one
// element is allocated, so *data is never null even for an empty shape).
template <class T, size_t N>
nb::ndarray<nb::numpy, T, nb::ndim<N>> new_array(const size_t (&shape)[N], T** data) {
    size_t n = 1;
    for (size_t d : shape) n *= d;
    T* p = new T[n ? n : 1];
    nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
    *data = p;
    return nb::ndarray<nb::numpy, T, nb::ndim<N>>(p, N, shape, owner);
}
