// The PLE layer's gate and dilated causal conv (Backend::ple_gate, ple_conv; model/ple.h has the equations).
//
// rg_ple_gate: a threadgroup per (token, stream), threads striding over the `hidden` columns (up to 256,
//   whole SIMD-groups): the RMSNorms of key and query, their kq product, the signed square root and sigmoid,
//   the gated value and its RMSNorm. The CPU sums in double. Sums of squares (positive terms) are float tree
//   sums (rg_group_sum: relative error ~ eps log n, well inside the tolerance). The kq product, whose terms
//   cancel and whose result goes through a square root (steep near 0), is compensated: each product split
//   exactly into p + e (fma), summed as a float pair (hi, lo) with TwoSum per thread, across the SIMD-group
//   (butterfly) and across SIMD-groups, about as accurate as the CPU's double sum.
// rg_ple_conv: a thread per (channel, block of tokens of one sequence), threadgroups of up to 256 channels.
//   Blocks hold at least the history's (K-1) * dilation tokens, so only a sequence's first block reads its
//   state; that block's threads write the new history (their own channel) last.
#include "compat.h"

#include "args.h"
#include "common.h"

// ---- ple_gate ---------------------------------------------------------------------------------------------

// a + b as hi + lo exactly (Knuth's TwoSum: the same pair for b + a).
inline float2 rg_ple_two_sum(float a, float b) {
    const float s = a + b, bb = s - a;
    return float2(s, (a - (s - bb)) + (b - bb));
}
inline float2 rg_ple_pair_add(float2 x, float2 y) {
    const float2 r = rg_ple_two_sum(x.x, y.x);
    return float2(r.x, r.y + (x.y + y.y));
}

// 1 / sqrt(mean of squares + eps), the CPU's nn::inv_rms in float.
inline float rg_ple_inv_rms(float ss, int64_t n, float eps) { return 1.0f / sqrt(ss / float(n) + eps); }

kernel void rg_ple_gate(constant RgPleGateArgs& a [[buffer(0)]], device const char* key [[buffer(1)]],
                        device const char* query [[buffer(2)]], device const char* value [[buffer(3)]],
                        device const char* norm_key [[buffer(4)]],
                        device const char* norm_query [[buffer(5)]],
                        device const char* norm_conv [[buffer(6)]], device char* gated [[buffer(7)]],
                        device char* normed [[buffer(8)]], RG_THREAD_IDS) {
    const int64_t D = a.hidden, t = tgpig.x / a.hc, off = int64_t(tgpig.x % a.hc) * D;
    device const float* k = rg_row<float>(key, a.key, t) + off;
    device const float* q = rg_row<float>(query, a.query, t) + off;
    device const float* gk = rg_row<float>(norm_key, a.norm_key, 0) + off;
    device const float* gq = rg_row<float>(norm_query, a.norm_query, 0) + off;
    threadgroup float* part = (threadgroup float*)shmem;  // [32]: rg_group_sum
    threadgroup float* pairs = part + 32;                 // [2][32]: the SIMD-groups' key.query sums (hi, lo)

    float ssk = 0.0f, ssq = 0.0f;
    for (int64_t d = tiitg; d < D; d += ntg) ssk += k[d] * k[d], ssq += q[d] * q[d];
    const float ik = rg_ple_inv_rms(rg_group_sum(ssk, part, sgitg, tiisg, ntg), D, a.eps);
    const float iq = rg_ple_inv_rms(rg_group_sum(ssq, part, sgitg, tiisg, ntg), D, a.eps);

    float2 kq = float2(0.0f, 0.0f);
    for (int64_t d = tiitg; d < D; d += ntg) {
        const float x = (k[d] * ik) * gk[d], y = (q[d] * iq) * gq[d];
        const float p = x * y, e = fma(x, y, -p);  // x y = p + e exactly
        const float2 r = rg_ple_two_sum(kq.x, p);
        kq = float2(r.x, r.y + (kq.y + e));
    }
    for (ushort m = 16; m > 0; m >>= 1) {
        const float2 o = float2(simd_shuffle_xor(kq.x, m), simd_shuffle_xor(kq.y, m));
        kq = rg_ple_pair_add(kq, o);
    }
    if (tiisg == 0) pairs[sgitg] = kq.x, pairs[32 + sgitg] = kq.y;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    kq = float2(pairs[0], pairs[32]);
    for (uint sg = 1; sg < ntg / 32; ++sg) kq = rg_ple_pair_add(kq, float2(pairs[sg], pairs[32 + sg]));

    float gv = (kq.x + kq.y) * a.inv_sqrt_hidden;
    const float sgn = gv > 0.0f ? 1.0f : (gv < 0.0f ? -1.0f : 0.0f);
    gv = sqrt(max(fabs(gv), 1e-6f)) * sgn;  // signed square root
    const float sig = rg_sigmoid(gv);

    device const float* v = rg_row<float>(value, a.value, t);
    device float* gt = rg_row<float>(gated, a.gated, t) + off;
    float ss = 0.0f;
    for (int64_t d = tiitg; d < D; d += ntg) {
        const float x = sig * v[d];
        gt[d] = x;
        ss += x * x;
    }
    const float io = rg_ple_inv_rms(rg_group_sum(ss, part, sgitg, tiisg, ntg), D, a.eps);
    device const float* gc = rg_row<float>(norm_conv, a.norm_conv, 0) + off;
    device float* nr = rg_row<float>(normed, a.normed, t) + off;
    for (int64_t d = tiitg; d < D; d += ntg) nr[d] = (sig * v[d]) * io * gc[d];
}
RG_KERNEL(rg_ple_gate)

