// What every kernel file includes first: the Metal Shading Language on Metal, the emulated library
// (csrc/metal/emu/msl.h) when the file is compiled as C++ for the Metal emulator.
//
// Kernel conventions (the emulator relies on them, tests/test_metal_sources.py checks them):
//   - a kernel's parameters are its buffers, [[buffer(i)]] at position i, then RG_THREAD_IDS;
//   - threadgroups are 1-D; threadgroup memory is the `shmem` of RG_THREAD_IDS (its length set by the host),
//     never a threadgroup variable declared in the kernel;
//   - every pointer parameter names its address space (device, constant, threadgroup);
//   - kernels are registered under their host name: RG_KERNEL(fn) for a plain kernel function, whose name is
//     its host name, RG_INSTANTIATE("name", fn, template args...) for a template's specialisation.
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
using namespace metal;

#define RG_THREAD_POSITIONS                                                                      \
    uint3 tgpig [[threadgroup_position_in_grid]], uint tiitg [[thread_index_in_threadgroup]],    \
        uint sgitg [[simdgroup_index_in_threadgroup]], uint tiisg [[thread_index_in_simdgroup]], \
        uint ntg [[threads_per_threadgroup]], uint3 tgpg [[threadgroups_per_grid]]
#define RG_KERNEL(fn)
#if defined(RG_METAL_CHECK)
// The address-space check (metal/check/metal_stdlib) parses this as C++, where `threadgroup` is a macro (so
// not an attribute name) and there is no host_name.
#define RG_THREAD_IDS RG_THREAD_POSITIONS, threadgroup char* shmem
#define RG_INSTANTIATE(name, fn, ...) template decltype(fn<__VA_ARGS__>) fn<__VA_ARGS__>;
#else
#define RG_THREAD_IDS RG_THREAD_POSITIONS, threadgroup char* shmem [[threadgroup(0)]]
#define RG_INSTANTIATE(name, fn, ...) \
    template [[host_name(name)]] [[kernel]] decltype(fn<__VA_ARGS__>) fn<__VA_ARGS__>;
#endif

#else  // the Metal emulator: compiled inside namespace regolith::metal_emu::msl (csrc/metal/emu/prelude.h)

#define kernel
#define device
#define constant
#define threadgroup
#define thread
#define RG_THREAD_IDS uint3 tgpig, uint tiitg, uint sgitg, uint tiisg, uint ntg, uint3 tgpg, char *shmem
#define RG_KERNEL(fn) RG_EMU_REGISTER(#fn, fn)
#define RG_INSTANTIATE(name, fn, ...) RG_EMU_REGISTER(name, fn<__VA_ARGS__>)

#endif
