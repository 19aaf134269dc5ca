// Kernels that test the Metal emulator itself (tests/test_metal_emulator.py), in the kernels' dialect:
// SIMD-group functions against their definitions, barriers, and the errors the emulator must report.
// Compiled only into the emulator (never into the metallib).
#include "metal/emu/prelude.h"

namespace regolith::metal_emu::msl {
#include "metal/compat.h"

// out[6][n]: per thread simd_sum, simd_max, simd_prefix_exclusive_sum, simd_shuffle_xor(., 5),
// simd_shuffle_down(., 3) (a source past the SIMD-group gives poison), simd_broadcast(., 7).
kernel void rg_emu_test_simd(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                             RG_THREAD_IDS) {
    const uint n = ntg;
    const float v = in[tiitg];
    out[0 * n + tiitg] = simd_sum(v);
    out[1 * n + tiitg] = simd_max(v);
    out[2 * n + tiitg] = simd_prefix_exclusive_sum(v);
    out[3 * n + tiitg] = simd_shuffle_xor(v, 5);
    out[4 * n + tiitg] = simd_shuffle_down(v, 3);
    out[5 * n + tiitg] = simd_broadcast(v, 7);
}
RG_KERNEL(rg_emu_test_simd)

// Each thread writes its value to threadgroup memory and reads its neighbour's: with the barrier, right in
// any order; without (sync = 0), a read may come before the write it needs.
kernel void rg_emu_test_exchange(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                                 constant uint& sync [[buffer(2)]], RG_THREAD_IDS) {
    threadgroup float* t = (threadgroup float*)shmem;
    t[tiitg] = in[tgpig.x * ntg + tiitg];
    if (sync) threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tgpig.x * ntg + tiitg] = t[(tiitg + 1) % ntg];
}
RG_KERNEL(rg_emu_test_exchange)

// Lanes of one SIMD-group at two different simd_sum calls: divergent control flow.
kernel void rg_emu_test_divergent(device float* out [[buffer(0)]], RG_THREAD_IDS) {
    float v = 1.0f;
    if (tiisg < 16) {
        v = simd_sum(v);
    } else {
        v = simd_sum(v);
    }
    out[tiitg] = v;
}
RG_KERNEL(rg_emu_test_divergent)

// A thread returns while the others wait at a barrier.
kernel void rg_emu_test_early_return(device float* out [[buffer(0)]], RG_THREAD_IDS) {
    if (tiitg == 0) return;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tiitg] = 1.0f;
}
RG_KERNEL(rg_emu_test_early_return)

// c = a b (+ c) for 8x8 row-major matrices: a, b float, the accumulator float.
kernel void rg_emu_test_matrix(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                               device float* c [[buffer(2)]], RG_THREAD_IDS) {
    simdgroup_float8x8 ma, mb, mc;
    simdgroup_load(ma, a, 8);
    simdgroup_load(mb, b, 8, ulong2(0), true);  // b given transposed
    simdgroup_load(mc, c, 8);
    simdgroup_multiply_accumulate(mc, ma, mb, mc);
    simdgroup_store(mc, c, 8);
}
RG_KERNEL(rg_emu_test_matrix)

}  // namespace regolith::metal_emu::msl
