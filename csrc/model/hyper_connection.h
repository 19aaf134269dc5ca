// Hyper-connections (qwen4_exp's replacement for pre-norm residuals): the hidden state is hc parallel
// residual streams. Before each block, a gated low-rank mixer reads one input from the normalised streams;
// after it, the block's output is injected back into every stream with per-stream weights. The models of
// the same family without them (qwen3next, qwen35moe) use the degenerate case, pre_norm: one stream, read
// through an RMSNorm, the block's output added back.
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
    Tensor down;    // [rank, hc * hidden]; absent for a pre-norm residual
    Tensor up;      // [hc * hidden, rank]
    Tensor inject;  // [hc, hc * hidden]; absent for the final mixer

    // `prefix` is "blk.N.hc_attn", "blk.N.hc_ffn" or "output_hc" (no inject).
    static HyperConnection load(const ModelWeights& w, const std::string& prefix, int64_t hidden, int64_t hc,
                                int64_t rank, float eps, bool with_inject);
    // A pre-norm residual (hc = 1, no mixer): read = rms_norm(x) * norm, write: x += out. `name` is the norm's
    // tensor ("blk.N.attn_norm.weight", "output_norm.weight"), its gamma as stored.
    static HyperConnection pre_norm(const ModelWeights& w, const std::string& name, int64_t hidden, float eps);

    // streams: [ntok][hc * hidden] -> mixed: [ntok][hidden], inject_w: [ntok][hc] (with inject).
    void read(Workspace& ws, const Tensor& streams, const Tensor& mixed, const Tensor& inject_w) const;
    // streams[t][s][:] += inject_w[t][s] * block_out[t][:]
    void write(Backend& be, const Tensor& block_out, const Tensor& inject_w, const Tensor& streams) const;
};

}  // namespace regolith
