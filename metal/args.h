// Kernel argument structs, shared by the host (csrc/metal/) and the kernels (metal/*.metal): one definition,
// the same layout in C++ and the Metal Shading Language (fixed-width fields, sizes asserted).
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
#else
#include <stdint.h>
#endif

// A tensor as a kernel sees it: `rows` rows of `cols` elements of GGUF type `type`, row r at `stride * r`
// bytes from the bound address.
struct RgShape {
    int64_t rows;
    int64_t cols;
    int64_t stride;
    uint32_t type;
    uint32_t pad;
};
static_assert(sizeof(RgShape) == 32, "RgShape layout");

// copy / zero: `rows` rows of `row_bytes` bytes.
struct RgCopyArgs {
    int64_t rows;
    int64_t row_bytes;
    int64_t src_stride;
    int64_t dst_stride;
};
static_assert(sizeof(RgCopyArgs) == 32, "RgCopyArgs layout");

// Norms (norm.metal): y = norm(x) with optional weights w, bias b (layer_norm) and gate z (rms_norm_gated,
// act: 0 silu, 1 sigmoid).
struct RgNormArgs {
    RgShape x, z, w, b, y;
    float eps;
    uint32_t act;
    uint32_t has_w;
    uint32_t pad;
};
static_assert(sizeof(RgNormArgs) == 176, "RgNormArgs layout");

// ---- Gated DeltaNet and PLE (gdn.metal, ple.metal) ------------------------------------------------------
// Ops over lists of sequences take up to RG_MAX_SEQS sequences per dispatch. Their per-sequence tensors
// (states, checkpoints) are reached through RG_SEQ_BINDINGS buffers bound after the op's other buffers (at
// offset 0, so sequences whose tensors share a buffer share a binding): a sequence's tensor starts `off`
// bytes into binding `bind`, rows `stride` bytes apart.
#define RG_MAX_SEQS 32
#define RG_SEQ_BINDINGS 8
struct RgSeqTensor {
    uint64_t off;
    int64_t stride;
    uint32_t bind;  // RG_SEQ_BINDINGS: none
    uint32_t pad;
};
static_assert(sizeof(RgSeqTensor) == 24, "RgSeqTensor layout");
struct RgSeqSlot {
    int64_t t0, ntok;  // the sequence's rows of the step's activations
    int64_t first;     // ssm_conv / ple_conv: its first work item (token block) in the dispatch's y range
    RgSeqTensor state, after;
};
static_assert(sizeof(RgSeqSlot) == 72, "RgSeqSlot layout");

// ssm_conv (x, out [ntok][channels], w_t [kernel][channels]) and ple_conv (normed, out [ntok][channels],
// w [channels][kernel]): tap k of token t reads ext row t + k * dilation, ext = hist state rows then the
// sequence's rows; `block` tokens per work item (>= hist: only a sequence's first block reads its state).
struct RgConvArgs {
    RgShape x, w, out;
    int64_t taps, dilation, hist, block;
    uint32_t n_seqs;
    uint32_t pad[3];
    RgSeqSlot seqs[RG_MAX_SEQS];
};
static_assert(sizeof(RgConvArgs) == 3 * 32 + 4 * 8 + 16 + RG_MAX_SEQS * 72, "RgConvArgs layout");

// gdn_prepare: qkv [ntok][conv_dim] (q, k heads normalised in place), g, beta [ntok][n_v], a, dt_bias
// [1][n_v].
struct RgGdnPrepareArgs {
    RgShape qkv, g, beta, a, dt;
    int64_t n_k, n_v, k_dim;
    uint32_t norm_groups;  // threadgroups of the q / k norms (the gates' follow)
    uint32_t pad;
};
static_assert(sizeof(RgGdnPrepareArgs) == 5 * 32 + 3 * 8 + 8, "RgGdnPrepareArgs layout");

// gdn_scan: qkv [ntok][conv_dim], g, beta [ntok][n_v], out [ntok][value_dim]; a sequence's state
// [n_v][k_dim][v_dim] packed floats, after [ntok][n_v * k_dim * v_dim]. Threadgroups of RG_GDN_SCAN_GROUPS
// SIMD-groups.
#define RG_GDN_SCAN_GROUPS 8
struct RgGdnScanArgs {
    RgShape qkv, g, beta, out;
    int64_t n_k, n_v, k_dim, v_dim;
    uint32_t col_blocks;  // threadgroups per value head (32 value columns each)
    uint32_t n_seqs;
    uint32_t grouped;  // 1: v head h reads k head h / (n_v / n_k); 0: h % n_k
    uint32_t pad_;
    RgSeqSlot seqs[RG_MAX_SEQS];
};
static_assert(sizeof(RgGdnScanArgs) == 4 * 32 + 4 * 8 + 16 + RG_MAX_SEQS * 72, "RgGdnScanArgs layout");

