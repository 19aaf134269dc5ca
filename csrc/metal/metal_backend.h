// The Metal backend: every op a kernel of metal/*.metal, encoded into command buffers of a Device
// (device.h): the Apple GPU, or the emulator that runs the same kernels on the host ("metal-emu").
//
// Memory is shared storage (Apple silicon's unified memory), so host_address() gives every buffer's memory:
// the expert streamer reads records straight into arena slots and state files are read and written in
// place, after waiting for the GPU (synchronize(), wait_submitted()). Imported weights are wrapped without a
// copy (the mapped GGUF's pages). write() stages the host data and records a copy kernel, so it is ordered
// like an op; read() commits and waits. submit() commits the current command buffer: one per decode step,
// split where the host reads (routing ids of a streamed MoE layer, logits).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "metal/args.h"
#include "metal/device.h"

namespace regolith::metal {

struct MetalBuffer final : BackendBuffer {
    DeviceBuffer* device = nullptr;  // owned
    uint64_t base = 0;               // where byte 0 of this buffer is in `device` (imports wrap whole pages)
    uint64_t bytes = 0;
    uint8_t* host = nullptr;  // byte 0, as host memory
    void* mapping = nullptr;  // an arena's pages, unmapped with the buffer
    bool borrowed = false;    // wraps the caller's memory (import_host): free waits for the work reading it
    uint64_t mapping_bytes = 0;
};

// A tensor as a kernel sees it: its row 0's binding and its shape (metal/args.h).
struct View {
    KernelArg arg;
    RgShape shape{};
    explicit operator bool() const { return arg.buffer != nullptr; }
};

// Threads of a threadgroup striding over n items: whole SIMD-groups, at least one, at most 256.
inline uint32_t simd_threads(int64_t n) {
    return uint32_t(std::min<int64_t>(256, std::max<int64_t>(32, (n + 31) / 32 * 32)));
}
// Threadgroup memory of rg_group_sum / rg_group_max (metal/common.h): a partial per SIMD-group.
constexpr uint32_t kGroupPartials = 32 * sizeof(float);
// How many ways attention (attention.cpp, qsa.cpp) splits the keys of each of `groups` threadgroups: enough
// threadgroups to keep the largest GPUs busy when there are few (decode), never splits of under 128 keys.
int64_t key_splits(int64_t groups, int64_t keys);

class MetalBackend;
// The products of matmul.cpp, for moe.cpp: n products over views (as Backend::matmul's jobs), and a stacked
// expert tensor's products over the routing pairs grouped by expert (rg_moe_group's output in `groups`).
void encode_products(MetalBackend& be, const View* w, const View* x, const View* y, int64_t n);
void encode_expert_products(MetalBackend& be, const View& w, int64_t n, int64_t n_expert, const KernelArg& x,
                            int64_t x_ld, const KernelArg& y, int64_t y_ld, const KernelArg& groups,
                            int64_t k, int64_t ntok, int64_t pairs);

class MetalBackend final : public Backend {
  public:
    explicit MetalBackend(std::unique_ptr<Device> device);
    ~MetalBackend() override;

    const char* name() const override { return device_->name(); }
    std::string device_name() override { return device_->description(); }
    bool supports_cache(uint32_t type) const override {
        return type == RG_TYPE_F32 || type == RG_TYPE_F16 || type == RG_TYPE_Q8_0 || type == RG_TYPE_I8;
    }

    BackendBuffer* alloc(uint64_t bytes, MemoryUse use) override;
    BackendBuffer* import_host(const void* data, uint64_t bytes) override;
    void free(BackendBuffer* buffer) override;
    void* host_address(BackendBuffer* buffer) override;
    bool lock(BackendBuffer* buffer, std::string* error) override;
    void write(const Tensor& dst, const void* src) override;
    void read(const Tensor& src, void* dst) override;
    void submit() override;
    void synchronize() override;
    uint64_t submitted() override;
    void wait_submitted(uint64_t n) override;

