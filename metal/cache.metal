// Attention caches in their storage types (Backend::store_rows; the layouts and rounding in metal/cache.h).
//
// rg_store_rows: a SIMD-group per row, 4 rows per threadgroup; a Q8_0 row block by block (lane j quantizes
// element j of each block of 32), an I8 row with the lanes striding over it (its max|x| reduced across them).
#include "compat.h"

#include "args.h"
#include "cache.h"

kernel void rg_store_rows(constant RgStoreRowsArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                          device char* dst [[buffer(2)]], device char* scale [[buffer(3)]], RG_THREAD_IDS) {
    const int64_t r = int64_t(tgpig.x) * (ntg / 32) + sgitg;
    if (r >= a.x.rows) return;  // the whole SIMD-group
    rg_cache_store(dst, a.dst, scale, a.scale, r, rg_row<float>(x, a.x, r), int(a.x.cols), tiisg);
}
RG_KERNEL(rg_store_rows)