// ple_gate: key, query, gated, normed [ntok][hc * hidden], value [ntok][hidden], norms [1][hc * hidden].
struct RgPleGateArgs {
    RgShape key, query, value, norm_key, norm_query, norm_conv, gated, normed;
    int64_t hc, hidden;
    float eps;
    float inv_sqrt_hidden;  // float(1 / sqrt(hidden)) rounded from double, as the CPU's
};
static_assert(sizeof(RgPleGateArgs) == 8 * 32 + 2 * 8 + 8, "RgPleGateArgs layout");

// ---- rows (rows.metal)
// --------------------------------------------------------------------------------------- get_rows: out row i
// = dequantized table row ids[i] times scale (when scale != 1), `repeat` times side by side.
struct RgGetRowsArgs {
    RgShape table, ids, out;
    int64_t repeat;
    float scale;
    uint32_t pad;
};
static_assert(sizeof(RgGetRowsArgs) == 112, "RgGetRowsArgs layout");

// gather_rows: out[i] = x[rows[i]].
struct RgGatherRowsArgs {
    RgShape x, rows, out;
};
static_assert(sizeof(RgGatherRowsArgs) == 96, "RgGatherRowsArgs layout");

// One pass of top_k over `n` entries per row: the columns of x (from_cand 0) or candidate pairs (from_cand 1,
// rows of n (value, column) pairs), k largest per chunk of the row, written as candidate pairs (to_cand 1,
// rows of chunks * k pairs) or, by the last pass, to ids / values.
struct RgTopKArgs {
    RgShape x, ids, values;
    int64_t n;
    int64_t k;
    uint32_t from_cand;
    uint32_t to_cand;
    uint32_t has_ids;
    uint32_t has_values;
};
static_assert(sizeof(RgTopKArgs) == 128, "RgTopKArgs layout");

// ---- attention: dense (attention.metal, csrc/metal/attention.cpp) and QSA (qsa.metal, csrc/metal/qsa.cpp)
// ----

// store_rows: x [rows][cols] F32 stored in dst's cache type (metal/cache.h), an I8 cache's scales in scale.
struct RgStoreRowsArgs {
    RgShape x, dst, scale;
};
static_assert(sizeof(RgStoreRowsArgs) == 96, "RgStoreRowsArgs layout");

// kv_append of one sequence: k, v [ntok][n_head_kv * head_dim] (rows t0..) into its caches at positions n0..:
// F32 / F16 keys kc [n_head_kv * cap][head_dim] and values transposed vt [n_head_kv * head_dim][cap]; Q8_0 /
// I8 key and value rows kc, vc [n_head_kv * cap][head_dim] (metal/cache.h), an I8 cache's row scales in
// kc_scale, vc_scale.
struct RgKvAppendArgs {
    RgShape k, v, kc, vt, vc, kc_scale, vc_scale;
    int64_t t0, ntok, n0, cap;
    int32_t n_head_kv, head_dim;
    uint32_t pad[2];
};
static_assert(sizeof(RgKvAppendArgs) == 272, "RgKvAppendArgs layout");

// Causal GQA attention of one sequence: q [ntok][n_head * head_dim] (rows t0..) at positions n0.. over its
// caches k [n_head_kv * cap][head_dim] and v: values transposed [n_head_kv * head_dim][cap] (F32 / F16), or
// value rows [n_head_kv * cap][head_dim] (Q8_0 / I8, with an I8 cache's row scales in k_scale, v_scale); keys
// split n_split ways. has_sinks: head h's sink logit sinks[h] joins its softmax (dropped from the output).
struct RgAttentionArgs {
    RgShape q, k, v, out, k_scale, v_scale;
    int64_t t0, ntok, n0, cap, window;
    int32_t n_head, n_head_kv, head_dim, n_split;
    float scale;
    uint32_t has_sinks;
};
static_assert(sizeof(RgAttentionArgs) == 256, "RgAttentionArgs layout");

