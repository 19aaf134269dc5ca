// The CUDA backend's kernel launchers, one file per op family (matmul, copy, rows, norm, rope, elementwise, gdn,
// qsa, attention, moe, ple, vision). CudaBackend (cuda/cuda_backend.cu) checks an op's arguments, makes the
// views and calls these on its stream; each computes what Backend (core/backend.h) documents.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "cuda/common.cuh"

namespace regolith::cuda {

// Scratch device memory for launches on one stream: get() returns at least `bytes`, growing with stream-ordered
// allocation (the old memory is freed after the launches before it), never shrinking. `outside`, where set,
// runs the growth with the stream out of graph capture (allocations are not captured).
class Scratch {
public:
    ~Scratch();
    void* get(size_t bytes, cudaStream_t stream);
    std::function<void(const std::function<void()>&)> outside;

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
    cudaStream_t stream_ = nullptr;
};

// Set the dynamic shared memory limits of the products' kernels (more than the default 48 KiB), once, before
// any launch: attribute calls stay out of graph capture.
void init_matmul_kernels();
void init_moe_kernels();

struct MatmulView {
    View w, x, y;
};

void matmul(cudaStream_t s, const MatmulView* jobs, int n_jobs, Scratch& scratch);
// height rows of width bytes, row r at dst + r * dpitch (from src + r * spitch, device or pinned host memory).
void copy_2d(cudaStream_t s, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
void zero_2d(cudaStream_t s, void* dst, size_t dpitch, size_t width, size_t height);
void get_rows(cudaStream_t s, const View& table, const View& ids, float scale, int64_t repeat, const View& out);
void gather_rows(cudaStream_t s, const View& x, const View& rows, const View& out);
void top_k(cudaStream_t s, const View& x, int64_t k, const View& ids, const View& values);

void rms_norm(cudaStream_t s, const View& x, const View& w, float eps, const View& y);
void rms_norm_gated(cudaStream_t s, const View& x, const View& z, const View& w, float eps, bool sigmoid_gate, const View& y);
void layer_norm(cudaStream_t s, const View& x, const View& w, const View& b, float eps, const View& y);

void rope_table(cudaStream_t s, const View& pos, const View& freq, const View& axis, const View& table);
void rope(cudaStream_t s, const View& x, const View& table, int64_t rows_per_pos);

void unary(cudaStream_t s, const View& x, Unary op, float p, const View& y);
void glu(cudaStream_t s, const View& gate, const View& up, Glu act, const View& y);
void add(cudaStream_t s, const View& a, const View& b, const View& y);
void hc_mix(cudaStream_t s, const View& gate, const View& xn, int64_t hc, const View& mixed);
void hc_write(cudaStream_t s, const View& out, const View& w, int64_t hc, const View& streams);

struct ConvSeqView {
    View state, after;
    int64_t t0, ntok;
};
struct GdnSeqView {
    View state, after;
    int64_t t0, ntok;
};
void ssm_conv(cudaStream_t s, const View& x, const View& w_t, const std::vector<ConvSeqView>& seqs, const View& out);
void gdn_prepare(cudaStream_t s, const View& qkv, const View& g, const View& beta, const View& a, const View& dt_bias,
                 const GdnDims& d);
void gdn_scan(cudaStream_t s, const View& qkv, const View& g, const View& beta, const std::vector<GdnSeqView>& seqs,
              const GdnDims& d, const View& out);

// Caches of any type Backend::store_rows stores (cache.cuh), with their I8 row scales (else empty).
struct QsaSeqView {
    View k, v, index_k, block_k, pos;
    int64_t n0, t0, ntok;
    View k_scale, v_scale, index_k_scale, block_k_scale;
};
void qsa_pool(cudaStream_t s, const std::vector<QsaSeqView>& seqs, const View& norm, const View& freq, const View& axis,
              const QsaDims& d);
void qsa_select(cudaStream_t s, const View& iq, const std::vector<QsaSeqView>& seqs, const QsaDims& d, const View& sel,
                const View& n_sel);
void qsa_attend(cudaStream_t s, const View& q, const View& gate, const View& sel, const View& n_sel,
                const std::vector<QsaSeqView>& seqs, const QsaDims& d, const View& out, Scratch& scratch);

// F16 / F32: keys k and transposed values vt; Q8_0 / I8: key and value rows k, v (and I8 row scales).
struct KvSeqView {
    View k, vt;
    int64_t n0, t0, ntok;
    View v, k_scale, v_scale;
};
// dst := x stored as an attention cache of dst's type (F16, Q8_0, I8 with its row scales).
void store_rows(cudaStream_t s, const View& x, const View& dst, const View& scale);
void kv_append(cudaStream_t s, const View& k, const View& v, const std::vector<KvSeqView>& seqs, int64_t n_head_kv);
// sinks: AttentionShape::sinks' view (empty: none).
void attention(cudaStream_t s, const View& q, const std::vector<KvSeqView>& seqs, const AttentionShape& sh,
               const View& sinks, const View& out);

void moe_route(cudaStream_t s, const View& logits, const View& resident, const MoeRouting& r, const View& ids,
               const View& weights);
struct SharedExpertView {
    View gate, up, down, gate_logit;
};
// The routed experts' records in slots (ExpertSlots), or none (where empty): the stacked gate / up / down.
struct ExpertSlotsView {
    View device, host, where, offsets;
};
// The routed experts' act and biases (ExpertSet's; the biases empty or all three given).
struct ExpertActView {
    Glu act = Glu::Silu;
    View gate_bias, up_bias, down_bias;
};
// With slots, gate / up / down give each part's type, rows (n_expert times an expert's), cols and row stride,
// and no memory.
void moe_experts(cudaStream_t s, const View& x, const View& ids, const View& weights, const View& gate, const View& up,
                 const View& down, int64_t n_expert, const ExpertSlotsView& slots, const ExpertActView& act,
                 const SharedExpertView* shared, const View& y, Scratch& scratch, Scratch& matmul_scratch);
void moe_combine(cudaStream_t s, const View& ys, const View& pairs, const View& weights, const View& shared,
                 const View& shared_gate, const View& y, Scratch& scratch);

struct PleConvSeqView {
    View state;
    int64_t t0, ntok;
};
void ple_gate(cudaStream_t s, const View& key, const View& query, const View& value, const View& norm_key,
              const View& norm_query, const View& norm_conv, int64_t hc, float eps, const View& gated, const View& normed);
void ple_conv(cudaStream_t s, const View& normed, const View& w, int64_t dilation, const std::vector<PleConvSeqView>& seqs,
              const View& out);

void add_interpolated(cudaStream_t s, const View& table, const View& idx, const View& w, const View& x);
void vision_qkv(cudaStream_t s, const View& qkv, const View& table, int64_t n_head, const View& q, const View& k,
                const View& vt);
void softmax_scaled(cudaStream_t s, const View& x, float scale);

}  // namespace regolith::cuda
