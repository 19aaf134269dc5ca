#include "bindings.h"

void init_dequant(nb::module_& m) {}
