// Mixture of experts (Backend::moe_route, moe_experts, moe_combine); the experts' products are matmul.metal's
// rg_moe_matmul_<type> kernels.
//
// rg_moe_route: one SIMD-group per token (routers have a few hundred experts: a lane per 32nd expert, the
//   softmax and each of the k argmax passes reduced by shuffles). The CPU sums the softmax in double: here
//   each lane sums its experts with the rounding error kept (two-sum), the lanes' pairs are added exactly the
//   same way, and 1 / sum gets a Newton step from the low part, so the probabilities are the CPU's (its
//   float(1 / sum) of a double sum) but for sums within ~2^-45 of a rounding boundary. Ties go to the lower
//   id.
// rg_moe_group: one threadgroup of 256 threads groups the ntok * k routing pairs by expert without atomics:
//   thread i owns a run of experts, counts their pairs over the ids staged 1,024 at a time, the runs' counts
//   are scanned (SIMD prefix sums), and each thread writes its experts' pairs in pair order (token order),
//   so the grouping is the same on every run. The pairs are few (k per token) and the work is a scan of
//   the ids per pass.
// rg_moe_swiglu: out = silu(g) * u, threadgroups striding over a row's columns.
// rg_moe_combine: a threadgroup per (token, 1,024 columns): its threads find the token's k rows among the
//   pairs, thread 0 orders them by row, then each thread sums its columns over them in that order (the
//   CPU's order, and the order moe_experts' rows are grouped in: ascending expert ids).
#include "compat.h"

#include "args.h"
#include "common.h"

// ---- routing ----------------------------------------------------------------------------------------------

inline bool rg_moe_better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// s + e = a + b exactly (s the rounded sum).
inline void rg_moe_two_sum(float a, float b, thread float& s, thread float& e) {
    s = a + b;
    const float bb = s - a;
    e = (a - (s - bb)) + (b - bb);
}

