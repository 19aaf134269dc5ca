// Gated DeltaNet (Backend::ssm_conv, gdn_prepare, gdn_scan; model/gated_delta_net.h has the equations).
//
// rg_ssm_conv: a thread per (channel, block of tokens of one sequence), threadgroups of up to 256 channels,
// so
//   every tap reads a row's consecutive channels. Blocks hold at least kernel-1 tokens, so only a sequence's
//   first block reads its conv state; that block's threads write the new state (their own channel) last.
// rg_gdn_prepare: a SIMD-group per (token, q / k head) for the L2 norms (simd_sum over k_dim), then a thread
//   per (token, value head) for the gates, in one dispatch (the threadgroups after norm_groups).
// rg_gdn_scan<R>: the delta rule, token after token. A threadgroup owns 32 value columns of one value head of
//   one sequence (lane = column, so state rows are read and written as 128-byte lines) and keeps that
//   [k_dim][32] slice of the state in registers for all the step's tokens: its 8 SIMD-groups take the k rows
//   i = m * 8 + sgitg, m < R (R = k_dim / 8 rounded up to a power of two: 16 floats per thread for k_dim 128;
//   256 threads, 6 KiB of threadgroup memory).
//   Per token, each thread forms partial k.S, q.S (the state before the token) and q.k over its rows; one
//   threadgroup reduction (a barrier; two alternating buffers, so the next token's writes cannot overtake
//   this token's reads) gives every thread its column's sums, then
//     delta = (v - decay k.S) beta,  o = decay q.S + (q.k) delta,  S <- decay S + k delta^T,
//   the recurrence of the CPU's torch_recurrent_gated_delta_rule with S^T q of the updated state expanded.
//   Decode (1 token) costs one state read and write (the op is bound by that traffic). Prefill takes the
//   tokens in order too (no chunked WY form): per token a barrier and ~3 R multiply-adds per thread, with
//   n_v_heads * v_dim / 32 threadgroups per sequence in flight; the CPU's chunked scan computes the same
//   recurrence up to float rounding (`chunk` does not change the result, so it is not used here).
#include "compat.h"

#include "args.h"
#include "common.h"

// ---- ssm_conv ---------------------------------------------------------------------------------------------

kernel void rg_ssm_conv(constant RgConvArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                        device const char* w [[buffer(2)]], device char* out [[buffer(3)]],
                        device char* b0 [[buffer(4)]], device char* b1 [[buffer(5)]],
                        device char* b2 [[buffer(6)]], device char* b3 [[buffer(7)]],
                        device char* b4 [[buffer(8)]], device char* b5 [[buffer(9)]],
                        device char* b6 [[buffer(10)]], device char* b7 [[buffer(11)]], RG_THREAD_IDS) {
    const int64_t c = int64_t(tgpig.x) * ntg + tiitg, cd = a.x.cols, K = a.taps, hist = a.hist;
    if (c >= cd) return;
    uint s = 0;  // the sequence of this work item
    while (s + 1 < a.n_seqs && int64_t(tgpig.y) >= a.seqs[s + 1].first) ++s;
    constant RgSeqSlot& q = a.seqs[s];
    const int64_t block = int64_t(tgpig.y) - q.first, t_begin = block * a.block;
    const int64_t t_end = q.ntok < t_begin + a.block ? q.ntok : t_begin + a.block;
    device char* state = hist > 0 ? rg_seq_binding(q.state.bind, b0, b1, b2, b3, b4, b5, b6, b7) : nullptr;
    device char* after = hist > 0 && q.after.bind < RG_SEQ_BINDINGS
                             ? rg_seq_binding(q.after.bind, b0, b1, b2, b3, b4, b5, b6, b7)
                             : nullptr;
    for (int64_t t = t_begin; t < t_end; ++t) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k)
            acc += rg_row<float>(w, a.w, k)[c] * rg_conv_ext(x, a.x, state, q, hist, t + k, c);
        rg_row<float>(out, a.out, q.t0 + t)[c] = rg_silu(acc);
        if (after) {  // the history after token t: ext rows t+1 .. t+hist
            device float* ar = rg_seq_row(after, q.after, t);
            for (int64_t j = 0; j < hist; ++j)
                ar[j * cd + c] = rg_conv_ext(x, a.x, state, q, hist, t + 1 + j, c);
        }
    }
    // The new history, ext rows ntok .. ntok+hist-1, written in increasing rows: the old row ntok + j > j
    // that row j may copy is read before it is overwritten.
    if (block == 0)
        for (int64_t j = 0; j < hist; ++j)
            rg_seq_row(state, q.state, j)[c] = rg_conv_ext(x, a.x, state, q, hist, q.ntok + j, c);
}
RG_KERNEL(rg_ssm_conv)

