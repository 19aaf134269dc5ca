// QSA sparse attention (Backend::qsa_pool, qsa_select, qsa_attend; model/qsa_attention.h has the semantics).
//
// The caches (keys, values, indexer keys, pooled block keys) are F32, F16, Q8_0 or I8, read element by
// element as the CPU's dequantized rows and stored as the CPU's store_rows (metal/cache.h).
//
// rg_qsa_pool: a threadgroup per pooled block, threads over index_head_dim: the mean of the block's indexer
// keys (in token order, as the CPU), RMS-normed (sum of squares: per-thread float sums added in a tree), then
// rotated at the position of the block's first token, and stored by the first SIMD-group.
//
// qsa_select in two kernels. rg_qsa_score: a threadgroup per (64 blocks, query), 8 lanes per block and 4
// blocks per SIMD-group at a time; lane u sums the products u, u + 8, ... of each indexer head's dot product
// and the lanes' sums are combined as ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7)), the CPU's nn::dot order, so
// the scores are the CPU's bit for bit and so are the choices (the outputs are compared exactly).
// rg_qsa_topk: a threadgroup of 256 per query: the k-th largest score by a radix select over the scores'
// order-preserving 32-bit keys (4 passes of 8 bits, histograms in threadgroup atomics), then every block
// above it and the lowest-numbered blocks equal to it, written in increasing block order by prefix sums.
//
// rg_qsa_attend: flash attention over a query's keys (selected blocks, then the tail). A threadgroup (4
// SIMD-groups) takes up to 8 heads of one token sharing a kv head (they share the keys) and one of n_split
// ranges of the keys; per chunk of 32 keys: scores with 8 lanes per key (4 keys per SIMD-group at a time,
// coalesced key rows), an online softmax (running max and sum per head, outputs rescaled), then the values:
// lanes over head_dim (coalesced value rows), the 8 heads' sums in registers (head_dim <= 512). The gate
// sigmoid(gate) is applied with the normalisation, here for one split, in rg_attention_merge
// (attention.metal) for several.
#include "compat.h"

#include "args.h"
#include "cache.h"
#include "common.h"

enum RgQsaConsts : int {
    kQsaRows = 8,    // heads per threadgroup
    kQsaSg = 4,      // SIMD-groups per threadgroup
    kQsaChunk = 32,  // keys per chunk: 8 per SIMD-group
    kQsaMaxE = 4,    // head_dim elements per lane: head_dim <= 32 * kQsaSg * kQsaMaxE
};

