// Pieces the kernel files share: rows of a tensor as typed pointers and reductions over a threadgroup.
#pragma once

#include "compat.h"

// Row r of a tensor bound at `base` with shape s, as a pointer to T.
template <typename T>
inline device T* rg_row(device char* base, constant RgShape& s, int64_t r) {
    return (device T*)(base + r * s.stride);
}
template <typename T>
inline device const T* rg_row(device const char* base, constant RgShape& s, int64_t r) {
    return (device const T*)(base + r * s.stride);
}

// The sum of v over the threadgroup's threads (ntg a multiple of 32), for every thread. `part` holds 32
// values of threadgroup memory; the first barrier lets an earlier call's readers finish with it.
template <typename T>
inline T rg_group_sum(T v, threadgroup T* part, uint sgitg, uint tiisg, uint ntg) {
    v = simd_sum(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiisg == 0) part[sgitg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return simd_sum(tiisg < ntg / 32 ? part[tiisg] : T(0));
}

template <typename T>
inline T rg_group_max(T v, threadgroup T* part, uint sgitg, uint tiisg, uint ntg) {
    v = simd_max(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiisg == 0) part[sgitg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return simd_max(tiisg < ntg / 32 ? part[tiisg] : part[0]);
}

inline float rg_sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
inline float rg_silu(float x) { return x / (1.0f + exp(-x)); }