// Threadgroups of 32 threads, one per token. Threadgroup memory: p, score [n_expert] floats, chosen [k]
// ints, taken [n_expert] bytes (expert e's flag is read and written only by lane e % 32).
kernel void rg_moe_route(constant RgMoeRouteArgs& a [[buffer(0)]], device const char* logits [[buffer(1)]],
                         device const char* resident [[buffer(2)]], device char* ids [[buffer(3)]],
                         device char* weights [[buffer(4)]], RG_THREAD_IDS) {
    const int64_t t = tgpig.x;
    const int ne = int(a.logits.cols), k = int(a.k), lane = int(tiisg);
    device const float* l = rg_row<float>(logits, a.logits, t);
    threadgroup float* p = (threadgroup float*)shmem;
    threadgroup float* score = p + ne;
    threadgroup int* chosen = (threadgroup int*)(score + ne);
    threadgroup uchar* taken = (threadgroup uchar*)(chosen + k);
    float mx = -INFINITY;
    for (int e = lane; e < ne; e += 32) mx = fmax(mx, l[e]);
    mx = simd_max(mx);
    float hi = 0.0f, lo = 0.0f;  // this lane's sum, then the SIMD-group's: hi + lo exactly
    for (int e = lane; e < ne; e += 32) {
        const float v = exp(l[e] - mx);
        p[e] = v;
        float s, err;
        rg_moe_two_sum(hi, v, s, err);
        hi = s;
        lo += err;
    }
    for (ushort o = 16; o > 0; o >>= 1) {  // every lane ends with the same hi, lo
        const float ohi = simd_shuffle_xor(hi, o), olo = simd_shuffle_xor(lo, o);
        float s, err;
        rg_moe_two_sum(hi, ohi, s, err);
        hi = s;
        lo = (lo + olo) + err;
    }
    {
        float s, err;
        rg_moe_two_sum(hi, lo, s, err);
        hi = s;
        lo = err;
    }
    const float r = 1.0f / hi;
    const float inv = fma(r, fma(-r, hi, 1.0f) - r * lo, r);  // 1 / (hi + lo), rounded once
    for (int e = lane; e < ne; e += 32) {
        p[e] = p[e] * inv;
        score[e] = l[e] + (a.has_resident && resident[e] ? a.bonus : 0.0f);
        taken[e] = 0;
    }
    const int keep = int(a.keep);
    for (int j = 0; j < k; ++j) {
        threadgroup const float* v = j < keep ? p : score;
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < ne; e += 32)
            if (!taken[e] && rg_moe_better(v[e], e, bv, bi)) bv = v[e], bi = e;
        for (ushort o = 16; o > 0; o >>= 1) {
            const float ov = simd_shuffle_xor(bv, o);
            const int oi = simd_shuffle_xor(bi, o);
            if (rg_moe_better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (bi < ne && bi % 32 == lane) taken[bi] = 1;
        if (lane == 0) chosen[j] = bi < ne ? bi : 0;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lane == 0) {
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += p[chosen[j]];
        device int* id = rg_row<int>(ids, a.ids, t);
        device float* w = rg_row<float>(weights, a.weights, t);
        for (int j = 0; j < k; ++j) {
            const float pj = p[chosen[j]];
            id[j] = chosen[j];
            w[j] = a.norm_topk ? pj / sum : pj;
        }
    }
}
RG_KERNEL(rg_moe_route)

// ---- grouping ---------------------------------------------------------------------------------------------

#define RG_MOE_GROUP_CHUNK 1024

// One threadgroup (ntg <= 256). groups: offset [n_expert + 1], active [1 + n_expert], order [pairs] (pairs
// past offset[n_expert], those with an id outside [0, n_expert), are -1). Threadgroup memory: the staged ids
// [RG_MOE_GROUP_CHUNK], counts [n_expert], SIMD-group totals [16].
kernel void rg_moe_group(constant RgMoeGroupArgs& a [[buffer(0)]], device const char* ids [[buffer(1)]],
                         device int* groups [[buffer(2)]], RG_THREAD_IDS) {
    const int ne = int(a.n_expert), k = int(a.ids.cols);
    const int64_t pairs = a.ids.rows * k;
    device int* offset = groups;
    device int* active = groups + ne + 1;
    device int* order = groups + 2 * (ne + 1);
    threadgroup int* chunk = (threadgroup int*)shmem;
    threadgroup int* cnt = chunk + RG_MOE_GROUP_CHUNK;
    threadgroup int* part = cnt + ne;
    const int run = (ne + int(ntg) - 1) / int(ntg), e0 = int(tiitg) * run, e1 = min(ne, e0 + run);
    for (int e = e0; e < e1; ++e) cnt[e] = 0;
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) {
            // offsets: an exclusive scan of the runs' counts (runs in thread order)
            int sum = 0, used = 0;
            for (int e = e0; e < e1; ++e) sum += cnt[e], used += cnt[e] > 0 ? 1 : 0;
            int base = simd_prefix_exclusive_sum(sum), ubase = simd_prefix_exclusive_sum(used);
            const int st = simd_sum(sum), ut = simd_sum(used);
            if (tiisg == 0) part[sgitg] = st, part[8 + sgitg] = ut;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            int total = 0, utotal = 0;
            for (uint s = 0; s < ntg / 32; ++s) {
                if (s < sgitg) base += part[s], ubase += part[8 + s];
                total += part[s], utotal += part[8 + s];
            }
            for (int e = e0; e < e1; ++e) {
                const int c = cnt[e];
                offset[e] = base;
                if (c > 0) active[1 + ubase++] = e;
                cnt[e] = base;  // now the expert's cursor
                base += c;
            }
            if (tiitg == 0) offset[ne] = total, active[0] = utotal;
            for (int64_t i = total + tiitg; i < pairs; i += ntg) order[i] = -1;
        }
        for (int64_t c0 = 0; c0 < pairs; c0 += RG_MOE_GROUP_CHUNK) {
            const int n = int(min(int64_t(RG_MOE_GROUP_CHUNK), pairs - c0));
            threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous chunk's readers are done
            for (int i = int(tiitg); i < n; i += int(ntg)) {
                const int64_t p = c0 + i;
                chunk[i] = rg_row<int>(ids, a.ids, p / k)[p % k];
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            for (int i = 0; i < n; ++i) {
                const int e = chunk[i];
                if (e < e0 || e >= e1) continue;
                if (pass == 0)
                    ++cnt[e];
                else
                    order[cnt[e]++] = int(c0 + i);
            }
        }
    }
}
RG_KERNEL(rg_moe_group)

// ---- SwiGLU and the weighted sum --------------------------------------------------------------------------

