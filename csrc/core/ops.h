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

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char* name() const = 0;

    // y[t][r] = sum_c W[r][c] * x[t][c] for t < ntok.  x: [ntok][cols] f32, y: [ntok][rows] f32.
    // ntok 1..8 is the decode / speculative-verify path; larger ntok is prefill.
    virtual void matmul(const WeightView& w, const float* x, int64_t ntok, float* y) = 0;
};

Backend& cpu_backend();

}  // namespace regolith
