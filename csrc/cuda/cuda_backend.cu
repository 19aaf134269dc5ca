// The CUDA backend: buffers in device memory (cudaMalloc), one stream per backend on which every op and
// write is recorded in order, the op families' kernels in the other files of this folder.
//
// Submission: the ops between two points where the host must wait or decide (read(), submit(), buffer
// allocation) are captured from the stream into a CUDA graph and launched as one graph, its executable kept
// and updated in place while the ops keep their shape (a decode step: one launch instead of one per
// kernel). Small writes inside a capture are staged in pinned host memory and copied by a kernel; copies
// and fills are kernels too, so a step's graph is kernels only and updates in place.
// REGOLITH_CUDA_GRAPHS=0 launches every kernel directly instead.
//
// Uploads (expert records from the arena's I/O threads) go on a copy stream of their own, after everything
// submitted (an event at each submit()), each recording an event of its own: an op waits only for the
// uploads into the tensors it uses (use()), a read for all of them.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/types.h"
#include "cuda/kernels.cuh"

namespace regolith {

namespace cuda {

bool pdl_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("REGOLITH_CUDA_PDL");
        if (v && std::string(v) == "0") return false;
        int dev = 0, major = 0;
        return cudaGetDevice(&dev) == cudaSuccess &&
               cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
    }();
    return on;
}

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

struct CudaBuffer final : BackendBuffer {
    uint8_t* ptr = nullptr;   // the device's address
    uint8_t* host = nullptr;  // MemoryUse::Mapped: page-locked host memory the device reads through ptr
    uint64_t bytes = 0;
};

namespace {

int64_t packed_row_bytes(const Tensor& t) {
    const TypeTraits* tt = type_traits(t.type);
    if (!tt) throw Error("tensor of unknown type id " + std::to_string(t.type));
    return type_row_bytes(*tt, t.cols);
}

}  // namespace

View view(const Tensor& t) {
    if (!t) return {};
    const auto* b = static_cast<const CudaBuffer*>(t.buffer);
    const int64_t row = packed_row_bytes(t);
    if (t.rows < 0 || t.cols < 0 || (t.rows > 1 && t.row_bytes < row) ||
        (t.rows > 0 && t.offset + uint64_t((t.rows - 1) * t.row_bytes + row) > b->bytes))
        throw Error("tensor [" + std::to_string(t.rows) + "][" + std::to_string(t.cols) + "] at offset " +
                    std::to_string(t.offset) + " does not fit its buffer of " + std::to_string(b->bytes) + " bytes");
    return {b->ptr + t.offset, t.rows, t.cols, t.row_bytes, t.type};
}

Scratch::~Scratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);
}

void* Scratch::get(size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_ && stream == stream_) return ptr_;
    const auto grow = [&] {
        if (ptr_) RG_CUDA(cudaFreeAsync(ptr_, stream_));  // after the launches recorded before it
        bytes_ = std::max(bytes, 2 * bytes_);
        stream_ = stream;
        RG_CUDA(cudaMallocAsync(&ptr_, bytes_, stream));
    };
    if (outside)
        outside(grow);
    else
        grow();
    return ptr_;
}