// ---- ple_conv ---------------------------------------------------------------------------------------------

// out[t][c] += silu(sum_k w[c][k] * ext[t + k * dilation][c]), ext = the state's hist rows, then the
// sequence's normed rows.
kernel void rg_ple_conv(constant RgConvArgs& a [[buffer(0)]], device const char* x [[buffer(1)]],
                        device const char* w [[buffer(2)]], device char* out [[buffer(3)]],
                        device char* b0 [[buffer(4)]], device char* b1 [[buffer(5)]],
                        device char* b2 [[buffer(6)]], device char* b3 [[buffer(7)]],
                        device char* b4 [[buffer(8)]], device char* b5 [[buffer(9)]],
                        device char* b6 [[buffer(10)]], device char* b7 [[buffer(11)]], RG_THREAD_IDS) {
    const int64_t c = int64_t(tgpig.x) * ntg + tiitg, C = a.x.cols, K = a.taps, dil = a.dilation,
                  hist = a.hist;
    if (c >= C) return;
    uint s = 0;  // the sequence of this work item
    while (s + 1 < a.n_seqs && int64_t(tgpig.y) >= a.seqs[s + 1].first) ++s;
    constant RgSeqSlot& q = a.seqs[s];
    const int64_t block = int64_t(tgpig.y) - q.first, t_begin = block * a.block;
    const int64_t t_end = q.ntok < t_begin + a.block ? q.ntok : t_begin + a.block;
    device char* state = hist > 0 ? rg_seq_binding(q.state.bind, b0, b1, b2, b3, b4, b5, b6, b7) : nullptr;
    device const float* wc = rg_row<float>(w, a.w, c);  // [K]
    for (int64_t t = t_begin; t < t_end; ++t) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc += wc[k] * rg_conv_ext(x, a.x, state, q, hist, t + k * dil, c);
        rg_row<float>(out, a.out, q.t0 + t)[c] += rg_silu(acc);
    }
    // The new history, ext rows ntok .. ntok+hist-1, written in increasing rows: the old row ntok + j > j
    // that row j may copy is read before it is overwritten.
    if (block == 0)
        for (int64_t j = 0; j < hist; ++j)
            rg_seq_row(state, q.state, j)[c] = rg_conv_ext(x, a.x, state, q, hist, q.ntok + j, c);
}
RG_KERNEL(rg_ple_conv)
