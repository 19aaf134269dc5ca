// Rotary embeddings (Backend::rope_table, rope): the (cos, sin) table of every position and rotary pair, then
// the NEOX rotation in place of each row's pairs (j, j + half) by its position's table row.
// Both: threadgroup (x, y) takes every tgpg.x-th stretch of ntg pairs of row y (position y for the table),
// a thread per pair, so a SIMD-group reads 32 consecutive floats of each half of the row (coalesced), and the
// table row is one per threadgroup (r / rows_per_pos once, not per element). The host sizes ntg to the pairs
// (whole SIMD-groups, at most 256): a head of 128 dims is 64 threads, one row per threadgroup.
// The table's cos / sin are precise:: (the angles reach thousands of radians: positions times frequencies
// up to 1), within Metal's few-ulp bound of the CPU's libm values.
#include "compat.h"

#include "args.h"
#include "common.h"

// table[i][j] = cos(a), table[i][half + j] = sin(a), a = float(pos[i][axis[j]]) * freq[j] (positions < 2^24,
// so exact in float).
kernel void rg_rope_table(constant RgRopeArgs& a [[buffer(0)]], device const char* pos [[buffer(1)]],
                          device const char* freq [[buffer(2)]], device const char* axis [[buffer(3)]],
                          device char* table [[buffer(4)]], RG_THREAD_IDS) {
    const int64_t half = a.freq.cols;
    device const int64_t* p = rg_row<int64_t>(pos, a.pos, tgpig.y);
    device const float* f = rg_row<float>(freq, a.freq, 0);
    device const int32_t* ax = rg_row<int32_t>(axis, a.axis, 0);
    device float* cs = rg_row<float>(table, a.table, tgpig.y);
    for (int64_t j = int64_t(tgpig.x) * ntg + tiitg; j < half; j += int64_t(tgpg.x) * ntg) {
        const float angle = float(p[ax[j]]) * f[j];
        cs[j] = precise::cos(angle);
        cs[half + j] = precise::sin(angle);
    }
}
RG_KERNEL(rg_rope_table)

// (x[r][j], x[r][j + half]) <- (a cos - b sin, b cos + a sin) with table row r / rows_per_pos, j < half.
kernel void rg_rope(constant RgRopeArgs& a [[buffer(0)]], device const char* table [[buffer(1)]],
                    device char* x [[buffer(2)]], RG_THREAD_IDS) {
    const int64_t half = a.table.cols / 2, r = tgpig.y;
    device const float* c = rg_row<float>(table, a.table, r / a.rows_per_pos);
    device const float* s = c + half;
    device float* row = rg_row<float>(x, a.x, r);
    for (int64_t j = int64_t(tgpig.x) * ntg + tiitg; j < half; j += int64_t(tgpg.x) * ntg) {
        const float u = row[j], v = row[j + half];
        row[j] = u * c[j] - v * s[j];
        row[j + half] = v * c[j] + u * s[j];
    }
}
RG_KERNEL(rg_rope)
