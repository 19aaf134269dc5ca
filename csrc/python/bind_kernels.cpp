#include "bindings.h"

void init_kernels(nb::module_& m) {}
