// The Gated DeltaNet head scan (cpu/gdn_scan_impl.h) compiled for avx2 (CMake gives *_avx2.cpp its flags).
#include "cpu/gdn_scan_impl.h"

namespace regolith::cpu {

void gdn_head_scan_avx2(const GdnHead& in, int64_t ntok, int64_t dk, int64_t dv, int64_t chunk, const GdnHeadOut& o) {
    gdn_impl::head_scan(in, ntok, dk, dv, chunk, o);
}

}  // namespace regolith::cpu
