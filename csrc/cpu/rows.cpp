// Row ops: embedding lookup (dequantize rows by id), gathering rows, the top k of each row.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "core/dequant.h"
#include "core/errors.h"
#include "core/thread_pool.h"
#include "cpu/kernels.h"

namespace regolith::cpu {

void for_rows(int64_t n, int64_t row_elements, const std::function<void(int64_t, int64_t)>& fn) {
    if (n > 1 && n * row_elements >= (int64_t(1) << 15))
        default_pool()->parallel_for(n, 1, fn);
    else
        fn(0, n);
}

void get_rows(const Rows& table, const Rows& ids, float scale, int64_t repeat, const Rows& out) {
    const int64_t n = ids.cols * ids.rows, w = table.cols;
    for (int64_t i = 0; i < n; ++i) {
        const int32_t id = ids.row<int32_t>(i / ids.cols)[i % ids.cols];
        if (id < 0 || id >= table.rows)
            throw Error("get_rows: row id " + std::to_string(id) + " outside the table's " + std::to_string(table.rows));
        float* dst = out.row(i);
        dequantize_row(table.type, table.row<uint8_t>(id), dst, w);
        if (scale != 1.0f)
            for (int64_t c = 0; c < w; ++c) dst[c] *= scale;
        for (int64_t r = 1; r < repeat; ++r) std::memcpy(dst + r * w, dst, size_t(w) * sizeof(float));
    }
}

void gather_rows(const Rows& x, const Rows& rows, const Rows& out) {
    const int32_t* idx = rows.row<int32_t>(0);
    const size_t bytes = size_t(x.cols) * sizeof(float);
    for (int64_t i = 0; i < rows.cols; ++i) std::memcpy(out.row(i), x.row(idx[i]), bytes);
}

void top_k(const Rows& x, int64_t k, const Rows& ids, const Rows& values) {
    std::vector<int32_t> order(static_cast<size_t>(x.cols));
    for (int64_t r = 0; r < x.rows; ++r) {
        const float* v = x.row(r);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
        for (int64_t j = 0; j < k; ++j) {
            if (ids) ids.row<int32_t>(r)[j] = order[size_t(j)];
            if (values) values.row(r)[j] = v[order[size_t(j)]];
        }
    }
}

}  // namespace regolith::cpu