// The merge of key splits (dense and QSA attention): part [ntok * n_head][n_split][2 + head_dim] (max score
// m, sum of exponentials l, weighted values o) -> out, times sigmoid(gate) when has_gate. Head h of token t
// is row (t0 + t) * n_head / heads_per_row + h / heads_per_row of out (and gate), columns from
// (h % heads_per_row) * head_dim. has_sinks: head h's sink logit sinks[h] joins the sum (dense attention).
struct RgAttnMergeArgs {
    RgShape out, gate;
    int64_t t0;
    int32_t n_head, heads_per_row, head_dim, n_split;
    uint32_t has_gate, has_sinks;
};
static_assert(sizeof(RgAttnMergeArgs) == 96, "RgAttnMergeArgs layout");

// qsa_pool of one sequence: blocks b0 + tgpig.x. The caches index_k and block_k (metal/cache.h) have their
// scales, where I8, in index_k_scale, block_k_scale.
struct RgQsaPoolArgs {
    RgShape index_k, block_k, pos, norm, freq, axis, index_k_scale, block_k_scale;
    int64_t b0;
    int32_t ratio, index_head_dim, n_rot, pad;
    float eps;
    uint32_t pad2;
};
static_assert(sizeof(RgQsaPoolArgs) == 288, "RgQsaPoolArgs layout");

// qsa_select of one sequence: scores [ntok][nb_stride] (device scratch), then sel / n_sel; the cache block_k
// with its I8 scales in block_k_scale.
struct RgQsaSelectArgs {
    RgShape iq, block_k, sel, n_sel, block_k_scale;
    int64_t t0, ntok, n0, nb_stride;
    int32_t ratio, topk, index_n_head, index_head_dim;
    float index_scale;
    uint32_t pad;
};
static_assert(sizeof(RgQsaSelectArgs) == 216, "RgQsaSelectArgs layout");

// qsa_attend of one sequence: q, gate, out rows (t0 + t) * n_head + h; the caches k, v with their I8 scales
// in k_scale, v_scale; keys split n_split ways.
struct RgQsaAttendArgs {
    RgShape q, gate, sel, n_sel, k, v, out, k_scale, v_scale;
    int64_t t0, ntok, n0;
    int32_t n_head, n_head_kv, head_dim, ratio, n_split;
    float scale;
};
static_assert(sizeof(RgQsaAttendArgs) == 336, "RgQsaAttendArgs layout");

// ---- elementwise (elementwise.metal), rotary embeddings (rope.metal), vision tower (vision.metal)
// ----------

// unary: y = f(x) with parameter p (Backend::unary).
struct RgUnaryArgs {
    RgShape x, y;
    float p;
    uint32_t pad[3];
};
static_assert(sizeof(RgUnaryArgs) == 80, "RgUnaryArgs layout");

// Two inputs, one output: glu (a gate, b up), add (b.stride 0 for one row added to every row), hc_mix (a
// gate, b xn, y mixed) and hc_write (a out, b w, y streams) over hc streams.
struct RgBinaryArgs {
    RgShape a, b, y;
    int64_t hc;
    int64_t pad;
};
static_assert(sizeof(RgBinaryArgs) == 112, "RgBinaryArgs layout");

// rope_table (pos, freq, axis -> table) and rope (x rotated by table row r / rows_per_pos).
struct RgRopeArgs {
    RgShape pos, freq, axis, table, x;
    int64_t rows_per_pos;
    int64_t pad;
};
static_assert(sizeof(RgRopeArgs) == 176, "RgRopeArgs layout");

// add_interpolated: x[r] += sum_j w[r][j] * table[idx[r][j]].
struct RgInterpArgs {
    RgShape table, idx, w, x;
};
static_assert(sizeof(RgInterpArgs) == 128, "RgInterpArgs layout");

// vision_qkv: qkv [n][3 * n_head * head_dim] -> q, k [n_head * n][hp], vt [n_head * head_dim][n].
struct RgVisionQkvArgs {
    RgShape qkv, table, q, k, vt;
    int64_t n_head;
    int64_t pad;
};
static_assert(sizeof(RgVisionQkvArgs) == 176, "RgVisionQkvArgs layout");

// softmax_scaled: each row of x <- softmax(scale * x).
struct RgSoftmaxArgs {
    RgShape x;
    float scale;
    uint32_t pad[3];
};
static_assert(sizeof(RgSoftmaxArgs) == 48, "RgSoftmaxArgs layout");

// ---- products and mixture of experts (metal/matmul.metal, metal/moe.metal) --------------------------------

