// Dense causal GQA attention over a KV cache (Backend::kv_append, attention): F32 or F16 keys and transposed
// values, or Q8_0 / I8 key and value rows (metal/cache.h).
//
// rg_kv_append_f32 / _f16: a threadgroup per (32 tokens, kv head), 256 threads: key rows copied as they are;
// values transposed through threadgroup memory 32 x 32 at a time, so both the reads of v and the writes of
// the transposed cache vt are coalesced. rg_kv_append_rows: a SIMD-group per (token, kv head) quantizing its
// key and value rows as store_rows does.
//
// rg_attention_*: flash attention with SIMD-group matrices. A threadgroup (4 SIMD-groups) takes 8 query rows
// of one kv head (token-major: the group's heads of a token, then the next token's, so decode reads each key
// once for all heads sharing it) and one of n_split ranges of their keys; decode over long contexts gets its
// parallelism from the splits, prefill from the rows. Per chunk of 64 keys:
//   scores  S^T [key][row] = K [key][d] . Q^T [d][row]: SIMD-group s computes keys 8s.., 8s + 32.. (8x8
//           tiles, K straight from the cache rows, Q from threadgroup memory);
//   softmax the running max / sum of exponentials per row (online: earlier sums and outputs rescaled by
//           exp(m_old - m_new)); masked keys (causal, sliding window, other splits) get probability 0;
//   values  O^T [d][row] += vt [d][key] . P^T [key][row]: SIMD-group s owns the 8-element tiles s, s + 4, ..
//           of head_dim (held in registers across the chunks: head_dim <= 256).
// For an F16 cache the queries and probabilities are rounded to half as the CPU's f16 products do (products
// accumulate in float). rg_attention_rows (Q8_0 / I8) is the F32 kernel over the rows' dequantized values:
// each SIMD-group dequantizes its key tiles 8 x 32 and value tiles 8 x 8 into threadgroup memory and loads
// them from there (keys past the split's end as 0), so it computes what rg_attention_f32 does on an F32 cache
// holding those values. One split writes the output itself; several write (m, l, o) to a scratch that
// rg_attention_merge combines (also used by qsa.metal).
#include "compat.h"

#include "args.h"
#include "cache.h"
#include "common.h"

enum RgAttentionConsts : int {
    kAttnRows = 8,       // query rows per threadgroup (one SIMD-group matrix's columns)
    kAttnSg = 4,         // SIMD-groups per threadgroup
    kAttnChunk = 64,     // keys per chunk: 2 key tiles per SIMD-group
    kAttnMaxDTiles = 8,  // O^T tiles per SIMD-group: head_dim <= 8 * kAttnSg * kAttnMaxDTiles
};

