// The Metal backends of this process: the Apple GPU's ("metal") and the emulator's ("metal-emu"), each made
// on first use.
#include <memory>
#include <mutex>

#include "core/backend.h"
#include "metal/metal_backend.h"

namespace regolith {

Backend* metal_backend() {
    static std::unique_ptr<Backend> be = []() -> std::unique_ptr<Backend> {
        std::string why;
        std::unique_ptr<metal::Device> dev = metal::apple_device(&why);
        if (!dev) return nullptr;
        return std::make_unique<metal::MetalBackend>(std::move(dev));
    }();
    return be.get();
}

Backend* metal_emu_backend() {
    static metal::MetalBackend be(metal::emulated_device());
    return &be;
}

}  // namespace regolith
