#include "bindings.h"

void init_gguf(nb::module_& m) {}