namespace {

template <class Seq, class SeqView, class F>
std::vector<SeqView> views(const Seq* seqs, int64_t n, F f) {
    std::vector<SeqView> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(f(seqs[i]));
    return out;
}

// Pinned host memory that small writes inside a graph capture are staged in: a ring of kSlots slots, one
// filled while the graphs that read the others may still be pending on the device (each slot's last graph
// launch is followed by an event), so the host runs up to kSlots graphs with writes ahead of the device.
class WriteStaging {
public:
    static constexpr int kSlots = 16;
    static constexpr size_t kSlot = 1u << 20, kMaxWrite = 256u << 10;
    WriteStaging() {
        RG_CUDA(cudaMallocHost(&mem_, kSlots * kSlot));
        for (cudaEvent_t& e : done_) RG_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    ~WriteStaging() {
        for (cudaEvent_t e : done_) cudaEventDestroy(e);
        cudaFreeHost(mem_);
    }
    // bytes of the current slot (nullptr when it is full)
    uint8_t* take(size_t bytes) {
        const size_t at = (used_ + 15) / 16 * 16;
        if (at + bytes > kSlot) return nullptr;
        used_ = at + bytes;
        return mem_ + slot_ * kSlot + at;
    }
    // After the current slot's copies were launched on `s`: on to the next slot, once the copies that read
    // it last are done.
    void launched(cudaStream_t s) {
        if (used_ == 0) return;
        RG_CUDA(cudaEventRecord(done_[slot_], s));
        slot_ = (slot_ + 1) % kSlots, used_ = 0;
        RG_CUDA(cudaEventSynchronize(done_[slot_]));
    }

private:
    uint8_t* mem_ = nullptr;
    cudaEvent_t done_[kSlots] = {};
    int slot_ = 0;
    size_t used_ = 0;
};

// Pinned host memory that grows to the largest request (reads bounce through it).
class PinnedBuffer {
public:
    ~PinnedBuffer() {
        if (mem_) cudaFreeHost(mem_);
    }
    uint8_t* get(size_t bytes) {
        if (bytes > bytes_) {
            if (mem_) RG_CUDA(cudaFreeHost(mem_));
            mem_ = nullptr, bytes_ = 0;
            RG_CUDA(cudaMallocHost(&mem_, bytes));
            bytes_ = bytes;
        }
        return static_cast<uint8_t*>(mem_);
    }

private:
    void* mem_ = nullptr;
    size_t bytes_ = 0;
};

// Launches the stream's captured ops as graphs. A step's ops arrive as a sequence of captures (cut every
// kChunkOps ops, so the device starts on the first while the host captures the next, and at every read), and
// the i-th capture since the last read keeps executable i, updated in place while its graph keeps its shape.
// A segment whose graph failed to update kUnstable times in a row (a streamed MoE layer: its experts and
// their waves change from token to token) is launched directly, without capture, its next kDirectRuns times:
// instantiating a graph to launch it once costs the host more than launching its kernels one by one.
// verbose: each launch on stderr (REGOLITH_CUDA_GRAPHS=verbose).
class GraphLauncher {
public:
    static constexpr int kChunkOps = 32;
    explicit GraphLauncher(bool verbose) : verbose_(verbose) {}
    ~GraphLauncher() {
        for (Exec& e : execs_)
            if (e.exec) cudaGraphExecDestroy(e.exec);
    }
    void launch(cudaGraph_t graph, cudaStream_t s) {
        size_t nodes = 0;
        RG_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
        if (nodes == 0) return;
        const size_t i = next_++;
        if (i >= kMaxExecs) {  // past the cached ones: a one-off executable
            cudaGraphExec_t exec = nullptr;
            RG_CUDA(cudaGraphInstantiate(&exec, graph, 0));
            const cudaError_t e = cudaGraphLaunch(exec, s);
            cudaGraphExecDestroy(exec);  // released once the launch completes
            RG_CUDA(e);
            return;
        }
        if (execs_.size() <= i) execs_.resize(i + 1);
        Exec& x = execs_[i];
        int why = -1;
        bool updated = false;
        if (x.exec && x.nodes == nodes) {
            cudaGraphExecUpdateResultInfo info;
            updated = cudaGraphExecUpdate(x.exec, graph, &info) == cudaSuccess;
            if (!updated) {
                why = int(info.result);
                (void)cudaGetLastError();  // a failed update is not an error: the graph differs
            }
        }
        if (!updated) {
            if (x.exec) {
                cudaGraphExecDestroy(x.exec);
                if (++x.failures >= kUnstable) x.direct = kDirectRuns, x.failures = 0;
            }
            x.exec = nullptr;
            RG_CUDA(cudaGraphInstantiate(&x.exec, graph, 0));
            x.nodes = nodes;
        } else {
            x.failures = 0;
        }
        if (verbose_)
            std::fprintf(stderr, "regolith cuda: graph %zu of %zu nodes %s (update result %d)\n", i, nodes,
                         updated ? "updated" : "instantiated", why);
        RG_CUDA(cudaGraphLaunch(x.exec, s));
    }
    // Whether the next segment is launched directly (not captured); then skip() stands for its launch().
    bool direct_next() const { return next_ < execs_.size() && execs_[next_].direct > 0; }
    void skip() {
        const size_t i = next_++;
        if (i < execs_.size() && execs_[i].direct > 0) --execs_[i].direct;
    }
    // A read: the next capture is the first of a new sequence.
    void restart() { next_ = 0; }

private:
    static constexpr size_t kMaxExecs = 256;
    static constexpr int kUnstable = 2, kDirectRuns = 16;
    const bool verbose_;
    struct Exec {
        cudaGraphExec_t exec = nullptr;
        size_t nodes = 0;
        int failures = 0;  // failed updates in a row
        int direct = 0;    // launches left to run directly
    };
    std::vector<Exec> execs_;
    size_t next_ = 0;
};

// REGOLITH_CUDA_GRAPHS: unset or 1 graphs, 0 direct launches, verbose graphs with each launch on stderr.
std::string graphs_setting() {
    const char* v = std::getenv("REGOLITH_CUDA_GRAPHS");
    return v ? v : "1";
}

class CudaBackend final : public Backend {
public:
    CudaBackend() : graphs_(graphs_setting() != "0"), launcher_(graphs_setting() == "verbose") {
        RG_CUDA(cudaSetDevice(0));
        RG_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        RG_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
        RG_CUDA(cudaEventCreateWithFlags(&submitted_, cudaEventDisableTiming));
        cuda::init_matmul_kernels();
        cuda::init_moe_kernels();
        const auto outside = [this](const std::function<void()>& f) {
            end_capture();
            {
                std::lock_guard<std::mutex> lock(capture_mu_);
                f();
            }
            if (graphs_) begin();  // the rest of the op is captured again
        };
        matmul_scratch_.outside = outside;
        op_scratch_.outside = outside;
    }
    ~CudaBackend() override {
        try {
            end_capture();
        } catch (const Error&) {  // nothing left to report it to
        }
        cudaStreamSynchronize(copy_);
        cudaStreamSynchronize(stream_);
        cudaEventDestroy(submitted_);
        for (const PendingUpload& p : pending_) cudaEventDestroy(p.done);
        for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
        cudaStreamDestroy(copy_);
        cudaStreamDestroy(stream_);
    }

