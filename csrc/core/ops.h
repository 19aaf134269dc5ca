// The backend op interface: the only way the core reaches compute kernels.
//
// The core (model graphs, arena, streamer, state, sessions, speculation) calls a Backend and never
// includes a backend header. The CPU backend implements every op and is the reference that the CUDA and
// Metal backends are compared against, op by op.
#pragma once

#include <cstdint>

namespace regolith {

// A 2-D weight matrix stored in a GGUF type: `rows` rows of `cols` elements; row r starts at
// data + r * row_bytes. cols is a multiple of the type's block size.
struct WeightView {
    uint32_t type = 0;
    const void* data = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t row_bytes = 0;
};

// One product of a batch: y = W x for ntok tokens (shapes as in Backend::matmul).
struct MatmulJob {
    WeightView w;
    const float* x = nullptr;
    int64_t ntok = 0;
    float* y = nullptr;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char* name() const = 0;

    // y[t][r] = sum_c W[r][c] * x[t][c] for t < ntok.  x: [ntok][cols] f32, y: [ntok][rows] f32.
    // ntok 1..8 is the decode / speculative-verify path; larger ntok is prefill. y[t][r] depends on W row r
    // and x[t] only (bit for bit, whatever ntok). For F32 / F16 / BF16 weights the sum over c is periodic in
    // at most 16 lanes: appending zero columns in multiples of 16 leaves it unchanged bit for bit.
    virtual void matmul(const WeightView& w, const float* x, int64_t ntok, float* y) = 0;

    // Many independent products (e.g. every routed expert of a layer with its tokens): one dispatch for
    // the whole batch instead of one per product.
    virtual void matmul_batch(const MatmulJob* jobs, int64_t n_jobs) = 0;
};

Backend& cpu_backend();

}  // namespace regolith
