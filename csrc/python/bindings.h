// One init_<area> per binding file, gathered in module.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace nb = nanobind;

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
