// The CPU backend: host memory, ops run by the kernels of cpu/kernels.h on the calling thread and the
// default pool. In opaque mode ("cpu-opaque") its memory is an OpaqueMemory range the host cannot touch
// outside backend calls, host_address() is null (except for MemoryUse::Mapped buffers, host RAM by
// definition), and ops are queued and run at submit / read / write, so the core must work as it has to on a
// GPU.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "cpu/kernels.h"
#include "cpu/opaque_memory.h"

namespace regolith::cpu {

struct CpuBuffer final : BackendBuffer {
    enum class Kind { Heap, Pages, Mapped, Wrapped, Opaque, OpaqueWeights };
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    Kind kind = Kind::Heap;
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(bool opaque);
    ~CpuBackend() override;

    const char* name() const override { return opaque_ ? "cpu-opaque" : "cpu"; }

    BackendBuffer* alloc(uint64_t bytes, MemoryUse use) override;
    BackendBuffer* import_host(const void* data, uint64_t bytes) override;
    void free(BackendBuffer* buffer) override;
    void* host_address(BackendBuffer* buffer) override;
    bool lock(BackendBuffer* buffer, std::string* error) override;
    void write(const Tensor& dst, const void* src) override;
    void read(const Tensor& src, void* dst) override;
    void do_copy(const Tensor& src, const Tensor& dst) override;
    void do_zero(const Tensor& dst) override;
    void submit() override;

    void do_matmul(const regolith::MatmulJob* jobs, int64_t n_jobs) override;
    void do_get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat, const Tensor& out) override;
    void do_gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override;
    void do_top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) override;
    void do_rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override;
    void do_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act,
                        const Tensor& y) override;
    void do_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y) override;
    void do_rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis, const Tensor& table) override;
    void do_rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) override;
    void do_unary(const Tensor& x, Unary op, float p, const Tensor& y) override;
    void do_glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) override;
    void do_add(const Tensor& a, const Tensor& b, const Tensor& y) override;
    void do_hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) override;
    void do_hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) override;
    void do_ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs, const Tensor& out) override;
    void do_gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& dt_bias,
                     const GdnDims& d) override;
    void do_gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs, int64_t n_seqs,
                  const GdnDims& d, int64_t chunk, const Tensor& out) override;
    bool supports_expert_slots() const override { return true; }
    bool supports_cache(uint32_t type) const override {
        return type == RG_TYPE_F32 || type == RG_TYPE_F16 || type == RG_TYPE_Q8_0 || type == RG_TYPE_I8;
    }
    void do_store_rows(const Tensor& x, const Tensor& dst, const Tensor& scale) override;
    void do_qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq, const Tensor& axis,
                  const QsaDims& d) override;
    void do_qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& sel,
                    const Tensor& n_sel) override;
    void do_qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel, const QsaSeq* seqs,
                    int64_t n_seqs, const QsaDims& d, const Tensor& out) override;
    void do_kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs, int64_t n_head_kv) override;
    void do_attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& s,
                   const Tensor& out) override;
    void do_moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids,
                   const Tensor& weights) override;
    void do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& experts,
                     const SharedExpert* shared, const Tensor& y) override;
    void do_moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared,
                     const Tensor& shared_gate, const Tensor& y) override;
    void do_ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key,
                  const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps, const Tensor& gated,
                  const Tensor& normed) override;
    void do_ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs, int64_t n_seqs,
                  const Tensor& out) override;
    void do_add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w, const Tensor& x) override;
    void do_vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q, const Tensor& k,
                    const Tensor& vt) override;
    void do_softmax_scaled(const Tensor& x, float scale) override;

private:
    // Runs fn now, or (opaque) queues it until the next flush.
    template <class F>
    void exec(F&& fn) {
        if (!opaque_) return fn();
        enqueue(std::function<void()>(std::forward<F>(fn)));
    }
    void enqueue(std::function<void()> fn);
    // Runs the queued ops and then `then` (a read) with the memory open.
    void flush(const std::function<void()>& then = {});

    bool opaque_;
    std::unique_ptr<OpaqueMemory> memory_;   // opaque mode: state, scratch, arena
    std::unique_ptr<OpaqueMemory> weights_;  // opaque mode: the copies of imported host memory
    std::mutex queue_mu_;                    // opaque mode: the queue, and running it
    std::vector<std::function<void()>> queue_;
    std::exception_ptr failed_;  // an op that failed while a buffer was freed, reported by the next flush
};

// A checked host view of a tensor (its rows must lie in its buffer); an empty Rows for an empty tensor.
Rows resolve(const Tensor& t);

}  // namespace regolith::cpu