    // For the op files: the checked view of a tensor (an empty View for an empty tensor), constant bytes as
    // an argument, and a dispatch (recorded in order; any thread).
    View view(const Tensor& t) const;
    template <class Args>
    static KernelArg bytes(const Args& a) {
        return KernelArg{nullptr, 0, &a, uint32_t(sizeof(Args))};
    }
    void launch(const char* kernel, uint32_t groups_x, uint32_t groups_y, uint32_t threads, uint32_t shmem,
                std::initializer_list<KernelArg> args);
    uint32_t max_threads(const char* kernel) { return device_->max_threads(kernel); }
    // Device scratch for an op's intermediates, valid for ops recorded until the next scratch() call.
    KernelArg scratch(uint64_t bytes);

  protected:
    void do_copy(const Tensor& src, const Tensor& dst) override;
    void do_zero(const Tensor& dst) override;
    void do_matmul(const regolith::MatmulJob* jobs, int64_t n_jobs) override;
    void do_get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat,
                     const Tensor& out) override;
    void do_gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override;
    void do_top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) override;
    void do_rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override;
    void do_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act,
                           const Tensor& y) override;
    void do_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                       const Tensor& y) override;
    void do_rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis,
                       const Tensor& table) override;
    void do_rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) override;
    void do_unary(const Tensor& x, Unary op, float p, const Tensor& y) override;
    void do_glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) override;
    void do_add(const Tensor& a, const Tensor& b, const Tensor& y) override;
    void do_hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) override;
    void do_hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) override;
    void do_ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs,
                     const Tensor& out) override;
    void do_gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a,
                        const Tensor& dt_bias, const GdnDims& d) override;
    void do_gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs,
                     int64_t n_seqs, const GdnDims& d, int64_t chunk, const Tensor& out) override;
    void do_store_rows(const Tensor& x, const Tensor& dst, const Tensor& scale) override;
    void do_qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq,
                     const Tensor& axis, const QsaDims& d) override;
    void do_qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d,
                       const Tensor& sel, const Tensor& n_sel) override;
    void do_qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel,
                       const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& out) override;
    void do_kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs,
                      int64_t n_head_kv) override;
    void do_attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& s,
                      const Tensor& out) override;
    void do_moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids,
                      const Tensor& weights) override;
    void do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& experts,
                        const SharedExpert* shared, const Tensor& y) override;
    void do_moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared,
                        const Tensor& shared_gate, const Tensor& y) override;
    void do_ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key,
                     const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps,
                     const Tensor& gated, const Tensor& normed) override;
    void do_ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs,
                     int64_t n_seqs, const Tensor& out) override;
    void do_add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w,
                             const Tensor& x) override;
    void do_vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q,
                       const Tensor& k, const Tensor& vt) override;
    void do_softmax_scaled(const Tensor& x, float scale) override;

  private:
    // Copies rows of `row` bytes (src: host bytes staged by write(), or a buffer) into dst's rows.
    void copy_rows(const KernelArg& src, int64_t src_stride, const View& dst, int64_t row);
    // Staging for write(): host-visible memory kept until the command buffer that copies from it completes.
    KernelArg stage(const void* src, uint64_t bytes);
    // Frees what is kept for command buffers that have completed (staging, freed buffers).
    void retire_locked(uint64_t completed);
    void release(MetalBuffer* b);

    std::unique_ptr<Device> device_;
    std::mutex mu_;  // encoding: dispatches, staging, scratch, pending frees
    uint64_t last_commit_ = 0;
    struct Staging {
        std::unique_ptr<DeviceBuffer> buffer;
        uint64_t bytes = 0, used = 0;
        uint64_t serial = 0;  // the command buffer that last copies from it
    };
    std::vector<Staging> staging_;  // the last one is being filled
    struct Retired {
        MetalBuffer* buffer;
        uint64_t serial;
    };
    std::vector<Retired> retired_;           // freed while command buffers that may use them were pending
    std::unique_ptr<DeviceBuffer> scratch_;  // grown by doubling
    uint64_t scratch_bytes_ = 0;
    std::vector<std::pair<std::unique_ptr<DeviceBuffer>, uint64_t>>
        old_scratch_;  // until their serial completes
};

}  // namespace regolith::metal
