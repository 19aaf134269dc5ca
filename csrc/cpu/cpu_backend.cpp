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
    std::vector<float> scale, bias, row, panel, acc, dsuper;
    std::vector<int16_t> isc;
    Scratch get(int64_t cols) {
        q.resize(size_t(kPanelRows * cols));
        scale.resize(size_t(kPanelRows * (cols / 16 + 1)));
        bias.resize(scale.size());
        isc.resize(scale.size());
        dsuper.resize(size_t(kPanelRows * (cols / 256 + 1)));
        row.resize(size_t(cols));
        panel.resize(size_t(kPanelRows * cols));
        acc.resize(size_t(kPanelRows / 2 * (kTileTokens / 3) * kTileAcc));
        return {q.data(),   scale.data(), bias.data(), isc.data(), dsuper.data(),
                row.data(), panel.data(), acc.data()};
    }
};

class CpuBackend final : public Backend {
public:
    const char* name() const override { return "cpu"; }

    void matmul(const WeightView& w, const float* x, int64_t ntok, float* y) override {
        const bool exact = exact_activations();  // read once: kernel and activations must agree
        const RowsKernel kernel = prepare(w, ntok, exact);
        const MatmulArgs args = activations(w, x, ntok, y, exact, true);
        const int64_t grain = ntok > kMaxTok ? kPanelRows : 4;
        default_pool()->parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1) {
            thread_local ThreadScratch scratch;
            kernel(args, r0, r1, scratch.get(w.cols));
        });
    }

    void matmul_batch(const MatmulJob* jobs, int64_t n_jobs) override {
        if (n_jobs == 1) return matmul(jobs[0].w, jobs[0].x, jobs[0].ntok, jobs[0].y);
        const bool exact = exact_activations();
        std::vector<RowsKernel> kernels;
        for (int64_t j = 0; j < n_jobs; ++j) kernels.push_back(prepare(jobs[j].w, jobs[j].ntok, exact));
        // Each thread takes whole jobs, the next unclaimed one at a time (jobs differ in size).
        std::atomic<int64_t> next{0};
        default_pool()->parallel_for(default_threads(), 1, [&](int64_t, int64_t) {
            thread_local ThreadScratch scratch;
            for (int64_t j; (j = next.fetch_add(1)) < n_jobs;) {
                const MatmulJob& job = jobs[j];
                const MatmulArgs args = activations(job.w, job.x, job.ntok, job.y, exact, false);
                kernels[size_t(j)](args, 0, job.w.rows, scratch.get(job.w.cols));
            }
        });
    }

private:
    // Validates a product and picks its kernel.
    static RowsKernel prepare(const WeightView& w, int64_t ntok, bool exact) {
        const TypeTraits* t = type_traits(w.type);
        if (!t || !t->supported) throw Error("matmul: unsupported weight type id " + std::to_string(w.type));
        if (w.rows <= 0 || w.cols <= 0 || ntok <= 0) throw Error("matmul: empty operand");
        if (w.cols % t->block_elems != 0)
            throw Error("matmul: " + std::string(t->name) + " row of " + std::to_string(w.cols) +
                        " elements is not a whole number of " + std::to_string(t->block_elems) + "-element blocks");
        if (w.row_bytes < type_row_bytes(*t, w.cols)) throw Error("matmul: row_bytes smaller than one row");
        const KernelTable& table = active_table();
        const RowsKernel kernel = exact ? table.exact_by_type[w.type] : table.by_type[w.type];
        if (!kernel) throw Error("matmul: no kernel for type " + std::string(t->name));
        return kernel;
    }

    // The kernel arguments, with the activations quantized (into this thread's buffers) where the weight
    // type needs it; `threaded`: quantize a large batch of tokens on the pool.
    static MatmulArgs activations(const WeightView& w, const float* x, int64_t ntok, float* y, bool exact,
                                  bool threaded) {
        MatmulArgs args{static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, ntok, x,
                        nullptr, nullptr, nullptr, y};
        if (type_traits(w.type)->block_elems == 1 || exact) return args;
        const KernelTable& table = active_table();
        const int block = table.act_block[w.type];
        thread_local std::vector<int8_t> xq_;
        thread_local std::vector<float> xd_, xs_;
        xq_.resize(size_t(ntok * w.cols));
        xd_.resize(size_t(ntok * w.cols / block));
        xs_.resize(size_t(ntok * w.cols / 16));
        // pointers, not the thread_local vectors: a worker naming xq_ would get its own instance
        int8_t* xq = xq_.data();
        float *xd = xd_.data(), *xs = xs_.data();
        const auto quantize_rows = [&](int64_t t0, int64_t t1) {
            for (int64_t i = t0; i < t1; ++i)
                table.quantize(x + i * w.cols, w.cols, block, xq + i * w.cols, xd + i * w.cols / block,
                               xs + i * w.cols / 16);
        };
        if (threaded && ntok >= 8)
            default_pool()->parallel_for(ntok, 1, quantize_rows);
        else
            quantize_rows(0, ntok);
        args.xq = xq;
        args.xd = xd;
        args.xs = xs;
        return args;
    }
};

}  // namespace
}  // namespace cpu

Backend& cpu_backend() {
    static cpu::CpuBackend backend;
    return backend;
}

}  // namespace regolith
