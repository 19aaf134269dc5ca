// Builds for platforms other than Apple's: no Metal device (the emulator still runs the Metal kernels).
#include "metal/device.h"

namespace regolith::metal {

std::unique_ptr<Device> apple_device(std::string* why) {
    if (why) *why = "Metal needs an Apple platform";
    return nullptr;
}

}  // namespace regolith::metal
