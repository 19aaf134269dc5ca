// A build of the core without the Metal backend's sources (tools/neon_check's cross-compiled test build).
#include "core/backend.h"

namespace regolith {

Backend* metal_backend() { return nullptr; }
Backend* metal_emu_backend() { return nullptr; }

}  // namespace regolith