    const char* name() const override { return "cuda"; }
    bool supports_cache(uint32_t type) const override {
        return type == RG_TYPE_F32 || type == RG_TYPE_F16 || type == RG_TYPE_Q8_0 || type == RG_TYPE_I8;
    }

    BackendBuffer* alloc(uint64_t bytes, MemoryUse use) override {
        end_capture();
        auto b = std::make_unique<CudaBuffer>();
        b->bytes = bytes;
        // whole 256-byte units: the products read a row's blocks in aligned 16-byte pieces (cuda/qmma.cuh),
        // the last of which may extend past the tensor's last byte
        const size_t size = std::max<uint64_t>((bytes + 255) / 256 * 256, 256);
        if (use == MemoryUse::Mapped) {
            void* h = nullptr;
            cudaError_t e = cudaHostAlloc(&h, size, cudaHostAllocMapped | cudaHostAllocPortable);
            if (e == cudaSuccess) {
                b->host = static_cast<uint8_t*>(h);
                e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&b->ptr), h, 0);
                if (e != cudaSuccess) cudaFreeHost(h);
            }
            if (e != cudaSuccess)
                throw Error("CUDA: cannot allocate " + std::to_string(bytes) + " bytes of mapped host memory: " +
                            cudaGetErrorString(e));
            return b.release();
        }
        const cudaError_t e = cudaMalloc(&b->ptr, size);
        if (e != cudaSuccess)
            throw Error("CUDA: cannot allocate " + std::to_string(bytes) + " bytes of device memory: " +
                        cudaGetErrorString(e));
        return b.release();
    }
    BackendBuffer* import_host(const void* data, uint64_t bytes) override {
        BackendBuffer* b = alloc(bytes, MemoryUse::Device);
        outside_capture([&] {
            RG_CUDA(cudaMemcpyAsync(static_cast<CudaBuffer*>(b)->ptr, data, bytes, cudaMemcpyHostToDevice, stream_));
            RG_CUDA(cudaStreamSynchronize(stream_));
        });
        return b;
    }
    void free(BackendBuffer* buffer) override {
        if (!buffer) return;
        auto* b = static_cast<CudaBuffer*>(buffer);
        outside_capture([&] {
            cudaStreamSynchronize(copy_);
            cudaStreamSynchronize(stream_);  // ops recorded before may still read it
        });
        if (b->host)
            cudaFreeHost(b->host);
        else
            cudaFree(b->ptr);
        delete b;
    }
    void* host_address(BackendBuffer* buffer) override {
        return buffer ? static_cast<CudaBuffer*>(buffer)->host : nullptr;
    }
    bool supports_expert_slots() const override { return true; }
    bool lock(BackendBuffer*, std::string*) override { return true; }  // device memory is never paged out
    bool pin_host(void* p, uint64_t bytes) override {
        bool ok = false;
        outside_capture([&] {
            ok = cudaHostRegister(p, size_t(bytes), cudaHostRegisterDefault) == cudaSuccess;
            if (!ok) (void)cudaGetLastError();  // not an error: the memory works unpinned
        });
        return ok;
    }
    void unpin_host(void* p) override {
        outside_capture([&] {
            cudaStreamSynchronize(copy_);  // no upload still reads it
            cudaHostUnregister(p);
        });
    }
    std::string device_name() override {
        cudaDeviceProp p{};
        RG_CUDA(cudaGetDeviceProperties(&p, 0));
        return p.name;
    }
    bool device_memory(uint64_t* free_bytes, uint64_t* total_bytes) override {
        end_capture();
        size_t f = 0, t = 0;
        RG_CUDA(cudaMemGetInfo(&f, &t));
        *free_bytes = f, *total_bytes = t;
        return true;
    }