// ---- gdn_prepare ------------------------------------------------------------------------------------------

// torch's softplus (threshold 20) with log1p(y) = log(1 + y) * y / ((1 + y) - 1) (Metal has no log1p): exact
// to a few ulp where 1 + y rounds.
inline float rg_gdn_softplus(float x) {
    if (x > 20.0f) return x;
    const float y = exp(x), u = 1.0f + y;
    return u == 1.0f ? y : log(u) * (y / (u - 1.0f));
}

kernel void rg_gdn_prepare(constant RgGdnPrepareArgs& a [[buffer(0)]], device char* qkv [[buffer(1)]],
                           device char* g [[buffer(2)]], device char* beta [[buffer(3)]],
                           device const char* av [[buffer(4)]], device const char* dt [[buffer(5)]],
                           RG_THREAD_IDS) {
    const int64_t nk = a.n_k, dk = a.k_dim;
    if (tgpig.x < a.norm_groups) {
        // q and k heads: a SIMD-group per (token, head); FLA's eps 1e-6 inside the sqrt, q also by k_dim^-1/2
        const int64_t r = int64_t(tgpig.x) * (ntg / 32) + sgitg;
        if (r >= a.qkv.rows * 2 * nk) return;  // the whole SIMD-group
        const int64_t h = r % (2 * nk);
        device float* p = rg_row<float>(qkv, a.qkv, r / (2 * nk)) + h * dk;
        float ss = 0.0f;
        for (int64_t j = tiisg; j < dk; j += 32) ss += p[j] * p[j];
        ss = simd_sum(ss);
        const float inv = 1.0f / sqrt(ss + 1e-6f), q_scale = 1.0f / sqrt(float(dk));
        for (int64_t j = tiisg; j < dk; j += 32) p[j] = h < nk ? p[j] * inv * q_scale : p[j] * inv;
        return;
    }
    // gates: g <- a * softplus(g + dt_bias), beta <- sigmoid(beta)
    const int64_t nv = a.n_v, i = int64_t(tgpig.x - a.norm_groups) * ntg + tiitg;
    if (i >= a.g.rows * nv) return;
    const int64_t t = i / nv, h = i % nv;
    device float* gt = rg_row<float>(g, a.g, t);
    gt[h] = rg_row<float>(av, a.a, 0)[h] * rg_gdn_softplus(gt[h] + rg_row<float>(dt, a.dt, 0)[h]);
    device float* bt = rg_row<float>(beta, a.beta, t);
    bt[h] = rg_sigmoid(bt[h]);
}
RG_KERNEL(rg_gdn_prepare)

// ---- gdn_scan ---------------------------------------------------------------------------------------------

