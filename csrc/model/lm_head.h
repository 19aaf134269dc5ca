// The LM head of a window's eval: the logits of the rows whose logits are wanted, read back to the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/buffers.h"

namespace regolith {

// Logits rows computed per product: bounds their scratch (64 rows of a 262k vocabulary: 64 MB) while
// keeping the product on the prefill path.
constexpr int64_t kLogitRows = 64;

// logits[r][vocab] (host) = post(head x[r]) for the rows of x, in products of at most kLogitRows rows; `post`
// (a callable taking the [m][vocab] tensor) applies what follows the product on the backend (bias, softcap).
template <class Post>
void lm_head(Workspace& ws, const Tensor& head, const Tensor& x, float* logits, Post post) {
    Backend& be = ws.backend();
    for (int64_t r0 = 0; r0 < x.rows; r0 += kLogitRows) {
        Workspace::Scope scope(ws);
        const int64_t m = std::min(kLogitRows, x.rows - r0);
        const Tensor lg = ws.f32(m, head.rows);
        be.matmul(head, x.row_range(r0, m), lg);
        post(lg);
        be.read(lg, logits + r0 * head.rows);
    }
}

}  // namespace regolith