    void write(const Tensor& dst, const void* src) override {
        const View d = use(dst);
        const size_t row = size_t(packed_row_bytes(dst)), bytes = row * size_t(d.rows);
        if (d.rows == 0) return;
        if (graphs_ && bytes <= WriteStaging::kMaxWrite) {
            begin();
            uint8_t* staged = staging_.take(bytes);
            if (!staged) {  // the slot is full: launch what it holds, then fill the next
                end_capture();
                begin();
                staged = staging_.take(bytes);
            }
            std::memcpy(staged, src, bytes);
            cuda::copy_2d(stream_, d.base, size_t(d.stride), staged, row, row, size_t(d.rows));  // reads pinned memory
            return;
        }
        outside_capture([&] {
            RG_CUDA(cudaMemcpy2DAsync(d.base, size_t(d.stride), src, row, row, size_t(d.rows), cudaMemcpyHostToDevice,
                                      stream_));
        });
    }
    uint64_t upload(const Tensor& dst, const void* src) override {
        const View d = cuda::view(dst);
        const size_t row = size_t(packed_row_bytes(dst));
        if (d.rows == 0) return 0;
        // (host-tier hits upload from the thread recording the ops, maybe inside its capture: no call here
        // may be one a capture forbids, such as an event query)
        std::lock_guard<std::mutex> lock(upload_mu_);
        RG_CUDA(cudaStreamWaitEvent(copy_, submitted_, 0));
        RG_CUDA(cudaMemcpy2DAsync(d.base, size_t(d.stride), src, row, row, size_t(d.rows), cudaMemcpyHostToDevice,
                                  copy_));
        cudaEvent_t done = nullptr;
        if (free_events_.empty()) {
            RG_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
        } else {
            done = free_events_.back(), free_events_.pop_back();
        }
        RG_CUDA(cudaEventRecord(done, copy_));
        pending_.push_back({extent_begin(d), extent_end(d, row), done});
        uploads_pending_.store(true, std::memory_order_release);
        return ++uploads_issued_;
    }
    void wait_upload(uint64_t ticket) override {
        // an event recorded now on the copy stream completes after every upload issued so far, this one too
        cudaEvent_t e = nullptr;
        uint64_t upto = 0;
        {
            std::lock_guard<std::mutex> lock(upload_mu_);
            if (ticket <= uploads_copied_) return;
            if (free_events_.empty()) {
                RG_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            } else {
                e = free_events_.back(), free_events_.pop_back();
            }
            RG_CUDA(cudaEventRecord(e, copy_));
            upto = uploads_issued_;
        }
        const cudaError_t err = cudaEventSynchronize(e);
        std::lock_guard<std::mutex> lock(upload_mu_);
        free_events_.push_back(e);
        RG_CUDA(err);
        uploads_copied_ = std::max(uploads_copied_, upto);
    }
    void read(const Tensor& src, void* dst) override {
        const View s = cuda::view(src);
        const size_t row = size_t(packed_row_bytes(src)), bytes = row * size_t(s.rows);
        wait_uploads();
        outside_capture([&] {
            launcher_.restart();
            // up to kMaxBounce bytes through pinned memory (logits, routing ids): a copy to pageable memory
            // is several times slower
            uint8_t* bounce = bytes && bytes <= kMaxBounce ? read_bounce_.get(bytes) : nullptr;
            if (bytes)
                RG_CUDA(cudaMemcpy2DAsync(bounce ? bounce : dst, row, s.base, size_t(s.stride), row, size_t(s.rows),
                                          cudaMemcpyDeviceToHost, stream_));
            RG_CUDA(cudaStreamSynchronize(stream_));
            if (bounce) std::memcpy(dst, bounce, bytes);
        });
    }
    void submit() override {
        outside_capture([&] {
            std::lock_guard<std::mutex> lock(upload_mu_);
            RG_CUDA(cudaEventRecord(submitted_, stream_));
        });
    }

protected:
    void do_copy(const Tensor& src, const Tensor& dst) override {
        const View s = use(src), d = use(dst);
        const size_t row = size_t(packed_row_bytes(src));
        if (s.rows == 0) return;
        cuda::copy_2d(op_stream(), d.base, size_t(d.stride), s.base, size_t(s.stride), row, size_t(s.rows));
    }
    void do_zero(const Tensor& dst) override {
        const View d = use(dst);
        if (d.rows == 0) return;
        cuda::zero_2d(op_stream(), d.base, size_t(d.stride), size_t(packed_row_bytes(dst)), size_t(d.rows));
    }
    void do_matmul(const MatmulJob* jobs, int64_t n_jobs) override {
        std::vector<MatmulView> v;
        for (int64_t i = 0; i < n_jobs; ++i) v.push_back({use(jobs[i].w), use(jobs[i].x), use(jobs[i].y)});
        cuda::matmul(op_stream(), v.data(), int(v.size()), matmul_scratch_);
    }
    void do_get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat, const Tensor& out) override {
        cuda::get_rows(op_stream(), use(table), use(ids), scale, repeat, use(out));
    }
    void do_gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override {
        cuda::gather_rows(op_stream(), use(x), use(rows), use(out));
    }
    void do_top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) override {
        cuda::top_k(op_stream(), use(x), k, use(ids), use(values));
    }
    void do_rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override {
        cuda::rms_norm(op_stream(), use(x), use(w), eps, use(y));
    }
    void do_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act,
                           const Tensor& y) override {
        cuda::rms_norm_gated(op_stream(), use(x), use(z), use(w), eps, act == Unary::Sigmoid,
                             use(y));
    }
    void do_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y) override {
        cuda::layer_norm(op_stream(), use(x), use(w), use(b), eps, use(y));
    }
    void do_rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis, const Tensor& table) override {
        cuda::rope_table(op_stream(), use(pos), use(freq), use(axis), use(table));
    }
    void do_rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) override {
        cuda::rope(op_stream(), use(x), use(table), rows_per_pos);
    }
    void do_unary(const Tensor& x, Unary op, float p, const Tensor& y) override {
        cuda::unary(op_stream(), use(x), op, p, use(y));
    }
    void do_glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) override {
        cuda::glu(op_stream(), use(gate), use(up), act, use(y));
    }
    void do_add(const Tensor& a, const Tensor& b, const Tensor& y) override {
        cuda::add(op_stream(), use(a), use(b), use(y));
    }
    void do_hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) override {
        cuda::hc_mix(op_stream(), use(gate), use(xn), hc, use(mixed));
    }
    void do_hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) override {
        cuda::hc_write(op_stream(), use(out), use(w), hc, use(streams));
    }
    void do_ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs, const Tensor& out) override {
        cuda::ssm_conv(op_stream(), use(x), use(w_t),
                       views<ConvSeq, ConvSeqView>(seqs, n_seqs, [this](const ConvSeq& q) {
                           return ConvSeqView{use(q.state), use(q.after), q.t0, q.ntok};
                       }),
                       use(out));
    }
    void do_gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& dt_bias,
                        const GdnDims& d) override {
        cuda::gdn_prepare(op_stream(), use(qkv), use(g), use(beta), use(a), use(dt_bias), d);
    }
    void do_gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs, int64_t n_seqs,
                     const GdnDims& d, int64_t, const Tensor& out) override {
        cuda::gdn_scan(op_stream(), use(qkv), use(g), use(beta),
                       views<GdnSeq, GdnSeqView>(seqs, n_seqs, [this](const GdnSeq& q) {
                           return GdnSeqView{use(q.state), use(q.after), q.t0, q.ntok};
                       }),
                       d, use(out));
    }
    void do_store_rows(const Tensor& x, const Tensor& dst, const Tensor& scale) override {
        cuda::store_rows(op_stream(), use(x), use(dst), use(scale));
    }
    std::vector<QsaSeqView> qsa(const QsaSeq* seqs, int64_t n) {
        return views<QsaSeq, QsaSeqView>(seqs, n, [this](const QsaSeq& q) {
            return QsaSeqView{use(q.k),           use(q.v),       use(q.index_k),       use(q.block_k),
                              use(q.pos),         q.n0,           q.t0,                 q.ntok,
                              use(q.k_scale),     use(q.v_scale), use(q.index_k_scale), use(q.block_k_scale)};
        });
    }
    void do_qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq, const Tensor& axis,
                     const QsaDims& d) override {
        cuda::qsa_pool(op_stream(), qsa(seqs, n_seqs), use(norm), use(freq), use(axis), d);
    }
    void do_qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& sel,
                       const Tensor& n_sel) override {
        cuda::qsa_select(op_stream(), use(iq), qsa(seqs, n_seqs), d, use(sel), use(n_sel));
    }
    void do_qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel, const QsaSeq* seqs,
                       int64_t n_seqs, const QsaDims& d, const Tensor& out) override {
        cuda::qsa_attend(op_stream(), use(q), use(gate), use(sel), use(n_sel), qsa(seqs, n_seqs),
                         d, use(out), op_scratch_);
    }
    std::vector<KvSeqView> kv(const KvSeq* seqs, int64_t n) {
        return views<KvSeq, KvSeqView>(seqs, n, [this](const KvSeq& q) {
            return KvSeqView{use(q.k), use(q.vt), q.n0, q.t0, q.ntok, use(q.v), use(q.k_scale), use(q.v_scale)};
        });
    }
    void do_kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs, int64_t n_head_kv) override {
        cuda::kv_append(op_stream(), use(k), use(v), kv(seqs, n_seqs), n_head_kv);
    }
    void do_attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& s,
                      const Tensor& out) override {
        cuda::attention(op_stream(), use(q), kv(seqs, n_seqs), s, use(s.sinks), use(out));
    }
    void do_moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids,
                      const Tensor& weights) override {
        cuda::moe_route(op_stream(), use(logits), use(resident), r, use(ids), use(weights));
    }
    void do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& e,
                        const SharedExpert* shared, const Tensor& y) override {
        SharedExpertView sh;
        if (shared)
            sh = {use(shared->gate), use(shared->up), use(shared->down), use(shared->gate_logit)};
        View gate, up, down;
        ExpertSlotsView sl;
        if (const ExpertSlots* p = e.slots) {
            // the parts' shapes, no memory: an expert's rows are where its slot puts them
            const auto part = [&](const ExpertPart& q) {
                return View{nullptr, e.n_expert * q.rows, q.cols, q.row_bytes, q.type};
            };
            gate = part(p->parts[0]), up = part(p->parts[1]), down = part(p->parts[2]);
            // no wait for uploads into the device slots: where names a slot only once its upload has completed
            sl = {cuda::view(p->device), use(p->host), use(p->where), use(p->offsets)};
        } else {
            gate = use(e.gate), up = use(e.up), down = use(e.down);
        }
        const ExpertActView act{e.act, use(e.gate_bias), use(e.up_bias), use(e.down_bias)};
        cuda::moe_experts(op_stream(), use(x), use(ids), use(weights), gate, up, down, e.n_expert, sl, act,
                          shared ? &sh : nullptr, use(y), op_scratch_, matmul_scratch_);
    }
    void do_moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared,
                        const Tensor& shared_gate, const Tensor& y) override {
        cuda::moe_combine(op_stream(), use(ys), use(pairs), use(weights), use(shared),
                          use(shared_gate), use(y), op_scratch_);
    }
    void do_ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key,
                     const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps, const Tensor& gated,
                     const Tensor& normed) override {
        cuda::ple_gate(op_stream(), use(key), use(query), use(value), use(norm_key),
                       use(norm_query), use(norm_conv), hc, eps, use(gated), use(normed));
    }
    void do_ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs, int64_t n_seqs,
                     const Tensor& out) override {
        cuda::ple_conv(op_stream(), use(normed), use(w), dilation,
                       views<PleConvSeq, PleConvSeqView>(seqs, n_seqs, [this](const PleConvSeq& q) {
                           return PleConvSeqView{use(q.state), q.t0, q.ntok};
                       }),
                       use(out));
    }
    void do_add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w, const Tensor& x) override {
        cuda::add_interpolated(op_stream(), use(table), use(idx), use(w), use(x));
    }
    void do_vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q, const Tensor& k,
                       const Tensor& vt) override {
        cuda::vision_qkv(op_stream(), use(qkv), use(table), n_head, use(q), use(k), use(vt));
    }
    void do_softmax_scaled(const Tensor& x, float scale) override { cuda::softmax_scaled(op_stream(), use(x), scale); }