template <typename T>
kernel void rg_kv_append(constant RgKvAppendArgs& a [[buffer(0)]], device const char* k [[buffer(1)]],
                         device const char* v [[buffer(2)]], device char* kc [[buffer(3)]],
                         device char* vt [[buffer(4)]], RG_THREAD_IDS) {
    const int D = a.head_dim, h = int(tgpig.y);
    const int64_t t_lo = int64_t(tgpig.x) * 32;
    const int nt = a.ntok - t_lo < 32 ? int(a.ntok - t_lo) : 32;
    threadgroup float* tile = (threadgroup float*)shmem;  // [32 tokens][33]
    for (int i = int(tiitg); i < nt * D; i += int(ntg)) {
        const int t = i / D, e = i % D;
        rg_row<T>(kc, a.kc, h * a.cap + a.n0 + t_lo + t)[e] =
            T(rg_row<float>(k, a.k, a.t0 + t_lo + t)[h * D + e]);
    }
    for (int e0 = 0; e0 < D; e0 += 32) {
        for (int i = int(tiitg); i < 32 * 32; i += int(ntg)) {
            const int t = i / 32, e = i % 32;
            if (t < nt && e0 + e < D)
                tile[t * 33 + e] = rg_row<float>(v, a.v, a.t0 + t_lo + t)[h * D + e0 + e];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int i = int(tiitg); i < 32 * 32; i += int(ntg)) {
            const int e = i / 32, t = i % 32;
            if (t < nt && e0 + e < D)
                rg_row<T>(vt, a.vt, h * D + e0 + e)[a.n0 + t_lo + t] = T(tile[t * 33 + e]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
}
RG_INSTANTIATE("rg_kv_append_f32", rg_kv_append, float)
RG_INSTANTIATE("rg_kv_append_f16", rg_kv_append, half)

// Threadgroups of 4 SIMD-groups: (token, kv head) pairs tgpig.x * 4 + sgitg.
kernel void rg_kv_append_rows(constant RgKvAppendArgs& a [[buffer(0)]], device const char* k [[buffer(1)]],
                              device const char* v [[buffer(2)]], device char* kc [[buffer(3)]],
                              device char* vc [[buffer(4)]], device char* kc_scale [[buffer(5)]],
                              device char* vc_scale [[buffer(6)]], RG_THREAD_IDS) {
    const int64_t item = int64_t(tgpig.x) * (ntg / 32) + sgitg;
    if (item >= a.ntok * a.n_head_kv) return;  // the whole SIMD-group
    const int64_t t = item / a.n_head_kv, h = item % a.n_head_kv, r = h * a.cap + a.n0 + t;
    const int D = a.head_dim;
    rg_cache_store(kc, a.kc, kc_scale, a.kc_scale, r, rg_row<float>(k, a.k, a.t0 + t) + h * D, D, tiisg);
    rg_cache_store(vc, a.vc, vc_scale, a.vc_scale, r, rg_row<float>(v, a.v, a.t0 + t) + h * D, D, tiisg);
}
RG_KERNEL(rg_kv_append_rows)

// Threadgroup (x: kv head * tiles + tile of 8 rows, y: split). Threadgroup memory (host: attention.cpp):
// q / o [8 * head_dim] floats (Q as T, later O^T as float), S^T [64][8] floats, P^T [64][8] T, the rows'
// max, sum, compensation, rescale [4][8], the rescale as a diagonal matrix [8][8] and, for ROWS caches, each
// SIMD-group's dequantized tile [4][8][32]. vc: the values, transposed (F32 / F16) or rows (ROWS).
template <typename T, bool ROWS>
kernel void rg_attention(constant RgAttentionArgs& a [[buffer(0)]], device const char* q [[buffer(1)]],
                         device const char* kc [[buffer(2)]], device const char* vc [[buffer(3)]],
                         device char* out [[buffer(4)]], device float* part [[buffer(5)]],
                         device const char* k_scale [[buffer(6)]], device const char* v_scale [[buffer(7)]],
                         device const float* sinks [[buffer(8)]], RG_THREAD_IDS) {
    const int D = a.head_dim, H = a.n_head, G = a.n_head / a.n_head_kv, n_split = a.n_split;
    const int64_t n_rows = a.ntok * G, tiles = (n_rows + kAttnRows - 1) / kAttnRows;
    const int g = int(tgpig.x / tiles), split = int(tgpig.y);
    const int64_t r0 = int64_t(tgpig.x % tiles) * kAttnRows;
    const int nr = n_rows - r0 < kAttnRows ? int(n_rows - r0) : int(kAttnRows);

    // The keys the rows see: from the first row's window start to the last row's position; this split's part,
    // in whole chunks from a multiple of 8.
    const int64_t p_first = a.n0 + r0 / G, p_last = a.n0 + (r0 + nr - 1) / G;
    const int64_t lo = a.window > 0 && p_first >= a.window ? p_first - a.window + 1 : 0, hi = p_last + 1;
    const int64_t lo8 = lo / 8 * 8;
    const int64_t per = ((hi - lo8 + n_split - 1) / n_split + kAttnChunk - 1) / kAttnChunk * kAttnChunk;
    const int64_t kb = lo8 + split * per, ke = kb + per < hi ? kb + per : hi;

    threadgroup T* qs = (threadgroup T*)shmem;                                  // [8][D]
    threadgroup float* os = (threadgroup float*)shmem;                          // [D][8], after the keys
    threadgroup float* st = (threadgroup float*)(shmem + kAttnRows * D * 4);    // [64][8]
    threadgroup T* pt = (threadgroup T*)(st + kAttnChunk * kAttnRows);          // [64][8]
    threadgroup float* ms = (threadgroup float*)(pt + kAttnChunk * kAttnRows);  // [8]
    threadgroup float* ls = ms + kAttnRows;                                     // [8]
    threadgroup float* cs = ls + kAttnRows;  // [8] Kahan compensation of ls
    threadgroup float* al = cs + kAttnRows;  // [8]
    threadgroup float* dg = al + kAttnRows;  // [8][8]
    threadgroup T* tile = (threadgroup T*)(dg + kAttnRows * kAttnRows) + sgitg * 8 * 32;  // ROWS: [8][32]

    for (int i = int(tiitg); i < kAttnRows * D; i += int(ntg)) {
        const int r = i / D, e = i % D;
        float x = 0.0f;
        if (r < nr) {
            const int64_t ri = r0 + r;
            x = rg_row<float>(q, a.q, a.t0 + ri / G)[(int64_t(g) * G + ri % G) * D + e];
        }
        qs[i] = T(x);
    }
    if (tiitg < kAttnRows) ms[tiitg] = -INFINITY, ls[tiitg] = 0.0f, cs[tiitg] = 0.0f;
    if (tiitg < kAttnRows * kAttnRows) dg[tiitg] = 0.0f;

    // This thread's softmax entries: row rr, keys jj + 16 u of the chunk (the row's 16 lanes are half a
    // SIMD-group). Rows past nr repeat the last row's mask (their queries are 0, their outputs unused).
    const int rr = int(tiitg) / 16, jj = int(tiitg) % 16;
    const int64_t pos = a.n0 + (r0 + min(rr, nr - 1)) / G;
    const int64_t first = a.window > 0 && pos >= a.window ? pos - a.window + 1 : 0;

    const int n_dt = D / 8;
    simdgroup_float8x8 o[kAttnMaxDTiles];
    for (int j = 0; j < kAttnMaxDTiles; ++j) o[j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    threadgroup_barrier(mem_flags::mem_threadgroup);

    device const T* kh = rg_row<T>(kc, a.k, int64_t(g) * a.cap);
    const int64_t k_row = a.k.stride / int64_t(sizeof(T)), v_row = a.v.stride / int64_t(sizeof(T));
    const int64_t row0 = int64_t(g) * a.cap;  // ROWS: the kv head's first cache row
    for (int64_t c0 = kb; c0 < ke; c0 += kAttnChunk) {
        // scores
        for (int u = 0; u < 2; ++u) {
            const int kt = int(sgitg) + kAttnSg * u;
            const int64_t key0 = c0 + 8 * kt;
            if (key0 >= ke) continue;  // the whole SIMD-group: masked below
            simdgroup_float8x8 s = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
            if (ROWS) {
                for (int e0 = 0; e0 < D; e0 += 32) {
                    const int w = D - e0 < 32 ? D - e0 : 32;
                    rg_cache_tile(tile, w, kc, a.k, k_scale, a.k_scale, row0 + key0, row0 + ke, e0, tiisg);
                    simdgroup_barrier(mem_flags::mem_threadgroup);
                    for (int d0 = 0; d0 < w; d0 += 8) {
                        simdgroup_matrix<T, 8, 8> km, qm;
                        simdgroup_load(km, tile + d0, ulong(w));
                        simdgroup_load(qm, qs + e0 + d0, ulong(D), ulong2(0), true);
                        simdgroup_multiply_accumulate(s, km, qm, s);
                    }
                    simdgroup_barrier(mem_flags::mem_threadgroup);
                }
            } else {
                for (int d0 = 0; d0 < D; d0 += 8) {
                    simdgroup_matrix<T, 8, 8> km, qm;
                    simdgroup_load(km, kh + key0 * k_row + d0, ulong(k_row));
                    simdgroup_load(qm, qs + d0, ulong(D), ulong2(0), true);
                    simdgroup_multiply_accumulate(s, km, qm, s);
                }
            }
            simdgroup_store(s, st + kt * 64, 8);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // softmax: the row's max over the chunk, probabilities, the running sum
        float sc[4];
        float cmax = -INFINITY;
        for (int u = 0; u < 4; ++u) {
            const int kk = jj + 16 * u;
            const int64_t key = c0 + kk;
            const bool vis = key < ke && key >= first && key <= pos;
            sc[u] = vis ? st[kk * kAttnRows + rr] * a.scale : -INFINITY;
            cmax = max(cmax, sc[u]);
        }
        for (ushort m = 8; m > 0; m >>= 1) cmax = max(cmax, simd_shuffle_xor(cmax, m));
        const float m_old = ms[rr], m_new = max(m_old, cmax);
        float psum = 0.0f;
        for (int u = 0; u < 4; ++u) {
            const float p = sc[u] == -INFINITY ? 0.0f : exp(sc[u] - m_new);
            pt[(jj + 16 * u) * kAttnRows + rr] = T(p);
            psum += p;
        }
        for (ushort m = 8; m > 0; m >>= 1) psum += simd_shuffle_xor(psum, m);
        if (jj == 0) {
            const float alpha = m_old == -INFINITY ? 0.0f : exp(m_old - m_new);
            const float l = ls[rr] * alpha, c = cs[rr] * alpha;
            const float y = psum - c, t = l + y;
            cs[rr] = (t - l) - y;
            ls[rr] = t;
            ms[rr] = m_new;
            al[rr] = alpha;
            dg[rr * kAttnRows + rr] = alpha;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // values: rescale the outputs where a row's max grew, then add this chunk's
        bool rescale = false;
        for (int r = 0; r < kAttnRows; ++r) rescale = rescale || al[r] != 1.0f;
        if (rescale) {
            simdgroup_float8x8 dm;
            simdgroup_load(dm, dg, 8);
            for (int j = 0; j < kAttnMaxDTiles; ++j)
                if (int(sgitg) + kAttnSg * j < n_dt) simdgroup_multiply(o[j], o[j], dm);
        }
        for (int kt = 0; kt < kAttnChunk / 8; ++kt) {
            const int64_t key0 = c0 + 8 * kt;
            if (key0 >= ke) break;
            simdgroup_matrix<T, 8, 8> pm;
            simdgroup_load(pm, pt + kt * 64, 8);
            for (int j = 0; j < kAttnMaxDTiles; ++j) {
                const int dt = int(sgitg) + kAttnSg * j;
                if (dt >= n_dt) break;
                simdgroup_matrix<T, 8, 8> vm;
                if (ROWS) {  // vm[i][k] = value row key0 + k, element 8 dt + i
                    rg_cache_tile(tile, 8, vc, a.v, v_scale, a.v_scale, row0 + key0, row0 + ke, 8 * dt,
                                  tiisg);
                    simdgroup_barrier(mem_flags::mem_threadgroup);
                    simdgroup_load(vm, tile, 8, ulong2(0), true);
                    simdgroup_barrier(mem_flags::mem_threadgroup);
                } else {
                    simdgroup_load(vm, rg_row<T>(vc, a.v, int64_t(g) * D + 8 * dt) + key0, ulong(v_row));
                }
                simdgroup_multiply_accumulate(o[j], vm, pm, o[j]);
            }
        }
    }

    // out = O / l (one split), or this split's (m, l, O) for rg_attention_merge
    for (int j = 0; j < kAttnMaxDTiles; ++j) {
        const int dt = int(sgitg) + kAttnSg * j;
        if (dt < n_dt) simdgroup_store(o[j], os + dt * 64, 8);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = int(tiitg); i < nr * D; i += int(ntg)) {
        const int r = i / D, e = i % D;
        const int64_t ri = r0 + r, t = ri / G, h = int64_t(g) * G + ri % G;
        if (n_split == 1) {
            // the sink's term of the sum, at the row's max
            const float l = a.has_sinks ? ls[r] + exp(sinks[h] - ms[r]) : ls[r];
            rg_row<float>(out, a.out, a.t0 + t)[h * D + e] = os[e * kAttnRows + r] / l;
        } else {
            device float* p = part + ((t * H + h) * n_split + split) * (D + 2);
            if (e == 0) p[0] = ms[r], p[1] = ls[r];
            p[2 + e] = os[e * kAttnRows + r];
        }
    }
}
RG_INSTANTIATE("rg_attention_f32", rg_attention, float, false)
RG_INSTANTIATE("rg_attention_f16", rg_attention, half, false)
RG_INSTANTIATE("rg_attention_rows", rg_attention, float, true)

// The splits of a head's keys combined: a threadgroup per (token, head) of the sequence, threads over
// head_dim. Each split's terms are rescaled to the largest max M: out = sum_s e^(m_s - M) o_s / sum_s
// e^(m_s - M) l_s (splits that saw no key have m = -inf and count 0), + e^(sinks[h] - M) with sinks.
kernel void rg_attention_merge(constant RgAttnMergeArgs& a [[buffer(0)]],
                               device const float* part [[buffer(1)]], device const char* gate [[buffer(2)]],
                               device char* out [[buffer(3)]], device const float* sinks [[buffer(4)]],
                               RG_THREAD_IDS) {
    const int D = a.head_dim, n_split = a.n_split, hpr = a.heads_per_row;
    const int64_t o = tgpig.x;
    device const float* p = part + o * n_split * (D + 2);
    threadgroup float* w = (threadgroup float*)shmem;  // [n_split] e^(m_s - M)
    float mx = -INFINITY;
    for (int s = 0; s < n_split; ++s) mx = max(mx, p[s * (D + 2)]);
    for (int s = int(tiitg); s < n_split; s += int(ntg)) {
        const float m = p[s * (D + 2)];
        w[s] = m == -INFINITY ? 0.0f : exp(m - mx);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float l = 0.0f, c = 0.0f;  // compensated sum
    for (int s = 0; s < n_split; ++s) {
        const float y = w[s] * p[s * (D + 2) + 1] - c, t = l + y;
        c = (t - l) - y;
        l = t;
    }
    if (a.has_sinks) l += exp(sinks[o % a.n_head] - mx);
    const float inv = 1.0f / l;
    const int64_t ho = a.t0 * a.n_head + o, row = ho / hpr, col = (ho % hpr) * D;
    device float* y = rg_row<float>(out, a.out, row) + col;
    for (int e = int(tiitg); e < D; e += int(ntg)) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; ++s) acc += w[s] * p[s * (D + 2) + 2 + e];
        float r = acc * inv;
        if (a.has_gate) r *= rg_sigmoid(rg_row<float>(gate, a.gate, row)[col + e]);
        y[e] = r;
    }
}
RG_KERNEL(rg_attention_merge)
