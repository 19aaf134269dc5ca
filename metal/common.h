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
// gpt-oss's clamped SwiGLU (Glu::SwigluOai), in the CPU's order of operations.
inline float rg_swiglu_oai(float g, float u) {
    const float c = min(g, 7.0f), v = max(min(u, 7.0f), -7.0f);
    return (v + 1.0f) * (c * rg_sigmoid(c * 1.702f));
}

// Per-sequence tensors (args.h RgSeqTensor): binding i of the RG_SEQ_BINDINGS buffers an op binds after its
// others, and row r of a sequence's tensor there.
inline device char* rg_seq_binding(uint i, device char* b0, device char* b1, device char* b2, device char* b3,
                                   device char* b4, device char* b5, device char* b6, device char* b7) {
    switch (i) {
        case 0:
            return b0;
        case 1:
            return b1;
        case 2:
            return b2;
        case 3:
            return b3;
        case 4:
            return b4;
        case 5:
            return b5;
        case 6:
            return b6;
        default:
            return b7;
    }
}
inline device float* rg_seq_row(device char* binding, constant RgSeqTensor& t, int64_t r) {
    return (device float*)(binding + t.off + r * t.stride);
}
// Row e of a causal conv's input, channel c: the sequence's state row e for e < hist, else its input row
// e - hist (x row q.t0 + e - hist).
inline float rg_conv_ext(device const char* x, constant RgShape& xs, device char* state,
                         constant RgSeqSlot& q, int64_t hist, int64_t e, int64_t c) {
    return e < hist ? rg_seq_row(state, q.state, e)[c] : rg_row<float>(x, xs, q.t0 + e - hist)[c];
}