// Threadgroup (x, r) takes every tgpg.x-th stretch of ntg columns of row r.
kernel void rg_moe_swiglu(constant RgMoeSwigluArgs& a [[buffer(0)]], device const char* g [[buffer(1)]],
                          device const char* u [[buffer(2)]], device char* out [[buffer(3)]],
                          device const int* order [[buffer(4)]], device const char* ids [[buffer(5)]],
                          device const char* gate_bias [[buffer(6)]], device const char* up_bias [[buffer(7)]],
                          RG_THREAD_IDS) {
    const int64_t r = tgpig.y;
    device const float* gr = rg_row<float>(g, a.g, r);
    device const float* ur = rg_row<float>(u, a.u, r);
    device float* o = rg_row<float>(out, a.out, r);
    device const float* gb = nullptr;
    device const float* ub = nullptr;
    if (a.has_bias) {
        const int64_t p = order[r], k = a.k;
        const int64_t e = rg_row<int>(ids, a.ids, p / k)[p % k];
        gb = rg_row<float>(gate_bias, a.gate_bias, e), ub = rg_row<float>(up_bias, a.up_bias, e);
    }
    for (int64_t i = int64_t(tgpig.x) * ntg + tiitg; i < a.g.cols; i += int64_t(tgpg.x) * ntg) {
        const float gv = gb ? gr[i] + gb[i] : gr[i], uv = ub ? ur[i] + ub[i] : ur[i];
        o[i] = a.act == 1 ? rg_swiglu_oai(gv, uv) : rg_silu(gv) * uv;
    }
}
RG_KERNEL(rg_moe_swiglu)

// Threadgroup (t, x): token t, columns x * ntg + tiitg, + tgpg.y * ntg, ... Threadgroup memory: the row of
// each of the token's pairs [k] (-1: none), then the found rows in row order [k] and their j [k], and their
// count. Each pair is listed at most once (as the core packs them and rg_moe_group groups them).
kernel void rg_moe_combine(constant RgMoeCombineArgs& a [[buffer(0)]], device const char* ys [[buffer(1)]],
                           device const int* pairs [[buffer(2)]], device const char* weights [[buffer(3)]],
                           device const char* shared [[buffer(4)]],
                           device const char* shared_gate [[buffer(5)]], device char* y [[buffer(6)]],
                           device const char* ids [[buffer(7)]], device const char* down_bias [[buffer(8)]],
                           RG_THREAD_IDS) {
    const int64_t t = tgpig.x;
    const int k = int(a.k);
    threadgroup int* row = (threadgroup int*)shmem;
    threadgroup int* sorted_row = row + k;
    threadgroup int* sorted_j = row + 2 * k;
    threadgroup int* n_found = row + 3 * k;
    for (int j = int(tiitg); j < k; j += int(ntg)) row[j] = -1;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int64_t first = t * k;
    for (int64_t i = tiitg; i < int64_t(a.n_rows); i += ntg) {
        const int64_t p = pairs[i];
        if (p >= first && p < first + k) row[p - first] = int(i);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tiitg == 0) {  // insertion by row
        int n = 0;
        for (int j = 0; j < k; ++j) {
            const int rj = row[j];
            if (rj < 0) continue;
            int m = n++;
            for (; m > 0 && sorted_row[m - 1] > rj; --m)
                sorted_row[m] = sorted_row[m - 1], sorted_j[m] = sorted_j[m - 1];
            sorted_row[m] = rj, sorted_j[m] = j;
        }
        n_found[0] = n;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int n = n_found[0];
    device const float* wt = rg_row<float>(weights, a.weights, t);
    device float* yt = rg_row<float>(y, a.y, t);
    const float gate = a.has_shared ? rg_sigmoid(rg_row<float>(shared_gate, a.shared_gate, t)[0]) : 0.0f;
    for (int64_t c = int64_t(tgpig.y) * ntg + tiitg; c < a.y.cols; c += int64_t(tgpg.y) * ntg) {
        float acc = 0.0f;
        for (int m = 0; m < n; ++m) {
            float v = rg_row<float>(ys, a.ys, sorted_row[m])[c];
            if (a.has_bias) v += rg_row<float>(down_bias, a.down_bias, rg_row<int>(ids, a.ids, t)[sorted_j[m]])[c];
            acc += wt[sorted_j[m]] * v;
        }
        if (a.has_shared) acc += gate * rg_row<float>(shared, a.shared, t)[c];
        yt[c] = acc;
    }
}
RG_KERNEL(rg_moe_combine)
