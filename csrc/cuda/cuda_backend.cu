// The CUDA backend: buffers in device memory (cudaMalloc), one stream per backend on which every op, copy
// and upload is recorded in order (so submit() has nothing to do and read() synchronizes the stream), the
// op families' kernels in the other files of this folder.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/types.h"
#include "cuda/kernels.cuh"

namespace regolith {

namespace cuda {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

struct CudaBuffer final : BackendBuffer {
    uint8_t* ptr = nullptr;
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
    if (ptr_) RG_CUDA(cudaFreeAsync(ptr_, stream_));  // after the launches recorded before it
    bytes_ = std::max(bytes, 2 * bytes_);
    stream_ = stream;
    RG_CUDA(cudaMallocAsync(&ptr_, bytes_, stream));
    return ptr_;
}

namespace {

template <class Seq, class SeqView, class F>
std::vector<SeqView> views(const Seq* seqs, int64_t n, F f) {
    std::vector<SeqView> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(f(seqs[i]));
    return out;
}

class CudaBackend final : public Backend {
public:
    CudaBackend() {
        RG_CUDA(cudaSetDevice(0));
        RG_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    }
    ~CudaBackend() override { cudaStreamDestroy(stream_); }

    const char* name() const override { return "cuda"; }

    BackendBuffer* alloc(uint64_t bytes, MemoryUse) override {
        auto b = std::make_unique<CudaBuffer>();
        b->bytes = bytes;
        const cudaError_t e = cudaMalloc(&b->ptr, std::max<uint64_t>(bytes, 1));
        if (e != cudaSuccess)
            throw Error("CUDA: cannot allocate " + std::to_string(bytes) + " bytes of device memory: " +
                        cudaGetErrorString(e));
        return b.release();
    }
    BackendBuffer* import_host(const void* data, uint64_t bytes) override {
        BackendBuffer* b = alloc(bytes, MemoryUse::Device);
        RG_CUDA(cudaMemcpyAsync(static_cast<CudaBuffer*>(b)->ptr, data, bytes, cudaMemcpyHostToDevice, stream_));
        RG_CUDA(cudaStreamSynchronize(stream_));
        return b;
    }
    void free(BackendBuffer* buffer) override {
        if (!buffer) return;
        auto* b = static_cast<CudaBuffer*>(buffer);
        cudaStreamSynchronize(stream_);  // ops recorded before may still read it
        cudaFree(b->ptr);
        delete b;
    }
    void* host_address(BackendBuffer*) override { return nullptr; }
    bool lock(BackendBuffer*, std::string*) override { return true; }  // device memory is never paged out
    bool device_memory(uint64_t* free_bytes, uint64_t* total_bytes) override {
        size_t f = 0, t = 0;
        RG_CUDA(cudaMemGetInfo(&f, &t));
        *free_bytes = f, *total_bytes = t;
        return true;
    }

