// CPU matrix products: validates a product, prepares its activations and runs the active ISA's kernels over
// row ranges on the default thread pool.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/errors.h"
#include "core/thread_pool.h"
#include "core/types.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/matmul.h"

namespace regolith {
namespace cpu {

int64_t choose_prefetch_bytes() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();  // may run before the constructors that would (a static initializer)
    if (__builtin_cpu_is("amd")) return 8192;
#endif
    return 2048;
}

void quantize_activations(const float* x, int64_t n, int block, int8_t* q, float* d, float* s) {
    for (int64_t b = 0; b < n; b += block) {
        float amax = 0.0f;
        for (int i = 0; i < block; ++i) amax = std::fmax(amax, std::fabs(x[b + i]));
        const float scale = amax / 127.0f;
        const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int i = 0; i < block; ++i) q[b + i] = int8_t(std::lrintf(x[b + i] * inv));
        d[b / block] = scale;
    }
    activation_sums(q, d, n, block, s);
}

void activation_sums(const int8_t* q, const float* d, int64_t n, int block, float* s) {
    for (int64_t g = 0; g < n; g += 16) {
        int32_t sum = 0;
        for (int i = 0; i < 16; ++i) sum += q[g + i];
        s[g / 16] = d[g / block] * float(sum);
    }
}

namespace {

const KernelTable& active_table() {
    switch (active_isa()) {
#if defined(RG_HAVE_AVX2)
        case Isa::Avx2:
            return kernels_avx2();
#endif
#if defined(RG_HAVE_AVXVNNI)
        case Isa::AvxVnni:
            return kernels_avxvnni();
#endif
#if defined(RG_HAVE_AVX512)
        case Isa::Avx512:
            return kernels_avx512();
#endif
#if defined(RG_HAVE_NEON)
        case Isa::Neon:
            return kernels_neon();
#endif
#if defined(RG_HAVE_NEONDOT)
        case Isa::NeonDot:
            return kernels_neondot();
#endif
        default:
            return kernels_scalar();
    }
}

}  // namespace


int activation_block(uint32_t type) { return type < RG_TYPE_COUNT ? active_table().act_block[type] : 0; }