// The product tiles (metal/matmul.metal): RG_MM_ROWS weight rows x a decode (ntok <= RG_MM_DECODE_TOKENS)
// or prefill token tile, K staged in chunks of _KC; threadgroup memory as RG_MM_SHMEM gives it.
#define RG_MM_THREADS 128
#define RG_MM_ROWS 32
#define RG_MM_DECODE_TOKENS 8
#define RG_MM_DECODE_KC 128
#define RG_MM_PREFILL_TOKENS 32
#define RG_MM_PREFILL_KC 64
#define RG_MM_SHMEM(tokens, kc) (((RG_MM_ROWS + (tokens)) * ((kc) + 4) + 2 * (tokens)) * 4)

// One product of a batch (rg_matmul_<type>): weight rows [0, rows) at w_off (bytes from the weight
// binding, rows w_stride bytes apart, cols elements each) times the ntok packed f32 rows [ntok][cols] at
// x_off, into y[t][r] at y_off (rows of y_ld floats). Its threadgroups: [tile0, tile0 + row_tiles * token
// tiles).
struct RgMatmulJob {
    int64_t w_off, x_off, y_off;
    int64_t w_stride;
    uint32_t rows, cols, ntok, y_ld;
    uint32_t tile0, row_tiles;
    uint32_t pad0, pad1;
};
static_assert(sizeof(RgMatmulJob) == 64, "RgMatmulJob layout");

#define RG_MATMUL_MAX_JOBS 32
struct RgMatmulArgs {
    uint32_t n_jobs, n_tiles;  // jobs in order of tile0; threadgroups in all
    uint32_t decode;           // the decode tile (every job's ntok <= RG_MM_DECODE_TOKENS), else prefill
    uint32_t pad0;
    RgMatmulJob jobs[RG_MATMUL_MAX_JOBS];
};
static_assert(sizeof(RgMatmulArgs) == 16 + 64 * RG_MATMUL_MAX_JOBS, "RgMatmulArgs layout");

// The grouped products of moe_experts (rg_moe_matmul_<type>): expert e's rows [e * n, (e + 1) * n) of the
// stacked weight (w_stride bytes apart, cols elements) times its grouped rows; x rows x_ld floats apart (row
// order[i] / k of grouped row i, or row i where k is 0), y rows y_ld floats apart (row i). The grid: row
// tiles x (slots * tok_tiles).
struct RgMoeMatmulArgs {
    int64_t w_stride, n, cols, x_ld, y_ld;
    uint32_t n_expert, k;
    uint32_t slots, tok_tiles;
    uint32_t decode;  // the decode tile, else prefill
    uint32_t pad0;
};
static_assert(sizeof(RgMoeMatmulArgs) == 64, "RgMoeMatmulArgs layout");

// The routing pairs p = t * k + j of ids [ntok][k] grouped by expert (rg_moe_group), into n_expert + 1
// offsets, 1 + n_expert active experts (their count, then their ids ascending) and the pairs in that order.
struct RgMoeGroupArgs {
    RgShape ids;
    uint32_t n_expert;
    uint32_t pad0, pad1, pad2;
};
static_assert(sizeof(RgMoeGroupArgs) == 48, "RgMoeGroupArgs layout");

// moe_route: softmax of logits rows, the top k (the first `keep` by probability, the rest by score = logit +
// bonus for resident experts), weights renormalised when norm_topk.
struct RgMoeRouteArgs {
    RgShape logits, ids, weights;
    uint32_t k, keep, norm_topk, has_resident;
    float bonus;
    uint32_t pad0, pad1, pad2;
};
static_assert(sizeof(RgMoeRouteArgs) == 128, "RgMoeRouteArgs layout");

// out = act(g, u) row by row: silu(g) * u, or gpt-oss's clamped SwiGLU (act 1). has_bias: row r of g and u
// belongs to expert e = ids[p / k][p % k], p = order[r], whose gate_bias / up_bias row is added first.
struct RgMoeSwigluArgs {
    RgShape g, u, out, ids, gate_bias, up_bias;
    uint32_t k, act, has_bias, pad;
};
static_assert(sizeof(RgMoeSwigluArgs) == 208, "RgMoeSwigluArgs layout");

// moe_combine: y[t] = sum over the rows i with pairs[i] / k = t, in row order, of weights[t][pairs[i] % k] *
// ys[i] (+ sigmoid(shared_gate[t][0]) * shared[t]); n_rows pairs (negative ones name no token). has_bias:
// down_bias[ids[t][j]] added to the row of pair j first.
struct RgMoeCombineArgs {
    RgShape ys, weights, shared, shared_gate, y, ids, down_bias;
    uint32_t n_rows, k, has_shared, has_bias;
};
static_assert(sizeof(RgMoeCombineArgs) == 240, "RgMoeCombineArgs layout");
