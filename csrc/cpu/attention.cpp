// Causal grouped-query attention over a dense KV cache (model/causal_attention.h): appending keys and
// values (rounded to f16 for an F16 cache, quantized per row for Q8_0 / I8), then per kv head the q·K and p·V
// products as matmuls over views of the cache (a Q8_0 / I8 cache: over f32 tiles of its dequantized rows),
// the mask, softmax and sliding window applied by position in between.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "cpu/kernels.h"

namespace regolith::cpu {

namespace {

// Queries per block of one attention pass: bounds the score matrix ([block * group][keys]) and the keys
// computed past a query's own position (at most block - 1).
constexpr int64_t kQueryBlock = 32;
// Softmax work (rows x keys) below which the pool's hand-off costs more than it saves.
constexpr int64_t kParallelSoftmax = 1 << 14;
// Key ranges start and end at multiples of this many positions (the cache capacity is one too), so the
// float dot products (periodic in at most 16 lanes, see Backend::matmul) sum a query's terms in the same
// lanes and order however the keys were split into calls: one-shot, chunked and token-by-token evaluation
// give bit-identical results. Keys outside a query's range get probability 0.
constexpr int64_t kKeyAlign = 16;

int64_t align_up(int64_t n) { return (n + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }

// fp16_to_fp32(fp32_to_fp16(x)) with few branches (equal for every float, checked exhaustively): overflow
// to inf, f16 subnormals rounded to a multiple of 2^-24 by adding and removing 0.75 (whose float ulp that
// is), normal values by rounding away the 13 low mantissa bits to nearest even.
float round_f16(float x) {
    uint32_t u = f32_bits(x);
    const uint32_t ax = u & 0x7fffffffu;
    if (ax >= 0x477ff000u) return ax > 0x7f800000u ? x : std::copysign(INFINITY, x);  // NaN stays NaN
    if (ax < 0x38800000u) return std::copysign((std::fabs(x) + 0.75f) - 0.75f, x);
    u = (u + 0x0fffu + ((u >> 13) & 1u)) & 0xffffe000u;
    return f32_from_bits(u);
}

}  // namespace

void kv_append(const Rows& k, const Rows& v, const std::vector<KvSeqRows>& seqs, int64_t n_head_kv) {
    const int64_t KV = n_head_kv, D = k.cols / KV;
    for (const KvSeqRows& s : seqs) {
        const int64_t cap = s.k.rows / KV;
        if (s.v) {  // Q8_0 / I8: key and value rows
            for (int64_t t = 0; t < s.ntok; ++t)
                for (int64_t h = 0; h < KV; ++h) {
                    store_row(k.row(s.t0 + t) + h * D, s.k, s.k_scale, h * cap + s.n0 + t);
                    store_row(v.row(s.t0 + t) + h * D, s.v, s.v_scale, h * cap + s.n0 + t);
                }
            continue;
        }
        const bool f16 = s.k.type == RG_TYPE_F16;
        for (int64_t t = 0; t < s.ntok; ++t) {
            const int64_t i = s.n0 + t;
            for (int64_t h = 0; h < KV; ++h) {
                const float* kr = k.row(s.t0 + t) + h * D;
                const float* vr = v.row(s.t0 + t) + h * D;
                if (f16) {
                    uint16_t* kd = s.k.row<uint16_t>(h * cap + i);
                    for (int64_t e = 0; e < D; ++e) kd[e] = fp32_to_fp16(kr[e]);
                    for (int64_t e = 0; e < D; ++e) s.vt.row<uint16_t>(h * D + e)[i] = fp32_to_fp16(vr[e]);
                } else {
                    std::memcpy(s.k.row(h * cap + i), kr, size_t(D) * sizeof(float));
                    for (int64_t e = 0; e < D; ++e) s.vt.row(h * D + e)[i] = vr[e];
                }
            }
        }
    }
}

void attention(const Rows& q, const std::vector<KvSeqRows>& seqs, const AttentionShape& s, const Rows& sinks,
               const Rows& out) {
    const int64_t H = s.n_head, KV = s.n_head_kv, D = s.head_dim, group = H / KV;
    for (const KvSeqRows& seq : seqs) {
        const int64_t ntok = seq.ntok, n0 = seq.n0, cap = seq.k.rows / KV;
        const bool f16 = seq.k.type == RG_TYPE_F16, rows_cache = bool(seq.v);
        const int64_t elt = f16 ? 2 : 4;
        const int64_t max_rows = std::min(ntok, kQueryBlock) * group;
        std::vector<float> qg(size_t(max_rows * D));   // [rows][D] one kv head's queries, token-major
        std::vector<float> heads(size_t(max_rows * D));  // [rows][D]
        std::vector<float> p;                          // [rows][keys] scores, then probabilities
        std::vector<float> kt, vtt, vrow;  // Q8_0 / I8: keys [keys][D], values [D][keys], a value row, in f32
        for (int64_t t0 = 0; t0 < ntok; t0 += kQueryBlock) {
            const int64_t t1 = std::min(ntok, t0 + kQueryBlock), rows = (t1 - t0) * group;
            // keys any query of the block may see, from the first query's window start to the last query,
            // widened to aligned positions
            const int64_t first = s.window > 0 ? std::max<int64_t>(0, n0 + t0 - s.window + 1) : 0;
            const int64_t lo = first / kKeyAlign * kKeyAlign, hi = align_up(n0 + t1);
            const int64_t nk = hi - lo;
            p.resize(size_t(rows * nk));
            for (int64_t g = 0; g < KV; ++g) {
                for (int64_t t = t0; t < t1; ++t) {
                    const float* src = q.row(seq.t0 + t) + g * group * D;
                    float* dst = &qg[size_t((t - t0) * group * D)];
                    for (int64_t i = 0; i < group * D; ++i) dst[i] = f16 ? round_f16(src[i]) : src[i];
                }
                WeightView keys, values;
                if (rows_cache) {  // rows [lo, hi) dequantized: the F32 products over the values they hold
                    kt.resize(size_t(nk * D)), vtt.resize(size_t(nk * D)), vrow.resize(size_t(D));
                    for (int64_t j = 0; j < nk; ++j) {
                        cache_row(seq.k, seq.k_scale, g * cap + lo + j, &kt[size_t(j * D)]);
                        cache_row(seq.v, seq.v_scale, g * cap + lo + j, vrow.data());
                        for (int64_t e = 0; e < D; ++e) vtt[size_t(e * nk + j)] = vrow[size_t(e)];
                    }
                    keys = {RG_TYPE_F32, kt.data(), nk, D, D * 4};
                    values = {RG_TYPE_F32, vtt.data(), D, nk, nk * 4};
                } else {
                    keys = {seq.k.type, seq.k.row<uint8_t>(g * cap + lo), nk, D, D * elt};
                    values = {seq.vt.type, seq.vt.row<uint8_t>(g * D) + lo * elt, D, nk, seq.vt.stride};
                }
                matmul(keys, qg.data(), rows, p.data());

                const auto softmax_rows = [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                        const int64_t pos = n0 + t0 + r / group;
                        // visible keys [a, b] relative to lo; everything else gets probability 0
                        const int64_t a = (s.window > 0 ? std::max(lo, pos - s.window + 1) : lo) - lo, b = pos - lo;
                        float* row = &p[size_t(r * nk)];
                        // the head's sink logit joins the max and the sum, its probability dropped
                        const float sink = sinks ? sinks.row(0)[g * group + r % group] : -INFINITY;
                        float mx = sink;
                        for (int64_t j = a; j <= b; ++j) {
                            row[j] *= s.scale;
                            mx = row[j] > mx ? row[j] : mx;
                        }
                        double sum = sinks ? double(std::exp(sink - mx)) : 0.0;
                        for (int64_t j = a; j <= b; ++j) {
                            row[j] = std::exp(row[j] - mx);
                            sum += row[j];
                        }
                        const float inv = float(1.0 / sum);
                        std::fill(row, row + a, 0.0f);
                        if (f16)
                            for (int64_t j = a; j <= b; ++j) row[j] = round_f16(row[j] * inv);
                        else
                            for (int64_t j = a; j <= b; ++j) row[j] *= inv;
                        std::fill(row + b + 1, row + nk, 0.0f);
                    }
                };
                if (rows * nk >= kParallelSoftmax)
                    default_pool()->parallel_for(rows, 1, softmax_rows);
                else
                    softmax_rows(0, rows);

                matmul(values, p.data(), rows, heads.data());
                for (int64_t t = t0; t < t1; ++t)
                    std::memcpy(out.row(seq.t0 + t) + g * group * D, &heads[size_t((t - t0) * group * D)],
                                size_t(group * D) * sizeof(float));
            }
        }
    }
}

}  // namespace regolith::cpu
