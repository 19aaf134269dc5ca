// The Gated DeltaNet head scan (cpu/gdn_scan_impl.h) compiled for the build's baseline instruction set.
#include "cpu/gdn_scan_impl.h"

namespace regolith::cpu {

void gdn_head_scan_portable(const GdnHead& in, int64_t ntok, int64_t dk, int64_t dv, int64_t chunk, const GdnHeadOut& o) {
    gdn_impl::head_scan(in, ntok, dk, dv, chunk, o);
}

}  // namespace regolith::cpu
