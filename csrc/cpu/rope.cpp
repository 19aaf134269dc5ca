// Rotary embeddings: a table of (cos, sin) per position and rotary pair, then NEOX rotation of row pairs
// (j, j + half) by it. One table serves every head of a position and every layer sharing the frequencies.
#include <cmath>

#include "cpu/kernels.h"

namespace regolith::cpu {

void rope_table(const Rows& pos, const Rows& freq, const Rows& axis, const Rows& table) {
    const int64_t half = freq.cols;
    const float* f = freq.row(0);
    const int32_t* ax = axis.row<int32_t>(0);
    for (int64_t i = 0; i < pos.rows; ++i) {
        const int64_t* p = pos.row<int64_t>(i);
        float* cs = table.row(i);
        for (int64_t j = 0; j < half; ++j) {
            const float angle = float(p[ax[j]]) * f[j];
            cs[j] = std::cos(angle);
            cs[half + j] = std::sin(angle);
        }
    }
}

void rope(const Rows& x, const Rows& table, int64_t rows_per_pos) {
    const int64_t half = table.cols / 2;
    for_rows(x.rows, 2 * half, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* c = table.row(r / rows_per_pos);
            const float* s = c + half;
            float* row = x.row(r);
            for (int64_t j = 0; j < half; ++j) {
                const float a = row[j], b = row[j + half];
                row[j] = a * c[j] - b * s[j];
                row[j + half] = b * c[j] + a * s[j];
            }
        }
    });
}

}  // namespace regolith::cpu