    void write(const Tensor& dst, const void* src) override {
        const View d = cuda::view(dst);
        const size_t row = size_t(packed_row_bytes(dst));
        if (d.rows == 0) return;
        RG_CUDA(cudaMemcpy2DAsync(d.base, size_t(d.stride), src, row, row, size_t(d.rows), cudaMemcpyHostToDevice,
                                  stream_));
    }
    void read(const Tensor& src, void* dst) override {
        const View s = cuda::view(src);
        const size_t row = size_t(packed_row_bytes(src));
        if (s.rows > 0)
            RG_CUDA(cudaMemcpy2DAsync(dst, row, s.base, size_t(s.stride), row, size_t(s.rows), cudaMemcpyDeviceToHost,
                                      stream_));
        RG_CUDA(cudaStreamSynchronize(stream_));
    }
    void submit() override {}

protected:
    void do_copy(const Tensor& src, const Tensor& dst) override {
        const View s = cuda::view(src), d = cuda::view(dst);
        const size_t row = size_t(packed_row_bytes(src));
        if (s.rows == 0) return;
        RG_CUDA(cudaMemcpy2DAsync(d.base, size_t(d.stride), s.base, size_t(s.stride), row, size_t(s.rows),
                                  cudaMemcpyDeviceToDevice, stream_));
    }
    void do_zero(const Tensor& dst) override {
        const View d = cuda::view(dst);
        if (d.rows == 0) return;
        RG_CUDA(cudaMemset2DAsync(d.base, size_t(d.stride), 0, size_t(packed_row_bytes(dst)), size_t(d.rows), stream_));
    }
    void do_matmul(const MatmulJob* jobs, int64_t n_jobs) override {
        std::vector<MatmulView> v;
        for (int64_t i = 0; i < n_jobs; ++i) v.push_back({cuda::view(jobs[i].w), cuda::view(jobs[i].x), cuda::view(jobs[i].y)});
        cuda::matmul(stream_, v.data(), int(v.size()), matmul_scratch_);
    }
    void do_get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat, const Tensor& out) override {
        cuda::get_rows(stream_, cuda::view(table), cuda::view(ids), scale, repeat, cuda::view(out));
    }
    void do_gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override {
        cuda::gather_rows(stream_, cuda::view(x), cuda::view(rows), cuda::view(out));
    }
    void do_top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) override {
        cuda::top_k(stream_, cuda::view(x), k, cuda::view(ids), cuda::view(values));
    }
    void do_rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override {
        cuda::rms_norm(stream_, cuda::view(x), cuda::view(w), eps, cuda::view(y));
    }
    void do_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act,
                           const Tensor& y) override {
        cuda::rms_norm_gated(stream_, cuda::view(x), cuda::view(z), cuda::view(w), eps, act == Unary::Sigmoid,
                             cuda::view(y));
    }
    void do_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y) override {
        cuda::layer_norm(stream_, cuda::view(x), cuda::view(w), cuda::view(b), eps, cuda::view(y));
    }
    void do_rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis, const Tensor& table) override {
        cuda::rope_table(stream_, cuda::view(pos), cuda::view(freq), cuda::view(axis), cuda::view(table));
    }
    void do_rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) override {
        cuda::rope(stream_, cuda::view(x), cuda::view(table), rows_per_pos);
    }
    void do_unary(const Tensor& x, Unary op, float p, const Tensor& y) override {
        cuda::unary(stream_, cuda::view(x), op, p, cuda::view(y));
    }
    void do_glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) override {
        cuda::glu(stream_, cuda::view(gate), cuda::view(up), act, cuda::view(y));
    }
    void do_add(const Tensor& a, const Tensor& b, const Tensor& y) override {
        cuda::add(stream_, cuda::view(a), cuda::view(b), cuda::view(y));
    }
    void do_hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) override {
        cuda::hc_mix(stream_, cuda::view(gate), cuda::view(xn), hc, cuda::view(mixed));
    }
    void do_hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) override {
        cuda::hc_write(stream_, cuda::view(out), cuda::view(w), hc, cuda::view(streams));
    }
    void do_ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs, const Tensor& out) override {
        cuda::ssm_conv(stream_, cuda::view(x), cuda::view(w_t),
                       views<ConvSeq, ConvSeqView>(seqs, n_seqs, [](const ConvSeq& q) {
                           return ConvSeqView{cuda::view(q.state), cuda::view(q.after), q.t0, q.ntok};
                       }),
                       cuda::view(out));
    }
    void do_gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& dt_bias,
                        const GdnDims& d) override {
        cuda::gdn_prepare(stream_, cuda::view(qkv), cuda::view(g), cuda::view(beta), cuda::view(a), cuda::view(dt_bias), d);
    }
    void do_gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs, int64_t n_seqs,
                     const GdnDims& d, int64_t, const Tensor& out) override {
        cuda::gdn_scan(stream_, cuda::view(qkv), cuda::view(g), cuda::view(beta),
                       views<GdnSeq, GdnSeqView>(seqs, n_seqs, [](const GdnSeq& q) {
                           return GdnSeqView{cuda::view(q.state), cuda::view(q.after), q.t0, q.ntok};
                       }),
                       d, cuda::view(out));
    }
    static std::vector<QsaSeqView> qsa(const QsaSeq* seqs, int64_t n) {
        return views<QsaSeq, QsaSeqView>(seqs, n, [](const QsaSeq& q) {
            return QsaSeqView{cuda::view(q.k), cuda::view(q.v), cuda::view(q.index_k), cuda::view(q.block_k),
                              cuda::view(q.pos), q.n0, q.t0, q.ntok};
        });
    }
    void do_qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq, const Tensor& axis,
                     const QsaDims& d) override {
        cuda::qsa_pool(stream_, qsa(seqs, n_seqs), cuda::view(norm), cuda::view(freq), cuda::view(axis), d);
    }
    void do_qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& sel,
                       const Tensor& n_sel) override {
        cuda::qsa_select(stream_, cuda::view(iq), qsa(seqs, n_seqs), d, cuda::view(sel), cuda::view(n_sel));
    }
    void do_qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel, const QsaSeq* seqs,
                       int64_t n_seqs, const QsaDims& d, const Tensor& out) override {
        cuda::qsa_attend(stream_, cuda::view(q), cuda::view(gate), cuda::view(sel), cuda::view(n_sel), qsa(seqs, n_seqs),
                         d, cuda::view(out));
    }
    static std::vector<KvSeqView> kv(const KvSeq* seqs, int64_t n) {
        return views<KvSeq, KvSeqView>(seqs, n, [](const KvSeq& q) {
            return KvSeqView{cuda::view(q.k), cuda::view(q.vt), q.n0, q.t0, q.ntok};
        });
    }
    void do_kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs, int64_t n_head_kv) override {
        cuda::kv_append(stream_, cuda::view(k), cuda::view(v), kv(seqs, n_seqs), n_head_kv);
    }
    void do_attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& s,
                      const Tensor& out) override {
        cuda::attention(stream_, cuda::view(q), kv(seqs, n_seqs), s, cuda::view(out));
    }
    void do_moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids,
                      const Tensor& weights) override {
        cuda::moe_route(stream_, cuda::view(logits), cuda::view(resident), r, cuda::view(ids), cuda::view(weights));
    }
    void do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& e,
                        const SharedExpert* shared, const Tensor& y) override {
        SharedExpertView sh;
        if (shared)
            sh = {cuda::view(shared->gate), cuda::view(shared->up), cuda::view(shared->down), cuda::view(shared->gate_logit)};
        cuda::moe_experts(stream_, cuda::view(x), cuda::view(ids), cuda::view(weights), cuda::view(e.gate),
                          cuda::view(e.up), cuda::view(e.down), e.n_expert, shared ? &sh : nullptr, cuda::view(y),
                          op_scratch_, matmul_scratch_);
    }
    void do_moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared,
                        const Tensor& shared_gate, const Tensor& y) override {
        cuda::moe_combine(stream_, cuda::view(ys), cuda::view(pairs), cuda::view(weights), cuda::view(shared),
                          cuda::view(shared_gate), cuda::view(y), op_scratch_);
    }
    void do_ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key,
                     const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps, const Tensor& gated,
                     const Tensor& normed) override {
        cuda::ple_gate(stream_, cuda::view(key), cuda::view(query), cuda::view(value), cuda::view(norm_key),
                       cuda::view(norm_query), cuda::view(norm_conv), hc, eps, cuda::view(gated), cuda::view(normed));
    }
    void do_ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs, int64_t n_seqs,
                     const Tensor& out) override {
        cuda::ple_conv(stream_, cuda::view(normed), cuda::view(w), dilation,
                       views<PleConvSeq, PleConvSeqView>(seqs, n_seqs, [](const PleConvSeq& q) {
                           return PleConvSeqView{cuda::view(q.state), q.t0, q.ntok};
                       }),
                       cuda::view(out));
    }
    void do_add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w, const Tensor& x) override {
        cuda::add_interpolated(stream_, cuda::view(table), cuda::view(idx), cuda::view(w), cuda::view(x));
    }
    void do_vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q, const Tensor& k,
                       const Tensor& vt) override {
        cuda::vision_qkv(stream_, cuda::view(qkv), cuda::view(table), n_head, cuda::view(q), cuda::view(k), cuda::view(vt));
    }
    void do_softmax_scaled(const Tensor& x, float scale) override { cuda::softmax_scaled(stream_, cuda::view(x), scale); }

private:
    cudaStream_t stream_ = nullptr;
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
