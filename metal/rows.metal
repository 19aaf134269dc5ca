// Row ops (Backend::get_rows, gather_rows, top_k).
//
// get_rows, per weight type (rg_get_rows_<type>): threadgroup (x, i) makes output row i's elements
// [32 ntg x, 32 ntg (x + 1)): each thread dequantizes one 32-element part (RgQuant::dequant32, adjacent
// threads reading adjacent parts of the row's blocks) into threadgroup memory (33 floats a part, so the
// part-major writes do not hit one bank), then the threadgroup writes the span `repeat` times, coalesced.
// ntg <= 128: 16.5 KiB of staging.
//
// gather_rows: threadgroup (x, i) copies every tgpg.x-th stretch of ntg columns of the selected row.
//
// top_k: rows of up to a vocabulary's columns, k up to a few dozen. One pass: threadgroup (x, r) holds
// chunk x of row r, RG_TOPK_E entries per thread in registers, and takes its k largest in k rounds of a
// threadgroup argmax (SIMD-group shuffles, then one slot per SIMD-group in threadgroup memory; the winner's
// owner drops it and finds its next best). Ties go to the lower column, so the result is the CPU's: the k
// first of the strict order (value descending, column ascending), whose top k is the top k of the chunks'
// top k. Each pass leaves tgpg.x * k candidates (value, column) per row; the host repeats the pass over
// them until one chunk remains, which writes ids / values. NaNs never win (the CPU's order for them is
// undefined anyway).
#include "compat.h"

#include "args.h"
#include "common.h"
#include "quants.h"

// ---- get_rows ---------------------------------------------------------------------------------------------

// Element i of a float-type row, for a last part of fewer than 32 columns (only float types have those).
template <uint TYPE>
inline float rg_rows_scalar(device const uchar* row, int64_t i) {
    return 0.0f;
}
template <>
inline float rg_rows_scalar<RG_TYPE_F32>(device const uchar* row, int64_t i) {
    return ((device const float*)row)[i];
}
template <>
inline float rg_rows_scalar<RG_TYPE_F16>(device const uchar* row, int64_t i) {
    return float(((device const half*)row)[i]);
}
template <>
inline float rg_rows_scalar<RG_TYPE_BF16>(device const uchar* row, int64_t i) {
    return as_type<float>(uint(((device const ushort*)row)[i]) << 16);
}