kernel void rg_qsa_pool(constant RgQsaPoolArgs& a [[buffer(0)]], device const char* index_k [[buffer(1)]],
                        device char* block_k [[buffer(2)]], device const char* pos [[buffer(3)]],
                        device const char* norm [[buffer(4)]], device const char* freq [[buffer(5)]],
                        device const char* axis [[buffer(6)]], device const char* index_k_scale [[buffer(7)]],
                        device char* block_k_scale [[buffer(8)]], RG_THREAD_IDS) {
    const int R = a.ratio, ID = a.index_head_dim, hr = a.n_rot / 2;
    const int64_t b = a.b0 + tgpig.x;
    threadgroup float* part = (threadgroup float*)shmem;  // [32]
    threadgroup float* x = part + 32;                     // [ID] the mean, then the pooled key
    float ss = 0.0f;
    for (int i = int(tiitg); i < ID; i += int(ntg)) {
        float m = 0.0f;
        for (int j = 0; j < R; ++j)
            m += rg_cache_at(rg_cache_row(index_k, a.index_k, index_k_scale, a.index_k_scale, b * R + j), i);
        m = m / float(R);
        x[i] = m;
        ss += m * m;
    }
    ss = rg_group_sum(ss, part, sgitg, tiisg, ntg);  // its barriers also publish x
    const float inv = 1.0f / sqrt(ss / float(ID) + a.eps);
    device const float* w = rg_row<float>(norm, a.norm, 0);
    device const float* f = rg_row<float>(freq, a.freq, 0);
    device const int* ax = rg_row<int>(axis, a.axis, 0);
    device const int64_t* p = rg_row<int64_t>(pos, a.pos, b * R);
    for (int i = int(tiitg); i < ID; i += int(ntg)) {  // in place: thread i alone touches i (and i + hr)
        const float y = x[i] * inv * w[i];
        if (i >= 2 * hr) {
            x[i] = y;
        } else if (i < hr) {  // the pair (i, i + hr)
            const float y2 = x[i + hr] * inv * w[i + hr];
            const float angle = float(p[ax[i]]) * f[i];
            const float c = precise::cos(angle), s = precise::sin(angle);
            x[i] = y * c - y2 * s;
            x[i + hr] = y2 * c + y * s;
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sgitg == 0) rg_cache_store(block_k, a.block_k, block_k_scale, a.block_k_scale, b, x, ID, tiisg);
}
RG_KERNEL(rg_qsa_pool)

// scores [t][b] = sum_h relu(iq_h . bk_b) * index_scale for the queries that do not keep every block.
kernel void rg_qsa_score(constant RgQsaSelectArgs& a [[buffer(0)]], device const char* iq [[buffer(1)]],
                         device const char* block_k [[buffer(2)]], device float* scores [[buffer(3)]],
                         device const char* block_k_scale [[buffer(4)]], RG_THREAD_IDS) {
    const int64_t t = tgpig.y, nb = (a.n0 + t + 1) / a.ratio;
    if (nb <= a.topk) return;  // the whole threadgroup: every block is kept
    const int ID = a.index_head_dim, IH = a.index_n_head, n8 = ID / 8 * 8, u = int(tiisg) % 8;
    device const float* qv = rg_row<float>(iq, a.iq, a.t0 + t);
    for (int step = 0; step < 4; ++step) {
        const int64_t b = int64_t(tgpig.x) * 64 + step * 16 + sgitg * 4 + tiisg / 8;
        const bool valid = b < nb;
        const RgCacheRow bk = rg_cache_row(block_k, a.block_k, block_k_scale, a.block_k_scale, valid ? b : 0);
        float sum = 0.0f;
        for (int h = 0; h < IH; ++h) {
            device const float* qh = qv + h * ID;
            float p = 0.0f;
            if (valid)
                for (int i = u; i < n8; i += 8) p += qh[i] * rg_cache_at(bk, i);
            const float x = p + simd_shuffle_xor(p, ushort(4));  // lane 0: p0 + p4, lane 1: p1 + p5, ...
            const float y = x + simd_shuffle_xor(x, ushort(1));  // lane 0: (p0 + p4) + (p1 + p5), lane 2: ...
            float s = y + simd_shuffle_xor(y, ushort(2));        // lane 0: the dot product's first n8 terms
            for (int i = n8; i < ID; ++i) s += qh[i] * rg_cache_at(bk, i);
            sum += max(s, 0.0f);
        }
        if (valid && u == 0) scores[t * a.nb_stride + b] = sum * a.index_scale;
    }
}
RG_KERNEL(rg_qsa_score)

// A float's order as an unsigned integer (larger float, larger key); -0 is +0.
inline uint rg_score_key(float s) {
    const uint u = as_type<uint>(s == 0.0f ? 0.0f : s);
    return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// sel[t] = the top min(topk, nb) blocks (ties: lower block) in increasing order, n_sel[t] their number.
// 256 threads (8 SIMD-groups). Threadgroup memory: histogram [256] atomic_uint, per SIMD-group totals [8],
// the chosen digit and the count still to take at it [2].
kernel void rg_qsa_topk(constant RgQsaSelectArgs& a [[buffer(0)]], device const float* scores [[buffer(1)]],
                        device char* sel [[buffer(2)]], device char* n_sel [[buffer(3)]], RG_THREAD_IDS) {
    const int64_t t = tgpig.x, row = a.t0 + t;
    const int nb = int((a.n0 + t + 1) / a.ratio), k = a.topk < nb ? a.topk : nb;
    if (tiitg == 0) rg_row<int>(n_sel, a.n_sel, 0)[row] = k;
    device int* out = rg_row<int>(sel, a.sel, row);
    if (k == nb) {  // the whole threadgroup
        for (int j = int(tiitg); j < k; j += int(ntg)) out[j] = j;
        return;
    }
    device const float* sc = scores + t * a.nb_stride;
    threadgroup atomic_uint* hist = (threadgroup atomic_uint*)shmem;
    threadgroup uint* tot = (threadgroup uint*)(shmem + 256 * 4);
    threadgroup uint* pick = tot + 8;
    const uint n_sg = ntg / 32;

    // The k-th largest key, 8 bits at a time from the top: among the keys that match the digits chosen so
    // far, the bin where the count from the largest reaches the number still wanted.
    uint prefix = 0, mask = 0;
    uint krem = uint(k);
    for (int pass = 0; pass < 4; ++pass) {
        const uint shift = uint(24 - 8 * pass);
        atomic_store_explicit(&hist[tiitg], 0u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int b = int(tiitg); b < nb; b += int(ntg)) {
            const uint key = rg_score_key(sc[b]);
            if ((key & mask) == prefix)
                atomic_fetch_add_explicit(&hist[(key >> shift) & 255u], 1u, memory_order_relaxed);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        const uint c = atomic_load_explicit(&hist[255u - tiitg], memory_order_relaxed);  // bins from the top
        const uint incl = simd_prefix_inclusive_sum(c);
        if (tiisg == 31) tot[sgitg] = incl;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        uint before = 0;
        for (uint s = 0; s < sgitg; ++s) before += tot[s];
        if (before + incl - c < krem && krem <= before + incl) {  // exactly one bin
            pick[0] = 255u - tiitg;
            pick[1] = krem - (before + incl - c);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        prefix |= pick[0] << shift;
        mask |= 255u << shift;
        krem = pick[1];
    }

    // Every block above it, then the first krem equal to it, at their rank in block order: the blocks before
    // them above it and (up to krem) equal to it, counted by prefix sums (above in the low 16 bits, equal in
    // the high 16).
    uint base_gt = 0, base_eq = 0;
    for (int b0 = 0; b0 < nb; b0 += int(ntg)) {
        const int b = b0 + int(tiitg);
        const uint key = b < nb ? rg_score_key(sc[b]) : 0u;
        const bool gt = b < nb && key > prefix, eq = b < nb && key == prefix;
        const uint v = (gt ? 1u : 0u) | (eq ? 0x10000u : 0u);
        const uint excl = simd_prefix_exclusive_sum(v), sg_total = simd_sum(v);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (tiisg == 0) tot[sgitg] = sg_total;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        uint before = 0, all = 0;
        for (uint s = 0; s < n_sg; ++s) {
            if (s < sgitg) before += tot[s];
            all += tot[s];
        }
        const uint n_gt = base_gt + ((before + excl) & 0xffffu), n_eq = base_eq + ((before + excl) >> 16);
        if (gt) out[n_gt + (n_eq < krem ? n_eq : krem)] = b;
        if (eq && n_eq < krem) out[n_gt + n_eq] = b;
        base_gt += all & 0xffffu;
        base_eq += all >> 16;
    }
}
RG_KERNEL(rg_qsa_topk)

// Threadgroup (x: (token * n_head_kv + kv head) * head tiles + head tile, y: split). Threadgroup memory
// (host: qsa.cpp): q [8][head_dim], S^T [32][8], P^T [32][8] floats, the chunk's cache indices [2][32]
// (double-buffered), the heads' max, sum, compensation, rescale [4][8].
kernel void rg_qsa_attend(constant RgQsaAttendArgs& a [[buffer(0)]], device const char* q [[buffer(1)]],
                          device const char* gate [[buffer(2)]], device const char* sel [[buffer(3)]],
                          device const char* n_sel [[buffer(4)]], device const char* kc [[buffer(5)]],
                          device const char* vc [[buffer(6)]], device char* out [[buffer(7)]],
                          device float* part [[buffer(8)]], device const char* k_scale [[buffer(9)]],
                          device const char* v_scale [[buffer(10)]], RG_THREAD_IDS) {
    const int D = a.head_dim, H = a.n_head, KV = a.n_head_kv, G = H / KV, R = a.ratio, n_split = a.n_split;
    const int htiles = (G + kQsaRows - 1) / kQsaRows;
    const int64_t t = tgpig.x / uint(KV * htiles);
    const int g = int(tgpig.x / uint(htiles)) % KV, h0 = g * G + int(tgpig.x % uint(htiles)) * kQsaRows;
    const int nr = g * G + G - h0 < kQsaRows ? g * G + G - h0 : int(kQsaRows), split = int(tgpig.y);

    // The query's keys: the selected blocks' tokens, then the tail [tail0, i]; this split's part of them.
    const int64_t row = a.t0 + t, i_pos = a.n0 + t, tail0 = (i_pos + 1) / R * R;
    const int64_t n_blk_keys = int64_t(rg_row<int>(n_sel, a.n_sel, 0)[row]) * R;
    const int64_t n_keys = n_blk_keys + (i_pos + 1 - tail0);
    device const int* blocks = rg_row<int>(sel, a.sel, row);
    const int64_t per = ((n_keys + n_split - 1) / n_split + kQsaChunk - 1) / kQsaChunk * kQsaChunk;
    const int64_t kb = split * per, ke = kb + per < n_keys ? kb + per : n_keys;

    threadgroup float* qs = (threadgroup float*)shmem;                      // [8][D]
    threadgroup float* st = qs + kQsaRows * D;                              // [32][8]
    threadgroup float* pt = st + kQsaChunk * kQsaRows;                      // [32][8]
    threadgroup int* kidx = (threadgroup int*)(pt + kQsaChunk * kQsaRows);  // [2][32]
    threadgroup float* ms = (threadgroup float*)(kidx + 2 * kQsaChunk);     // [8]
    threadgroup float* ls = ms + kQsaRows;                                  // [8]
    threadgroup float* cs = ls + kQsaRows;                                  // [8] Kahan compensation of ls
    threadgroup float* al = cs + kQsaRows;                                  // [8]

    for (int i = int(tiitg); i < kQsaRows * D; i += int(ntg)) {
        const int r = i / D, e = i % D;
        qs[i] = r < nr ? rg_row<float>(q, a.q, row * H + h0 + r)[e] : 0.0f;
    }
    if (tiitg < kQsaRows) ms[tiitg] = -INFINITY, ls[tiitg] = 0.0f, cs[tiitg] = 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const int u = int(tiisg) % 8, rr = int(tiitg) / 16, jj = int(tiitg) % 16;
    float acc[kQsaRows][kQsaMaxE];
    for (int r = 0; r < kQsaRows; ++r)
        for (int m = 0; m < kQsaMaxE; ++m) acc[r][m] = 0.0f;

    for (int64_t c0 = kb; c0 < ke; c0 += kQsaChunk) {
        threadgroup int* ci = kidx + (((c0 - kb) / kQsaChunk) & 1) * kQsaChunk;
        // scores: key kk by the 8 lanes of slot tiisg / 8, lane u summing elements u, u + 8, ...
        for (int pass = 0; pass < 2; ++pass) {
            const int kk = int(sgitg) * 8 + pass * 4 + int(tiisg) / 8;
            const int j = int(c0) + kk, nbk = int(n_blk_keys);  // a query's keys and cache indices fit an int
            const bool valid = j < ke;
            const int idx = !valid ? 0 : j < nbk ? blocks[j / R] * R + j % R : int(tail0) + (j - nbk);
            float d[kQsaRows];
            for (int r = 0; r < kQsaRows; ++r) d[r] = 0.0f;
            if (valid) {
                const RgCacheRow kr = rg_cache_row(kc, a.k, k_scale, a.k_scale, int64_t(idx) * KV + g);
                for (int e = u; e < D; e += 8) {
                    const float x = rg_cache_at(kr, e);
                    for (int r = 0; r < kQsaRows; ++r) d[r] += qs[r * D + e] * x;
                }
            }
            for (int r = 0; r < kQsaRows; ++r) {
                d[r] += simd_shuffle_xor(d[r], ushort(4));
                d[r] += simd_shuffle_xor(d[r], ushort(2));
                d[r] += simd_shuffle_xor(d[r], ushort(1));
            }
            if (u == 0) {
                for (int r = 0; r < kQsaRows; ++r) st[kk * kQsaRows + r] = d[r];
                ci[kk] = idx;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // softmax: head rr, keys jj and jj + 16 (the head's 16 lanes are half a SIMD-group)
        float sc[2];
        float cmax = -INFINITY;
        for (int v = 0; v < 2; ++v) {
            const int kk = jj + 16 * v;
            sc[v] = c0 + kk < ke ? st[kk * kQsaRows + rr] * a.scale : -INFINITY;
            cmax = max(cmax, sc[v]);
        }
        for (ushort m = 8; m > 0; m >>= 1) cmax = max(cmax, simd_shuffle_xor(cmax, m));
        const float m_old = ms[rr], m_new = max(m_old, cmax);
        float psum = 0.0f;
        for (int v = 0; v < 2; ++v) {
            const float p = sc[v] == -INFINITY ? 0.0f : exp(sc[v] - m_new);
            pt[(jj + 16 * v) * kQsaRows + rr] = p;
            psum += p;
        }
        for (ushort m = 8; m > 0; m >>= 1) psum += simd_shuffle_xor(psum, m);
        if (jj == 0) {
            const float alpha = m_old == -INFINITY ? 0.0f : exp(m_old - m_new);
            const float l = ls[rr] * alpha, c = cs[rr] * alpha;
            const float y = psum - c, tt = l + y;
            cs[rr] = (tt - l) - y;
            ls[rr] = tt;
            ms[rr] = m_new;
            al[rr] = alpha;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // values: lanes over head_dim, the 8 heads' sums rescaled, then this chunk's keys added
        for (int r = 0; r < kQsaRows; ++r) {
            const float alpha = al[r];
            for (int m = 0; m < kQsaMaxE; ++m) acc[r][m] *= alpha;
        }
        const int nk = ke - c0 < kQsaChunk ? int(ke - c0) : int(kQsaChunk);
        for (int kk = 0; kk < nk; ++kk) {
            const RgCacheRow vr = rg_cache_row(vc, a.v, v_scale, a.v_scale, int64_t(ci[kk]) * KV + g);
            float p[kQsaRows];
            for (int r = 0; r < kQsaRows; ++r) p[r] = pt[kk * kQsaRows + r];
            for (int m = 0; m < kQsaMaxE; ++m) {
                const int e = int(sgitg) * 32 + int(tiisg) + 128 * m;
                if (e >= D) break;
                const float x = rg_cache_at(vr, e);
                for (int r = 0; r < kQsaRows; ++r) acc[r][m] += p[r] * x;
            }
        }
    }

    // out = sigmoid(gate) * O / l (one split), or this split's (m, l, O) for rg_attention_merge
    for (int m = 0; m < kQsaMaxE; ++m) {
        const int e = int(sgitg) * 32 + int(tiisg) + 128 * m;
        if (e >= D) break;
        for (int r = 0; r < nr; ++r) {
            const int64_t o = row * H + h0 + r;
            if (n_split == 1) {
                rg_row<float>(out, a.out, o)[e] =
                    acc[r][m] / ls[r] * rg_sigmoid(rg_row<float>(gate, a.gate, o)[e]);
            } else {
                part[((t * H + h0 + r) * n_split + split) * (D + 2) + 2 + e] = acc[r][m];
            }
        }
    }
    if (n_split > 1 && int(tiitg) < nr) {
        device float* p = part + ((t * H + h0 + int(tiitg)) * n_split + split) * (D + 2);
        p[0] = ms[tiitg], p[1] = ls[tiitg];
    }
}
RG_KERNEL(rg_qsa_attend)
