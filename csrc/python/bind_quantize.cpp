#include "bindings.h"

void init_quantize(nb::module_& m) {}
