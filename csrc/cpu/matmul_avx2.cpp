// x86-64 kernels: AVX2 + FMA + F16C (compiled with -mavx2 -mfma -mf16c -mbmi2; used only when the CPU has them).
#include "cpu/simd_avx2.h"

namespace regolith::cpu {

const KernelTable& kernels_avx2() {
    static const KernelTable table = make_kernel_table<SimdAvx2>();
    return table;
}

}  // namespace regolith::cpu
