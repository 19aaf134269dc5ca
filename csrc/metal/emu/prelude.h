// The start of every kernel file compiled for the Metal emulator. CMake generates one translation unit per
// metal/*.metal: this header, then the kernel file inside namespace regolith::metal_emu::msl, where the
// emulated Metal library (msl.h) hides the C library's names as `using namespace metal` does on Metal. The
// headers kernels share with the host (block layouts, tables, argument structs) are included here, inside
// the namespace, so the kernels' copies see Metal's half type; their include guards make the kernel file's
// own #includes of them no-ops.
#pragma once

#include <stdint.h>

#include "metal/emu/kernel_registry.h"

#define RG_METAL_EMU 1

namespace regolith::metal_emu::msl {
#include "core/quant.h"
#include "core/quant_tables.h"
#include "metal/args.h"
}  // namespace regolith::metal_emu::msl
