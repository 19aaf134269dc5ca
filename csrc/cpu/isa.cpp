#include "isa.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "core/errors.h"

#if defined(RG_HAVE_NEONDOT) && defined(__APPLE__)
#include <sys/sysctl.h>
#elif defined(RG_HAVE_NEONDOT) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace regolith::cpu {
namespace {

constexpr Isa kAll[] = {Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512, Isa::Neon, Isa::NeonDot};

bool cpu_has(Isa isa) {
    switch (isa) {
        case Isa::Scalar:
            return true;
        case Isa::Avx2:
#if defined(RG_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
            __builtin_cpu_init();
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
#else
            return false;
#endif
        case Isa::AvxVnni:
#if defined(RG_HAVE_AVXVNNI) && (defined(__GNUC__) || defined(__clang__))
            return cpu_has(Isa::Avx2) && __builtin_cpu_supports("avxvnni");
#else
            return false;
#endif
        case Isa::Avx512:
#if defined(RG_HAVE_AVX512) && (defined(__GNUC__) || defined(__clang__))
            // the AVX-512 kernels build on the AVX2 ones; the compiler's check includes the OS saving the
            // zmm and mask registers (XCR0)
            return cpu_has(Isa::Avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
                   __builtin_cpu_supports("avx512bitalg");
#else
            return false;
#endif
        case Isa::Neon:
#if defined(RG_HAVE_NEON)
            return true;  // baseline on arm64
#else
            return false;
#endif
        case Isa::NeonDot:
#if defined(RG_HAVE_NEONDOT) && defined(__APPLE__)
        {
            int v = 0;
            size_t n = sizeof(v);
            return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &n, nullptr, 0) == 0 && v != 0;
        }
#elif defined(RG_HAVE_NEONDOT) && defined(__linux__)
            return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
            return false;
#endif
    }
    return false;
}

Isa initial_isa() {
    const std::vector<Isa> isas = available_isas();
    if (const char* env = std::getenv("REGOLITH_ISA")) {
        const Isa want = isa_from_name(env);
        if (std::find(isas.begin(), isas.end(), want) != isas.end()) return want;
    }
    return isas.back();
}

std::atomic<Isa>& active() {
    static std::atomic<Isa> isa{initial_isa()};
    return isa;
}

}  // namespace

std::string_view isa_name(Isa isa) {
    switch (isa) {
        case Isa::Scalar:
            return "scalar";
        case Isa::Avx2:
            return "avx2";
        case Isa::AvxVnni:
            return "avxvnni";
        case Isa::Avx512:
            return "avx512";
        case Isa::Neon:
            return "neon";
        case Isa::NeonDot:
            return "neondot";
    }
    return "?";
}

Isa isa_from_name(std::string_view name) {
    for (Isa isa : kAll)
        if (isa_name(isa) == name) return isa;
    throw Error("unknown instruction set '" + std::string(name) + "' (expected scalar, avx2, avxvnni, avx512, neon or neondot)");
}

std::vector<Isa> available_isas() {
    std::vector<Isa> out;
    for (Isa isa : kAll)
        if (cpu_has(isa)) out.push_back(isa);
    return out;
}

Isa active_isa() { return active().load(); }

void set_active_isa(Isa isa) {
    if (!cpu_has(isa))
        throw Error("instruction set '" + std::string(isa_name(isa)) + "' is not available on this machine");
    active().store(isa);
}

}  // namespace regolith::cpu
