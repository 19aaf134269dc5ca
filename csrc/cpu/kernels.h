// The CPU backend's kernels over host memory, one file per op family (matmul_run, rows, norm, rope,
// elementwise, gdn, qsa, attention, moe, ple, vision). CpuBackend (cpu/cpu_backend.h) resolves Tensors
// to these views and calls them; each computes exactly what Backend (core/backend.h) documents, and is the
// reference every other backend is compared with.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/backend.h"

namespace regolith::cpu {

// A weight matrix in host memory: `rows` rows of `cols` elements of a GGUF type, row r at data + r * row_bytes.
struct WeightView {
    uint32_t type = 0;
    const void* data = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t row_bytes = 0;
};

// y = W x for ntok tokens: x [ntok][cols], y [ntok][rows], both packed.
struct MatmulJob {
    WeightView w;
    const float* x = nullptr;
    int64_t ntok = 0;
    float* y = nullptr;
};

void matmul(const WeightView& w, const float* x, int64_t ntok, float* y);
void matmul_batch(const MatmulJob* jobs, int64_t n_jobs);

// Rows of a tensor in host memory.
struct Rows {
    uint8_t* base = nullptr;
    uint32_t type = 0;
    int64_t rows = 0, cols = 0, stride = 0;  // stride in bytes

    template <class T = float>
    T* row(int64_t r) const {
        return reinterpret_cast<T*>(base + r * stride);
    }
    explicit operator bool() const { return base != nullptr; }
};

// Stateful ops' per-sequence parts with their tensors resolved.
struct ConvSeqRows {
    Rows state, after;
    int64_t t0, ntok;
};
struct GdnSeqRows {
    Rows state, after;
    int64_t t0, ntok;
};
struct PleConvSeqRows {
    Rows state;
    int64_t t0, ntok;
};
struct QsaSeqRows {
    Rows k, v, index_k, block_k, pos;
    int64_t n0, t0, ntok;
    Rows k_scale, v_scale, index_k_scale, block_k_scale;  // I8 caches' row scales, else empty
};
struct KvSeqRows {
    Rows k, vt;
    int64_t n0, t0, ntok;
    Rows v, k_scale, v_scale;  // Q8_0 / I8 caches (vt empty)
};

void get_rows(const Rows& table, const Rows& ids, float scale, int64_t repeat, const Rows& out);
void gather_rows(const Rows& x, const Rows& rows, const Rows& out);
void top_k(const Rows& x, int64_t k, const Rows& ids, const Rows& values);

void rms_norm(const Rows& x, const Rows& w, float eps, const Rows& y);
void rms_norm_gated(const Rows& x, const Rows& z, const Rows& w, float eps, Unary act, const Rows& y);
void layer_norm(const Rows& x, const Rows& w, const Rows& b, float eps, const Rows& y);

void rope_table(const Rows& pos, const Rows& freq, const Rows& axis, const Rows& table);
void rope(const Rows& x, const Rows& table, int64_t rows_per_pos);

void unary(const Rows& x, Unary op, float p, const Rows& y);
void glu(const Rows& gate, const Rows& up, Glu act, const Rows& y);
void add(const Rows& a, const Rows& b, const Rows& y);
void hc_mix(const Rows& gate, const Rows& xn, int64_t hc, const Rows& mixed);
void hc_write(const Rows& out, const Rows& w, int64_t hc, const Rows& streams);

void ssm_conv(const Rows& x, const Rows& w_t, const std::vector<ConvSeqRows>& seqs, const Rows& out);
void gdn_prepare(const Rows& qkv, const Rows& g, const Rows& beta, const Rows& a, const Rows& dt_bias,
                 const GdnDims& d);
void gdn_scan(const Rows& qkv, const Rows& g, const Rows& beta, const std::vector<GdnSeqRows>& seqs,
              const GdnDims& d, int64_t chunk, const Rows& out);

// Attention caches (Backend::store_rows): x [n][cols] F32 stored in dst's type, I8 scales in `scale`.
void store_rows(const Rows& x, const Rows& dst, const Rows& scale);
// One row: x [dst.cols] stored as row r of dst.
void store_row(const float* x, const Rows& dst, const Rows& scale, int64_t r);
// Row r of a cache as f32: an F32 cache's row in place, else the row dequantized into buf [cols].
const float* cache_row(const Rows& t, const Rows& scale, int64_t r, float* buf);

void qsa_pool(const std::vector<QsaSeqRows>& seqs, const Rows& norm, const Rows& freq, const Rows& axis,
              const QsaDims& d);
void qsa_select(const Rows& iq, const std::vector<QsaSeqRows>& seqs, const QsaDims& d, const Rows& sel,
                const Rows& n_sel);
void qsa_attend(const Rows& q, const Rows& gate, const Rows& sel, const Rows& n_sel,
                const std::vector<QsaSeqRows>& seqs, const QsaDims& d, const Rows& out);

void kv_append(const Rows& k, const Rows& v, const std::vector<KvSeqRows>& seqs, int64_t n_head_kv);
// sinks: s.sinks resolved ([1][n_head]), or empty.
void attention(const Rows& q, const std::vector<KvSeqRows>& seqs, const AttentionShape& s, const Rows& sinks,
               const Rows& out);

void moe_route(const Rows& logits, const Rows& resident, const MoeRouting& r, const Rows& ids, const Rows& weights);
struct SharedExpertRows {
    Rows gate, up, down, gate_logit;
};
// Expert e's matrix `part` (0 gate [ff][hidden], 1 up, 2 down [hidden][ff]).
using ExpertMatrix = std::function<WeightView(int64_t e, int part)>;
// The stacked tensors' expert matrices (llama.cpp's *_exps: expert e's rows of each).
ExpertMatrix stacked_experts(const Rows& gate, const Rows& up, const Rows& down, int64_t n_expert);
// The routed experts' act and biases (ExpertSet's; the biases empty or all three given).
struct ExpertAct {
    Glu act = Glu::Silu;
    Rows gate_bias, up_bias, down_bias;
};
void moe_experts(const Rows& x, const Rows& ids, const Rows& weights, const ExpertMatrix& expert, int64_t n_expert,
                 const ExpertAct& act, const SharedExpertRows* shared, const Rows& y);
void moe_combine(const Rows& ys, const Rows& pairs, const Rows& weights, const Rows& shared, const Rows& shared_gate,
                 const Rows& y);

void ple_gate(const Rows& key, const Rows& query, const Rows& value, const Rows& norm_key, const Rows& norm_query,
              const Rows& norm_conv, int64_t hc, float eps, const Rows& gated, const Rows& normed);
void ple_conv(const Rows& normed, const Rows& w, int64_t dilation, const std::vector<PleConvSeqRows>& seqs,
              const Rows& out);

void add_interpolated(const Rows& table, const Rows& idx, const Rows& w, const Rows& x);
void vision_qkv(const Rows& qkv, const Rows& table, int64_t n_head, const Rows& q, const Rows& k, const Rows& vt);
void softmax_scaled(const Rows& x, float scale);
// The vision tower's activations (Unary::GeluTanhExp / GeluErf), compiled where exp_nonpos vectorises.
void gelu_rows(const Rows& x, Unary op, const Rows& y);

// Runs fn(r0, r1) over [0, n) rows on the default pool when they hold at least 2^15 elements of work, else
// on the calling thread.
void for_rows(int64_t n, int64_t row_elements, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace regolith::cpu
