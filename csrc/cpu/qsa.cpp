// QSA sparse attention (model/qsa_attention.h has the semantics): pooling the keys of completed blocks,
// per-query block selection by the indexer, and gated attention over the selected blocks and the tail. The
// caches are read as f32 rows (cache_row: in place for F32, dequantized otherwise).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/kernels.h"
#include "cpu/nn.h"

namespace regolith::cpu {

void qsa_pool(const std::vector<QsaSeqRows>& seqs, const Rows& norm, const Rows& freq, const Rows& axis,
              const QsaDims& d) {
    const int64_t r = d.ratio, ID = d.index_head_dim, half = d.n_rot / 2;
    const float* f = freq.row(0);
    const int32_t* ax = axis.row<int32_t>(0);
    std::vector<float> mean(static_cast<size_t>(ID)), bk(mean.size()), buf(mean.size());  // [ID]
    for (const QsaSeqRows& s : seqs) {
        const int64_t n1 = s.n0 + s.ntok;
        // mean of the block's raw keys -> norm -> rotated at the position of the block's first token
        for (int64_t b = s.n0 / r; b < n1 / r; ++b) {
            std::fill(mean.begin(), mean.end(), 0.0f);
            for (int64_t j = b * r; j < (b + 1) * r; ++j) {
                const float* kj = cache_row(s.index_k, s.index_k_scale, j, buf.data());
                for (int64_t i = 0; i < ID; ++i) mean[size_t(i)] += kj[i];
            }
            for (int64_t i = 0; i < ID; ++i) mean[size_t(i)] /= float(r);
            nn::rms_norm(mean.data(), ID, norm.row(0), d.eps, bk.data());
            const int64_t* pos = s.pos.row<int64_t>(b * r);
            for (int64_t i = 0; i < half; ++i) {
                const float angle = float(pos[ax[i]]) * f[i];
                const float c = std::cos(angle), sn = std::sin(angle);
                const float a = bk[size_t(i)], bb = bk[size_t(i + half)];
                bk[size_t(i)] = a * c - bb * sn;
                bk[size_t(i + half)] = bb * c + a * sn;
            }
            store_row(bk.data(), s.block_k, s.block_k_scale, b);
        }
    }
}

void qsa_select(const Rows& iq, const std::vector<QsaSeqRows>& seqs, const QsaDims& d, const Rows& sel,
                const Rows& n_sel) {
    const int64_t r = d.ratio, topk = d.topk, IH = d.index_n_head, ID = d.index_head_dim;
    const float index_scale = 1.0f / std::sqrt(float(ID));
    int32_t* nsel = n_sel.row<int32_t>(0);
    for (const QsaSeqRows& s : seqs) {
        default_pool()->parallel_for(s.ntok, 1, [&](int64_t t0, int64_t t1) {
            std::vector<float> score;    // [nb]
            std::vector<int32_t> order;  // [nb]
            std::vector<float> buf(static_cast<size_t>(ID));
            for (int64_t t = t0; t < t1; ++t) {
                const int64_t row = s.t0 + t, nb = (s.n0 + t + 1) / r, k = std::min(topk, nb);
                nsel[row] = int32_t(k);
                if (k == 0) continue;
                int32_t* out = sel.row<int32_t>(row);
                if (k == nb) {
                    std::iota(out, out + k, 0);
                    continue;
                }
                score.resize(size_t(nb));
                const float* iqt = iq.row(row);
                for (int64_t b = 0; b < nb; ++b) {
                    const float* bk = cache_row(s.block_k, s.block_k_scale, b, buf.data());
                    float sum = 0.0f;
                    for (int64_t h = 0; h < IH; ++h) sum += std::max(nn::dot(iqt + h * ID, bk, ID), 0.0f);
                    score[size_t(b)] = sum * index_scale;
                }
                order.resize(size_t(nb));
                std::iota(order.begin(), order.end(), 0);
                std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
                    return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
                });
                std::copy(order.begin(), order.begin() + k, out);
                std::sort(out, out + k);
            }
        });
    }
}

void qsa_attend(const Rows& q, const Rows& gate, const Rows& sel, const Rows& n_sel,
                const std::vector<QsaSeqRows>& seqs, const QsaDims& d, const Rows& out) {
    const int64_t H = d.n_head, KV = d.n_head_kv, D = d.head_dim, r = d.ratio, group = H / KV;
    const float scale = 1.0f / std::sqrt(float(D));
    const int32_t* nsel = n_sel.row<int32_t>(0);
    for (const QsaSeqRows& s : seqs) {
        // per (query, head), over the selected blocks' tokens and the tail, gated by sigmoid(gate)
        default_pool()->parallel_for(s.ntok * H, 1, [&](int64_t p0, int64_t p1) {
            std::vector<int64_t> idx;  // [n_keys] cache indices attended
            std::vector<float> w;      // [n_keys]
            std::vector<float> buf(static_cast<size_t>(D));
            for (int64_t p = p0; p < p1; ++p) {
                const int64_t t = p / H, h = p % H, row = s.t0 + t, i = s.n0 + t, kvh = h / group;
                idx.clear();
                const int32_t* blocks = sel.row<int32_t>(row);
                for (int64_t j = 0; j < nsel[row]; ++j)
                    for (int64_t c = blocks[j] * r; c < (blocks[j] + 1) * r; ++c) idx.push_back(c);
                for (int64_t c = (i + 1) / r * r; c <= i; ++c) idx.push_back(c);

                const float* qh = q.row(row * H + h);
                w.resize(idx.size());
                for (size_t j = 0; j < idx.size(); ++j)
                    w[j] = nn::dot(qh, cache_row(s.k, s.k_scale, idx[j] * KV + kvh, buf.data()), D) * scale;
                nn::softmax(w.data(), int64_t(w.size()));
                float* o = out.row(row * H + h);
                std::fill(o, o + D, 0.0f);
                for (size_t j = 0; j < idx.size(); ++j) {
                    const float* vj = cache_row(s.v, s.v_scale, idx[j] * KV + kvh, buf.data());
                    const float pj = w[j];
                    for (int64_t e = 0; e < D; ++e) o[e] += pj * vj[e];
                }
                const float* g = gate.row(row * H + h);
                for (int64_t e = 0; e < D; ++e) o[e] *= nn::sigmoid(g[e]);
            }
        });
    }
}

}  // namespace regolith::cpu
