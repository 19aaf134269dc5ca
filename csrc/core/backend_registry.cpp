#include <cstdlib>

#include "core/backend.h"
#include "core/errors.h"

namespace regolith {

std::vector<std::string> backend_names() {
    std::vector<std::string> names{"cpu", "cpu-opaque"};
    if (cuda_backend()) names.push_back("cuda");
    if (metal_backend()) names.push_back("metal");
    if (metal_emu_backend()) names.push_back("metal-emu");
    return names;
}

Backend& backend_by_name(const std::string& name) {
    std::string n = name;
    if (n.empty()) {
        const char* env = std::getenv("REGOLITH_BACKEND");
        n = env && *env ? env : "cpu";
    }
    if (n == "cpu") return cpu_backend();
    if (n == "cpu-opaque") return cpu_opaque_backend();
    if (n == "cuda" && cuda_backend()) return *cuda_backend();
    if (n == "metal" && metal_backend()) return *metal_backend();
    if (n == "metal-emu" && metal_emu_backend()) return *metal_emu_backend();
    std::string known;
    for (const std::string& b : backend_names()) known += (known.empty() ? "" : ", ") + b;
    throw Error("unknown backend '" + n + "'; this build has " + known);
}

}  // namespace regolith