namespace {

// Grows v to at least n elements; never shrinks, so alternating sizes do not zero-fill the regrown tail on
// every call (kernels write scratch before reading it).
template <class T>
T* at_least(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
}

// The codes + 128 (uint8) of the kernels of the offset form (KernelTable::act_offset).
void offset_codes(const int8_t* __restrict q, int64_t n, uint8_t* __restrict u) {
    for (int64_t i = 0; i < n; ++i) u[i] = uint8_t(q[i]) ^ 0x80;
}

// Per-thread kernel scratch, grown on demand.
struct ThreadScratch {
    std::vector<int8_t> q;
    std::vector<float> scale, bias, row, panel, acc, dsuper, xdt;
    std::vector<int16_t> isc;
    Scratch get(int64_t cols) {
        const size_t groups = size_t(kPanelRows * (cols / 16 + 1));
        return {at_least(q, size_t(kPanelRows * cols)),
                at_least(scale, groups),
                at_least(bias, groups),
                at_least(isc, groups),
                at_least(dsuper, size_t(kPanelRows * (cols / 256 + 1))),
                at_least(row, size_t(cols)),
                at_least(panel, size_t(kPanelRows * cols)),
                at_least(acc, size_t(kPanelRows / 2 * (kTileTokens / 3) * kTileAcc)),
                at_least(xdt, size_t(kMaxTok * (cols / 128 + 1)))};
    }
};

// Multiply-adds of a product (the chunking's unit of work).
double work(const MatmulJob& job) {
    return double(job.w.rows) * double(job.w.cols) * double(job.ntok);
}

// Validates a product and picks its kernel.
RowsKernel prepare(const WeightView& w, int64_t ntok, bool exact) {
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

// The kernel arguments of a prefill product, with the activations quantized on the pool (into the calling
// thread's buffers) where the weight type needs it.
MatmulArgs activations(const WeightView& w, const float* x, int64_t ntok, float* y, bool exact) {
    MatmulArgs args{static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, ntok, x,
                    nullptr, nullptr, nullptr, nullptr, y};
    if (type_traits(w.type)->block_elems == 1 || exact) return args;
    const KernelTable& table = active_table();
    const int block = table.act_block[w.type];
    thread_local std::vector<int8_t> xq_;
    thread_local std::vector<float> xd_, xs_;
    thread_local std::vector<uint8_t> xu_;
    // pointers, not the thread_local vectors: a worker naming xq_ would get its own instance
    int8_t* xq = at_least(xq_, size_t(ntok * w.cols));
    float* xd = at_least(xd_, size_t(ntok * w.cols / block));
    float* xs = at_least(xs_, size_t(ntok * w.cols / 16));
    uint8_t* xu = table.act_offset[w.type] ? at_least(xu_, size_t(ntok * w.cols)) : nullptr;
    const auto quantize_rows = [&](int64_t t0, int64_t t1) {
        for (int64_t i = t0; i < t1; ++i) {
            table.quantize(x + i * w.cols, w.cols, block, xq + i * w.cols, xd + i * w.cols / block,
                           xs + i * w.cols / 16);
            if (xu) offset_codes(xq + i * w.cols, w.cols, xu + i * w.cols);
        }
    };
    default_pool()->parallel_for(ntok, 1, quantize_rows);
    args.xq = xq;
    args.xd = xd;
    args.xs = xs;
    args.xu = xu;
    return args;
}


struct Chunk {
    int64_t job, r0, r1;
};

// A batch's kernels and arguments, its activations quantized once per distinct input (an expert's gate
// and up read the same rows) into buffers that live until the next batch on this thread.
struct BatchScratch {
    std::vector<RowsKernel> kernels;
    std::vector<MatmulArgs> args;
    std::vector<Chunk> chunks;
    std::vector<int8_t> xq;
    std::vector<float> xd, xs;
    std::vector<uint8_t> xu;

    void fill(const MatmulJob* jobs, int64_t n_jobs, bool exact) {
        kernels.clear();
        args.clear();
        const KernelTable& table = active_table();
        size_t nq = 0, nd = 0, ns = 0, nu = 0;  // buffer offsets of each quantized input
        std::vector<std::array<size_t, 4>> at(static_cast<size_t>(n_jobs));
        std::vector<int64_t> source(size_t(n_jobs), -1);  // an earlier job with the same quantized input
        for (int64_t j = 0; j < n_jobs; ++j) {
            const MatmulJob& job = jobs[j];
            kernels.push_back(prepare(job.w, job.ntok, exact));
            args.push_back({static_cast<const uint8_t*>(job.w.data), job.w.row_bytes, job.w.rows,
                            job.w.cols, job.ntok, job.x, nullptr, nullptr, nullptr, nullptr, job.y});
            if (type_traits(job.w.type)->block_elems == 1 || exact) continue;
            const int block = table.act_block[job.w.type];
            const bool offset = table.act_offset[job.w.type];
            for (int64_t i = 0; i < j && source[size_t(j)] < 0; ++i)
                if (args[size_t(i)].x == job.x && args[size_t(i)].ntok == job.ntok &&
                    args[size_t(i)].cols == job.w.cols && type_traits(jobs[i].w.type)->block_elems != 1 &&
                    table.act_block[jobs[i].w.type] == block && table.act_offset[jobs[i].w.type] == offset)
                    source[size_t(j)] = i;
            if (source[size_t(j)] >= 0) continue;
            at[size_t(j)] = {nq, nd, ns, nu};
            nq += size_t(job.ntok * job.w.cols);
            nd += size_t(job.ntok * job.w.cols / block);
            ns += size_t(job.ntok * job.w.cols / 16);
            if (offset) nu += size_t(job.ntok * job.w.cols);
        }
        int8_t* q = at_least(xq, nq);
        float *d = at_least(xd, nd), *sums = at_least(xs, ns);
        uint8_t* u = at_least(xu, nu);
        for (int64_t j = 0; j < n_jobs; ++j) {
            MatmulArgs& a = args[size_t(j)];
            if (type_traits(jobs[j].w.type)->block_elems == 1 || exact) continue;
            if (source[size_t(j)] >= 0) {
                const MatmulArgs& s = args[size_t(source[size_t(j)])];
                a.xq = s.xq, a.xd = s.xd, a.xs = s.xs, a.xu = s.xu;
                continue;
            }
            const int block = table.act_block[jobs[j].w.type];
            int8_t* jq = q + at[size_t(j)][0];
            float *jd = d + at[size_t(j)][1], *js = sums + at[size_t(j)][2];
            for (int64_t t = 0; t < a.ntok; ++t)
                table.quantize(a.x + t * a.cols, a.cols, block, jq + t * a.cols, jd + t * a.cols / block,
                               js + t * a.cols / 16);
            a.xq = jq, a.xd = jd, a.xs = js;
            if (table.act_offset[jobs[j].w.type]) {
                a.xu = u + at[size_t(j)][3];
                offset_codes(jq, a.ntok * a.cols, u + at[size_t(j)][3]);
            }
        }
    }
};

// Products whose rows are split into chunks of about 1/8 of a thread's share of the work (multiples of
// kPanelRows), claimed by the threads as they finish earlier ones: products differ in size, and a thread
// delayed by another process does not hold up the rest. Every y[t][r] depends on row r and x[t] only, so
// the split leaves the bits.
void run_chunked(const MatmulJob* jobs, int64_t n_jobs) {
    const bool exact = exact_activations();
    thread_local BatchScratch bs;
    bs.fill(jobs, n_jobs, exact);
    const int threads = default_threads();
    double total = 0.0;
    for (int64_t j = 0; j < n_jobs; ++j) total += work(jobs[j]);
    const double share = total / (8.0 * threads);
    bs.chunks.clear();
    for (int64_t j = 0; j < n_jobs; ++j) {
        const int64_t rows = jobs[j].w.rows;
        int64_t step = int64_t(share / work(jobs[j]) * double(rows));
        step = std::clamp<int64_t>((step + kPanelRows - 1) / kPanelRows * kPanelRows, kPanelRows, rows);
        for (int64_t r0 = 0; r0 < rows; r0 += step)
            bs.chunks.push_back({j, r0, std::min(rows, r0 + step)});
    }
    const int64_t n_chunks = int64_t(bs.chunks.size());
    const Chunk* chunks = bs.chunks.data();
    const RowsKernel* kernels = bs.kernels.data();
    const MatmulArgs* args = bs.args.data();
    std::atomic<int64_t> next{0};
    const auto claim = [&](int64_t, int64_t) {
        thread_local ThreadScratch scratch;
        for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n_chunks;) {
            const Chunk& c = chunks[i];
            kernels[c.job](args[c.job], c.r0, c.r1, scratch.get(args[c.job].cols));
        }
    };
    if (n_chunks == 1)
        claim(0, 1);
    else
        default_pool()->parallel_for(threads, 1, claim);
}

}  // namespace

// Decode-sized products take the chunked path; prefill splits the rows evenly, its activations quantized
// on the pool.
void matmul(const WeightView& w, const float* x, int64_t ntok, float* y) {
    if (ntok <= kMaxTok) {
        const MatmulJob job{w, x, ntok, y};
        return run_chunked(&job, 1);
    }
    const bool exact = exact_activations();  // read once: kernel and activations must agree
    const RowsKernel kernel = prepare(w, ntok, exact);
    const MatmulArgs args = activations(w, x, ntok, y, exact);
    default_pool()->parallel_for(w.rows, kPanelRows, [&](int64_t r0, int64_t r1) {
        thread_local ThreadScratch scratch;
        kernel(args, r0, r1, scratch.get(w.cols));
    });
}

void matmul_batch(const MatmulJob* jobs, int64_t n_jobs) {
    if (n_jobs <= 0) return;
    if (n_jobs == 1) return matmul(jobs[0].w, jobs[0].x, jobs[0].ntok, jobs[0].y);
    run_chunked(jobs, n_jobs);
}

}  // namespace cpu
}  // namespace regolith
