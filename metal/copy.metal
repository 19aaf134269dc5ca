// Copies and fills of tensor rows (Backend::copy, zero, and write()'s copy from staged host bytes): rows
// of `row_bytes` bytes, threadgroup (x, r) taking every tgpg.x-th stretch of ntg units of row r. Units are
// 4-byte words where every offset and stride allows (the host picks), else bytes.
#include "compat.h"

#include "args.h"

template <typename T>
kernel void rg_copy_rows(constant RgCopyArgs& a [[buffer(0)]], device const char* src [[buffer(1)]],
                         device char* dst [[buffer(2)]], RG_THREAD_IDS) {
    const int64_t r = tgpig.y;
    device const T* s = (device const T*)(src + r * a.src_stride);
    device T* d = (device T*)(dst + r * a.dst_stride);
    const int64_t n = a.row_bytes / int64_t(sizeof(T));
    for (int64_t i = int64_t(tgpig.x) * ntg + tiitg; i < n; i += int64_t(tgpg.x) * ntg) d[i] = s[i];
}
RG_INSTANTIATE("rg_copy_rows_u8", rg_copy_rows, uchar)
RG_INSTANTIATE("rg_copy_rows_u32", rg_copy_rows, uint)

kernel void rg_zero_rows(constant RgCopyArgs& a [[buffer(0)]], device char* dst [[buffer(1)]],
                         RG_THREAD_IDS) {
    device char* d = dst + int64_t(tgpig.y) * a.dst_stride;
    for (int64_t i = int64_t(tgpig.x) * ntg + tiitg; i < a.row_bytes; i += int64_t(tgpg.x) * ntg) d[i] = 0;
}
RG_KERNEL(rg_zero_rows)
