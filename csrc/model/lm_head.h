// The LM head of a window's eval: the logits of the rows whose logits are wanted, read back to the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/buffers.h"
#include "model/language_model.h"

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

// The rows of a step over several windows (eval_windows) whose logits are wanted, ascending, and where each
// window's go on the host.
struct WantedRows {
    std::vector<int32_t> rows;
    std::vector<std::pair<float*, int64_t>> outs;  // per window wanting logits: its destination, its rows

    bool contiguous() const { return rows.empty() || rows.back() - rows.front() + 1 == int32_t(rows.size()); }
    // fn(host [rows][vocab]) computes the logits; they reach each window's destination (straight, when only
    // one window wants them).
    template <class Fn>
    void run(int64_t vocab, Fn fn) const {
        if (outs.size() == 1) return fn(outs.front().first);
        std::vector<float> all(rows.size() * size_t(vocab));
        fn(all.data());
        const float* src = all.data();
        for (const auto& [dst, n] : outs) {
            std::memcpy(dst, src, size_t(n * vocab) * sizeof(float));
            src += n * vocab;
        }
    }
};

// parts[i]'s rows start at t0[i]; it wants every row's logits (all_logits), its last row's, or none (null).
inline WantedRows wanted_rows(const std::vector<WindowStep>& parts, const std::vector<int64_t>& t0) {
    WantedRows w;
    for (size_t i = 0; i < parts.size(); ++i) {
        if (!parts[i].logits) continue;
        const int64_t first = parts[i].all_logits ? 0 : parts[i].n - 1;
        for (int64_t t = first; t < parts[i].n; ++t) w.rows.push_back(int32_t(t0[i] + t));
        w.outs.emplace_back(parts[i].logits, parts[i].n - first);
    }
    return w;
}

// x's wanted rows as one tensor: a view where they are contiguous, else gathered (a copy, bit for bit).
inline Tensor select_rows(Workspace& ws, const Tensor& x, const WantedRows& w) {
    const int64_t n = int64_t(w.rows.size());
    if (w.contiguous()) return x.row_range(n ? w.rows.front() : 0, n);
    const Tensor idx = ws.i32(1, n), out = ws.f32(n, x.cols);
    ws.backend().write(idx, w.rows.data());
    ws.backend().gather_rows(x, idx, out);
    return out;
}

}  // namespace regolith