// Ids live on the device, so an id outside the table cannot be reported: its output row is left untouched
// (the CPU backend throws; the CUDA backend skips it too).
template <uint TYPE>
kernel void rg_get_rows(constant RgGetRowsArgs& a [[buffer(0)]], device const char* table [[buffer(1)]],
                        device const char* ids [[buffer(2)]], device char* out [[buffer(3)]], RG_THREAD_IDS) {
    typedef RgQuant<TYPE> Q;
    const int64_t i = tgpig.y, cols = a.table.cols;
    const int32_t id = rg_row<int32_t>(ids, a.ids, i / a.ids.cols)[i % a.ids.cols];
    const bool valid = id >= 0 && id < a.table.rows;
    device const uchar* row = rg_row<uchar>(table, a.table, valid ? id : 0);
    threadgroup float* stage = (threadgroup float*)shmem;  // [ntg][33]
    const int64_t e0 = 32 * (int64_t(tgpig.x) * ntg + tiitg);
    if (valid && e0 < cols) {
        float v[32];
        if (e0 + 32 <= cols) {
            Q::dequant32(row + e0 / Q::QK * Q::BYTES, int(e0 % Q::QK) / 32, v);
        } else {
            for (int j = 0; j < 32; ++j) v[j] = e0 + j < cols ? rg_rows_scalar<TYPE>(row, e0 + j) : 0.0f;
        }
        if (a.scale != 1.0f)
            for (int j = 0; j < 32; ++j) v[j] *= a.scale;
        for (int j = 0; j < 32; ++j) stage[33 * tiitg + j] = v[j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (!valid) return;
    const int64_t base = 32 * int64_t(tgpig.x) * ntg;
    const int64_t n = cols - base < 32 * int64_t(ntg) ? cols - base : 32 * int64_t(ntg);
    device float* o = rg_row<float>(out, a.out, i) + base;
    for (int64_t e = tiitg; e < n; e += ntg) {
        const float x = stage[33 * (e >> 5) + (e & 31)];
        for (int64_t r = 0; r < a.repeat; ++r) o[r * cols + e] = x;
    }
}
#define RG_GET_ROWS_KERNEL(type, name) RG_INSTANTIATE("rg_get_rows_" #name, rg_get_rows, type)
RG_METAL_WEIGHT_TYPES(RG_GET_ROWS_KERNEL)
#undef RG_GET_ROWS_KERNEL

// ---- gather_rows ------------------------------------------------------------------------------------------

// A row id outside x leaves its output row untouched (ids live on the device; the contract rules them out).
kernel void rg_gather_rows(constant RgGatherRowsArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                           device const char* rows [[buffer(2)]], device char* out [[buffer(3)]],
                           RG_THREAD_IDS) {
    const int64_t i = tgpig.y;
    const int32_t r = rg_row<int32_t>(rows, a.rows, 0)[i];
    if (r < 0 || r >= a.x.rows) return;
    device const float* s = rg_row<float>(x, a.x, r);
    device float* d = rg_row<float>(out, a.out, i);
    for (int64_t c = int64_t(tgpig.x) * ntg + tiitg; c < a.x.cols; c += int64_t(tgpg.x) * ntg) d[c] = s[c];
}
RG_KERNEL(rg_gather_rows)

// ---- top_k ------------------------------------------------------------------------------------------------

#define RG_TOPK_E 8              // entries per thread (csrc/metal/rows.cpp: kTopKPerThread)
#define RG_TOPK_NONE 0x7fffffff  // the column of padding entries (value -inf): loses every tie

struct RgTopKPair {
    float v;
    int32_t i;
};

// (v, i) comes before (w, j): larger value, or the same value and the lower column.
inline bool rg_topk_before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

kernel void rg_top_k(constant RgTopKArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                     device const char* cand_in [[buffer(2)]], device char* cand_out [[buffer(3)]],
                     device char* ids [[buffer(4)]], device char* values [[buffer(5)]], RG_THREAD_IDS) {
    const int64_t r = tgpig.y, base = int64_t(tgpig.x) * ntg * RG_TOPK_E;
    device const float* xr = rg_row<float>(x, a.x, r);
    device const RgTopKPair* cr = (device const RgTopKPair*)cand_in + r * a.n;
    float v[RG_TOPK_E];
    int col[RG_TOPK_E];
    for (int e = 0; e < RG_TOPK_E; ++e) {
        const int64_t c = base + int64_t(e) * ntg + tiitg;  // coalesced
        v[e] = -INFINITY;
        col[e] = RG_TOPK_NONE;
        if (c < a.n) {
            if (a.from_cand) {
                v[e] = cr[c].v;
                col[e] = cr[c].i;
            } else {
                v[e] = xr[c];
                col[e] = int(c);
            }
        }
    }
    // this thread's best entry not taken yet: (bv, bc) at position bp
    uint taken = 0;
    float bv = -INFINITY;
    int bc = RG_TOPK_NONE, bp = 0;
    for (int e = 0; e < RG_TOPK_E; ++e)
        if (rg_topk_before(v[e], col[e], bv, bc)) bv = v[e], bc = col[e], bp = e;

    threadgroup RgTopKPair* slots = (threadgroup RgTopKPair*)shmem;  // [2][8]: rounds alternate
    device RgTopKPair* co = (device RgTopKPair*)cand_out + (r * tgpg.x + tgpig.x) * a.k;
    for (int64_t j = 0; j < a.k; ++j) {
        float sv = bv;
        int sc = bc;
        for (ushort o = 16; o > 0; o >>= 1) {
            const float ov = simd_shuffle_xor(sv, o);
            const int oc = simd_shuffle_xor(sc, o);
            if (rg_topk_before(ov, oc, sv, sc)) sv = ov, sc = oc;
        }
        // A slot is rewritten two rounds later, after the next round's barrier: every thread has read it.
        threadgroup RgTopKPair* slot = slots + 8 * (j & 1);
        if (tiisg == 0) {
            slot[sgitg].v = sv;
            slot[sgitg].i = sc;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float wv = slot[0].v;
        int wc = slot[0].i;
        for (uint g = 1; g < ntg / 32; ++g)
            if (rg_topk_before(slot[g].v, slot[g].i, wv, wc)) wv = slot[g].v, wc = slot[g].i;
        if (bc == wc) {  // the owner (padding: every thread with padding left drops one)
            taken |= 1u << bp;
            bv = -INFINITY;
            bc = RG_TOPK_NONE;
            for (int e = 0; e < RG_TOPK_E; ++e)
                if (!((taken >> e) & 1) && rg_topk_before(v[e], col[e], bv, bc))
                    bv = v[e], bc = col[e], bp = e;
        }
        if (tiitg == 0) {
            if (a.to_cand) {
                co[j].v = wv;
                co[j].i = wc;
            } else {
                if (a.has_ids) rg_row<int32_t>(ids, a.ids, r)[j] = wc;
                if (a.has_values) rg_row<float>(values, a.values, r)[j] = wv;
            }
        }
    }
}
RG_KERNEL(rg_top_k)
