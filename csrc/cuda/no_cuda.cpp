// A build without the CUDA backend (CMake found no nvcc, or REGOLITH_CUDA=OFF).
#include "core/backend.h"

namespace regolith {

Backend* cuda_backend() { return nullptr; }

}  // namespace regolith