private:
    // The stream for an op: uploads waited for, and the op captured where graphs are on.
    cudaStream_t op_stream() {
        if (graphs_ && owner_.load() == std::this_thread::get_id() && ++captured_ops_ >= GraphLauncher::kChunkOps)
            end_capture();
        begin();
        return stream_;
    }
    // Before an op: a capture begins (graphs on). The op's tensors have waited for their uploads (use()).
    void begin() {
        if (!graphs_ || owner_.load() == std::this_thread::get_id()) return;
        capture_mu_.lock();  // another thread's capture ends first
        captured_ops_ = 0;
        direct_ = launcher_.direct_next();
        if (direct_) {  // the segment's kernels go straight to the stream
            owner_.store(std::this_thread::get_id());
            return;
        }
        const cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
        if (e != cudaSuccess) {
            capture_mu_.unlock();
            RG_CUDA(e);
        }
        owner_.store(std::this_thread::get_id());
    }
    // Ends this thread's capture, if any, and launches what it captured.
    void end_capture() {
        if (owner_.load() != std::this_thread::get_id()) return;
        if (direct_) {
            owner_.store(std::thread::id());
            direct_ = false;
            launcher_.skip();
            staging_.launched(stream_);
            capture_mu_.unlock();
            return;
        }
        cudaGraph_t graph = nullptr;
        cudaError_t e = cudaStreamEndCapture(stream_, &graph);
        owner_.store(std::thread::id());
        std::string failure;
        try {
            if (e == cudaSuccess) launcher_.launch(graph, stream_);
            staging_.launched(stream_);
        } catch (const Error& err) {
            failure = err.what();
        }
        if (graph) cudaGraphDestroy(graph);
        capture_mu_.unlock();
        RG_CUDA(e);
        if (!failure.empty()) throw Error(failure);
    }
    // Runs f on the stream out of capture: this thread's capture launched, another thread's waited for.
    template <class F>
    void outside_capture(F f) {
        end_capture();
        std::lock_guard<std::mutex> lock(capture_mu_);
        f();
    }
    // The device view of an op's tensor t, the op stream having waited for the uploads into its bytes (an op
    // waits only for the expert slots it reads, not for every copy in flight, e.g. the lookahead's).
    View use(const Tensor& t) {
        const View v = cuda::view(t);
        if (v.rows == 0 || !uploads_pending_.load(std::memory_order_acquire)) return v;
        const uintptr_t lo = extent_begin(v), hi = extent_end(v, size_t(packed_row_bytes(t)));
        std::vector<cudaEvent_t> waits;
        {
            std::lock_guard<std::mutex> lock(upload_mu_);
            for (size_t i = 0; i < pending_.size();)
                if (pending_[i].lo < hi && lo < pending_[i].hi) {
                    waits.push_back(pending_[i].done);
                    pending_[i] = pending_.back(), pending_.pop_back();
                } else {
                    ++i;
                }
            uploads_pending_.store(!pending_.empty(), std::memory_order_release);
        }
        if (waits.empty()) return v;
        outside_capture([&] {
            for (cudaEvent_t e : waits) RG_CUDA(cudaStreamWaitEvent(stream_, e, 0));
        });
        std::lock_guard<std::mutex> lock(upload_mu_);
        free_events_.insert(free_events_.end(), waits.begin(), waits.end());
        return v;
    }
    // The op stream waits for every upload (before a read).
    void wait_uploads() {
        if (!uploads_pending_.exchange(false, std::memory_order_acq_rel)) return;
        outside_capture([&] {
            std::lock_guard<std::mutex> lock(upload_mu_);
            for (const PendingUpload& p : pending_) RG_CUDA(cudaStreamWaitEvent(stream_, p.done, 0));
            for (const PendingUpload& p : pending_) free_events_.push_back(p.done);
            pending_.clear();
        });
    }
    static uintptr_t extent_begin(const View& v) { return reinterpret_cast<uintptr_t>(v.base); }
    static uintptr_t extent_end(const View& v, size_t row) {
        return reinterpret_cast<uintptr_t>(v.base) + uintptr_t((v.rows - 1) * v.stride) + row;
    }

    // An upload's bytes [lo, hi) and the event its copy records.
    struct PendingUpload {
        uintptr_t lo, hi;
        cudaEvent_t done;
    };
    static constexpr size_t kMaxBounce = 16u << 20;
    const bool graphs_;
    cudaStream_t stream_ = nullptr, copy_ = nullptr;
    cudaEvent_t submitted_ = nullptr;
    std::vector<PendingUpload> pending_;  // uploads the op stream has not waited for, until a read (upload_mu_)
    std::vector<cudaEvent_t> free_events_;  // (upload_mu_)
    uint64_t uploads_issued_ = 0, uploads_copied_ = 0;  // upload tickets issued / known copied (upload_mu_)
    std::mutex capture_mu_, upload_mu_;  // taken in this order
    std::atomic<std::thread::id> owner_{};  // the thread capturing the stream, if any
    std::atomic<bool> uploads_pending_{false};
    int captured_ops_ = 0;  // ops in this thread's capture
    bool direct_ = false;   // this thread's segment is launched directly (GraphLauncher::direct_next)
    WriteStaging staging_;
    PinnedBuffer read_bounce_;
    GraphLauncher launcher_;
    Scratch matmul_scratch_, op_scratch_;
};

}  // namespace
}  // namespace cuda

Backend* cuda_backend() {
    static std::once_flag once;
    static std::unique_ptr<Backend> backend;
    static std::string reason;
    std::call_once(once, [] {
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess || n == 0) return;
        try {
            backend = std::make_unique<cuda::CudaBackend>();
        } catch (const Error&) {
            backend.reset();
        }
    });
    return backend.get();
}

}  // namespace regolith