template <int R>
kernel void rg_gdn_scan(constant RgGdnScanArgs& a [[buffer(0)]], device const char* qkv [[buffer(1)]],
                        device const char* g [[buffer(2)]], device const char* beta [[buffer(3)]],
                        device char* out [[buffer(4)]], device char* b0 [[buffer(5)]],
                        device char* b1 [[buffer(6)]], device char* b2 [[buffer(7)]],
                        device char* b3 [[buffer(8)]], device char* b4 [[buffer(9)]],
                        device char* b5 [[buffer(10)]], device char* b6 [[buffer(11)]],
                        device char* b7 [[buffer(12)]], RG_THREAD_IDS) {
    constant RgSeqSlot& q = a.seqs[tgpig.y];
    const int64_t dk = a.k_dim, dv = a.v_dim, kd = a.n_k * dk;
    const int64_t h = tgpig.x / a.col_blocks;
    const int64_t kh = a.grouped ? h / (a.n_v / a.n_k) : h % a.n_k;  // tiled: v head h reads k head h % n_k
    const int64_t j = int64_t(tgpig.x % a.col_blocks) * 32 + tiisg;
    const uint nsg = RG_GDN_SCAN_GROUPS;  // ntg / 32
    const bool col = j < dv;
    const int64_t hs = dk * dv, head = h * hs;  // the head's state: [k_dim][v_dim] floats from `head`
    device float* S =
        rg_seq_row(rg_seq_binding(q.state.bind, b0, b1, b2, b3, b4, b5, b6, b7), q.state, 0) + head;
    device char* after = q.after.bind < RG_SEQ_BINDINGS
                             ? rg_seq_binding(q.after.bind, b0, b1, b2, b3, b4, b5, b6, b7)
                             : nullptr;

    float s[R];  // S[i][j], i = m * nsg + sgitg
    for (int m = 0; m < R; ++m) {
        const int64_t i = int64_t(m) * nsg + sgitg;
        s[m] = col && i < dk ? S[i * dv + j] : 0.0f;
    }
    threadgroup float* part = (threadgroup float*)shmem;  // [2][3][nsg][32]: k.S, q.S, q.k partials
    for (int64_t t = 0; t < q.ntok; ++t) {
        device const float* row = rg_row<float>(qkv, a.qkv, q.t0 + t);
        device const float* qv = row + kh * dk;
        device const float* kv = row + kd + kh * dk;
        float k[R];
        float ks = 0.0f, qs = 0.0f, qk = 0.0f;
        for (int m = 0; m < R; ++m) {
            const int64_t i = int64_t(m) * nsg + sgitg;
            const float ki = i < dk ? kv[i] : 0.0f, qi = i < dk ? qv[i] : 0.0f;
            k[m] = ki;
            ks += ki * s[m];
            qs += qi * s[m];
            qk += qi * ki;
        }
        threadgroup float* p = part + (t & 1) * 3 * nsg * 32;
        p[sgitg * 32 + tiisg] = ks;
        p[(nsg + sgitg) * 32 + tiisg] = qs;
        p[(2 * nsg + sgitg) * 32 + tiisg] = qk;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float KS = 0.0f, QS = 0.0f, QK = 0.0f;
        for (uint sg = 0; sg < nsg; ++sg) {
            KS += p[sg * 32 + tiisg];
            QS += p[(nsg + sg) * 32 + tiisg];
            QK += p[(2 * nsg + sg) * 32 + tiisg];
        }
        const float decay = exp(rg_row<float>(g, a.g, q.t0 + t)[h]),
                    b = rg_row<float>(beta, a.beta, q.t0 + t)[h];
        const float v = col ? row[2 * kd + h * dv + j] : 0.0f;
        const float delta = (v - decay * KS) * b;
        for (int m = 0; m < R; ++m) s[m] = s[m] * decay + k[m] * delta;
        if (!col) continue;
        if (sgitg == 0) rg_row<float>(out, a.out, q.t0 + t)[h * dv + j] = decay * QS + QK * delta;
        if (after) {
            device float* at = rg_seq_row(after, q.after, t) + head;
            for (int m = 0; m < R; ++m) {
                const int64_t i = int64_t(m) * nsg + sgitg;
                if (i < dk) at[i * dv + j] = s[m];
            }
        }
    }
    if (col)
        for (int m = 0; m < R; ++m) {
            const int64_t i = int64_t(m) * nsg + sgitg;
            if (i < dk) S[i * dv + j] = s[m];
        }
}
RG_INSTANTIATE("rg_gdn_scan_r1", rg_gdn_scan, 1)
RG_INSTANTIATE("rg_gdn_scan_r2", rg_gdn_scan, 2)
RG_INSTANTIATE("rg_gdn_scan_r4", rg_gdn_scan, 4)
RG_INSTANTIATE("rg_gdn_scan_r8", rg_gdn_scan, 8)
RG_INSTANTIATE("rg_gdn_scan_r16", rg_gdn_scan, 16)
RG_INSTANTIATE("rg_gdn_scan_r32", rg_gdn_scan, 32)
