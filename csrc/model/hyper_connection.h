// Hyper-connections (qwen4_exp's replacement for pre-norm residuals): the hidden state is hc parallel
// residual streams. Before each block, a gated low-rank mixer reads one input from the normalised streams;
// after it, the block's output is injected back into every stream with per-stream weights.
#pragma once

#include <cstdint>
#include <string>

#include "core/buffers.h"
#include "model/weights.h"

namespace regolith {

struct HyperConnection {
    int64_t hidden = 0;  // width of one stream
    int64_t hc = 0;      // number of streams
    int64_t rank = 0;    // low-rank mixer width
    float eps = 1e-6f;
    Tensor norm;    // [hc][hidden] grouped RMSNorm gain (GGUF stores 1 + gamma)
    Tensor down;    // [rank, hc * hidden]
    Tensor up;      // [hc * hidden, rank]
    Tensor inject;  // [hc, hc * hidden]; absent for the final mixer

    // `prefix` is "blk.N.hc_attn", "blk.N.hc_ffn" or "output_hc" (no inject).
    static HyperConnection load(const ModelWeights& w, const std::string& prefix, int64_t hidden, int64_t hc,
                                int64_t rank, float eps, bool with_inject);

    // streams: [ntok][hc * hidden] -> mixed: [ntok][hidden], inject_w: [ntok][hc] (with inject).
    void read(Workspace& ws, const Tensor& streams, const Tensor& mixed, const Tensor& inject_w) const;
    // streams[t][s][:] += inject_w[t][s] * block_out[t][:]
    void write(Backend& be, const Tensor& block_out, const Tensor& inject_w, const Tensor& streams) const;
};

}  // namespace regolith
