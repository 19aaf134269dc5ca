// The CPU backend: validates op arguments, prepares activations and runs the active ISA's kernels over
// row ranges on the default thread pool.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/ops.h"
#include "core/thread_pool.h"
#include "core/types.h"
#include "cpu/isa.h"
#include "cpu/matmul.h"

namespace regolith {
namespace cpu {

void quantize_activations(const float* x, int64_t n, int block, int8_t* q, float* d, float* s) {
    for (int64_t b = 0; b < n; b += block) {
        float amax = 0.0f;
        for (int i = 0; i < block; ++i) amax = std::fmax(amax, std::fabs(x[b + i]));
        const float scale = amax / 127.0f;
        const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int i = 0; i < block; ++i) q[b + i] = int8_t(std::lrintf(x[b + i] * inv));
        d[b / block] = scale;
    }
    for (int64_t g = 0; g < n; g += 16) {
        float sum = 0.0f;
        for (int i = 0; i < 16; ++i) sum += x[g + i];
        s[g / 16] = sum;
    }
}

namespace {

const KernelTable& active_table() {
    switch (active_isa()) {
#if defined(RG_HAVE_AVX2)
        case Isa::Avx2:
            return kernels_avx2();
#endif
#if defined(RG_HAVE_NEON)
        case Isa::Neon:
            return kernels_neon();
#endif
        default:
            return kernels_scalar();
    }
}

}  // namespace

namespace {

std::atomic<bool>& exact_flag() {
    static std::atomic<bool> flag{[] {
        const char* env = std::getenv("REGOLITH_EXACT_ACTIVATIONS");
        return env != nullptr && std::string(env) == "1";
    }()};
    return flag;
}

}  // namespace

void set_exact_activations(bool on) { exact_flag().store(on); }
bool exact_activations() { return exact_flag().load(); }

int activation_block(uint32_t type) { return type < RG_TYPE_COUNT ? active_table().act_block[type] : 0; }

namespace {

// Per-thread kernel scratch, grown on demand.
struct ThreadScratch {
    std::vector<int8_t> q;
    std::vector<float> scale, bias, row, dsuper;
    std::vector<int16_t> isc;
    Scratch get(int64_t cols) {
        q.resize(size_t(kPanelRows * cols));
        scale.resize(size_t(kPanelRows * (cols / 16 + 1)));
        bias.resize(scale.size());
        isc.resize(scale.size());
        dsuper.resize(size_t(kPanelRows * (cols / 256 + 1)));
        row.resize(size_t(cols));
        return {q.data(), scale.data(), bias.data(), isc.data(), dsuper.data(), row.data()};
    }
};

class CpuBackend final : public Backend {
public:
    const char* name() const override { return "cpu"; }

    void matmul(const WeightView& w, const float* x, int64_t ntok, float* y) override {
        const TypeTraits* t = type_traits(w.type);
        if (!t || !t->supported) throw Error("matmul: unsupported weight type id " + std::to_string(w.type));
        if (w.rows <= 0 || w.cols <= 0 || ntok <= 0) throw Error("matmul: empty operand");
        if (w.cols % t->block_elems != 0)
            throw Error("matmul: " + std::string(t->name) + " row of " + std::to_string(w.cols) +
                        " elements is not a whole number of " + std::to_string(t->block_elems) + "-element blocks");
        if (w.row_bytes < type_row_bytes(*t, w.cols)) throw Error("matmul: row_bytes smaller than one row");
        const KernelTable& table = active_table();
        const bool exact = exact_activations();
        const RowsKernel kernel = exact ? table.exact_by_type[w.type] : table.by_type[w.type];
        if (!kernel) throw Error("matmul: no kernel for type " + std::string(t->name));

        MatmulArgs args{static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, ntok, x,
                        nullptr, nullptr, nullptr, y};
        const bool quantized = t->block_elems > 1 && !exact;
        thread_local std::vector<int8_t> xq_;
        thread_local std::vector<float> xd_, xs_;
        if (quantized) {
            xq_.resize(size_t(ntok * w.cols));
            const int block = table.act_block[w.type];
            xd_.resize(size_t(ntok * w.cols / block));
            xs_.resize(size_t(ntok * w.cols / 16));
            for (int64_t i = 0; i < ntok; ++i)
                quantize_activations(x + i * w.cols, w.cols, block, xq_.data() + i * w.cols,
                                     xd_.data() + i * w.cols / block, xs_.data() + i * w.cols / 16);
            args.xq = xq_.data();
            args.xd = xd_.data();
            args.xs = xs_.data();
        }
        const int64_t grain = ntok > kMaxTok ? kPanelRows : 4;
        default_pool().parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1) {
            thread_local ThreadScratch scratch;
            kernel(args, r0, r1, scratch.get(w.cols));
        });
    }
};

}  // namespace
}  // namespace cpu

Backend& cpu_backend() {
    static cpu::CpuBackend backend;
    return backend;
}

}  // namespace regolith
