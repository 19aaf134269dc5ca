// The delta-rule scan of one Gated DeltaNet value head (cpu/gdn_scan_impl.h has the equations), compiled once
// per instruction set: gdn.cpp (the build's baseline), gdn_avx2.cpp and gdn_avx512.cpp. Every set computes
// the portable build's result bit for bit, so gdn_scan picks the widest one the active kernels allow.
#pragma once

#include <cstdint>

namespace regolith::cpu {

// Per-token inputs of one value head after the conv, as strided views into the [ntok][conv_dim] rows.
struct GdnHead {
    const float* q;     // q of token t: q + t * stride, [k_dim], normalised and scaled
    const float* k;     // [k_dim], normalised
    const float* v;     // [v_dim]
    int64_t stride;     // floats between tokens
    const float* g;     // g of token t: g[t * gstride], log decay (<= 0)
    const float* beta;  // beta[t * gstride]
    int64_t gstride;
};

// Where one head's scan writes: S its state [k_dim][v_dim] (read and updated); the output of token t at
// out + t * ostride, [v_dim]; when after is set, the state after token t at after + t * astride (the
// recurrence then runs token by token, as it does for one token; otherwise in chunks of `chunk` tokens).
struct GdnHeadOut {
    float* S;
    float* out;
    int64_t ostride;
    float* after;
    int64_t astride;
};

using GdnHeadScan = void (*)(const GdnHead& in, int64_t ntok, int64_t dk, int64_t dv, int64_t chunk,
                             const GdnHeadOut& o);

void gdn_head_scan_portable(const GdnHead& in, int64_t ntok, int64_t dk, int64_t dv, int64_t chunk,
                            const GdnHeadOut& o);
void gdn_head_scan_avx2(const GdnHead& in, int64_t ntok, int64_t dk, int64_t dv, int64_t chunk,
                        const GdnHeadOut& o);
void gdn_head_scan_avx512(const GdnHead& in, int64_t ntok, int64_t dk, int64_t dv, int64_t chunk,
                          const GdnHeadOut& o);

}  // namespace regolith::cpu
