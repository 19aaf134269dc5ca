// Row ops (metal/rows.metal): embedding lookup per weight type, gathering rows, top k in passes.
#include <algorithm>
#include <string>

#include "core/errors.h"
#include "metal/metal_backend.h"
#include "metal/types.h"

namespace regolith::metal {

namespace {

constexpr int64_t kGetRowsParts = 128;  // 32-element parts per get_rows threadgroup (one per thread)
constexpr int64_t kTopKPerThread = 8;   // RG_TOPK_E
constexpr int64_t kTopKThreads = 256;
constexpr int64_t kTopKMax = kTopKThreads * kTopKPerThread / 2;  // so that every pass shrinks the row
constexpr uint32_t kTopKSlots = 2 * 8 * 8;  // rg_top_k's threadgroup memory: 2 x 8 (value, column) pairs

int64_t round32(int64_t n) { return std::max<int64_t>(32, (n + 31) / 32 * 32); }

}  // namespace

void MetalBackend::do_get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat,
                               const Tensor& out) {
    const View vt = view(table), vi = view(ids), vo = view(out);
    const int64_t n = ids.rows * ids.cols, parts = (table.cols + 31) / 32;
    if (n == 0 || parts == 0 || repeat == 0) return;
    RgGetRowsArgs a{};
    a.table = vt.shape, a.ids = vi.shape, a.out = vo.shape, a.repeat = repeat, a.scale = scale;
    const int64_t threads = std::min(kGetRowsParts, round32(parts));
    const std::string kernel = "rg_get_rows_" + metal_type_name(table.type);
    launch(kernel.c_str(), uint32_t((parts + threads - 1) / threads), uint32_t(n), uint32_t(threads),
           uint32_t(threads * 33 * sizeof(float)), {bytes(a), vt.arg, vi.arg, vo.arg});
}

void MetalBackend::do_gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
    const View vx = view(x), vr = view(rows), vo = view(out);
    if (out.rows == 0 || x.cols == 0) return;
    RgGatherRowsArgs a{};
    a.x = vx.shape, a.rows = vr.shape, a.out = vo.shape;
    const int64_t threads = simd_threads(x.cols);
    launch("rg_gather_rows", uint32_t(std::min<int64_t>((x.cols + threads - 1) / threads, 64)),
           uint32_t(out.rows), uint32_t(threads), 0, {bytes(a), vx.arg, vr.arg, vo.arg});
}

// Passes of rg_top_k: each leaves the k best of every chunk of kTopKThreads * kTopKPerThread entries as
// candidates in scratch, until one chunk holds them all and writes ids / values.
void MetalBackend::do_top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) {
    const View vx = view(x), vi = view(ids), vv = view(values);
    if (x.rows == 0 || (!ids && !values)) return;
    if (k > kTopKMax) throw Error("metal top_k: k is at most " + std::to_string(kTopKMax));
    const auto threads = [](int64_t n) {
        return std::min(kTopKThreads, round32((n + kTopKPerThread - 1) / kTopKPerThread));
    };
    const auto chunks = [&](int64_t n) {
        const int64_t chunk = threads(n) * kTopKPerThread;
        return (n + chunk - 1) / chunk;
    };
    // the candidates of each pass but the last, one after the other in scratch
    int64_t total = 0;
    for (int64_t n = x.cols; chunks(n) > 1; n = chunks(n) * k) total += x.rows * chunks(n) * k;
    const KernelArg cand = total ? scratch(uint64_t(total) * 8) : vx.arg;
    KernelArg in = vx.arg, next = cand;
    RgTopKArgs a{};
    a.x = vx.shape, a.ids = vi.shape, a.values = vv.shape, a.k = k;
    a.has_ids = ids ? 1 : 0, a.has_values = values ? 1 : 0;
    for (int64_t n = x.cols;;) {
        const int64_t c = chunks(n);
        a.n = n, a.to_cand = c > 1 ? 1 : 0;
        launch(
            "rg_top_k", uint32_t(c), uint32_t(x.rows), uint32_t(threads(n)), kTopKSlots,
            {bytes(a), vx.arg, in, c > 1 ? next : vx.arg, ids ? vi.arg : vx.arg, values ? vv.arg : vx.arg});
        if (c == 1) break;
        in = next;
        next.offset += uint64_t(x.rows * c * k) * 8;
        n = c * k;
        a.from_cand = 1;
    }
}

}  // namespace regolith::metal
