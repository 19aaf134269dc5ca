// Mixture-of-experts routing and combination (model/moe.h): softmax over the router logits, top-k with
// optional cache-aware (MoCE) selection, and the weighted sum of the experts' outputs in a fixed order.
#include <algorithm>
#include <numeric>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/nn.h"

namespace regolith::cpu {

void moe_route(const Rows& logits, const Rows& resident, const MoeRouting& rt, const Rows& ids, const Rows& weights) {
    const int64_t ne = logits.cols, k = rt.k;
    const int8_t* res = resident ? resident.row<int8_t>(0) : nullptr;
    std::vector<float> p(static_cast<size_t>(ne));
    std::vector<int32_t> order(static_cast<size_t>(ne));
    std::vector<float> score(static_cast<size_t>(ne));
    const int64_t keep = res ? std::clamp<int64_t>(rt.protect, 0, k) : k;
    const auto by = [](const float* s) {
        return [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
    };
    for (int64_t t = 0; t < logits.rows; ++t) {
        const float* l = logits.row(t);
        std::copy(l, l + ne, p.begin());
        nn::softmax(p.data(), ne);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + keep, order.end(), by(p.data()));
        if (keep < k) {
            // MoCE: the rest by logit plus the bonus of resident experts.
            for (int64_t e = 0; e < ne; ++e) score[size_t(e)] = l[e] + (res[e] ? rt.bonus : 0.0f);
            std::partial_sort(order.begin() + keep, order.begin() + k, order.end(), by(score.data()));
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += p[size_t(order[size_t(j)])];
        int32_t* id = ids.row<int32_t>(t);
        float* w = weights.row(t);
        for (int64_t j = 0; j < k; ++j) {
            const float pj = p[size_t(order[size_t(j)])];
            id[j] = order[size_t(j)];
            w[j] = rt.norm_topk ? pj / sum : pj;
        }
    }
}

void moe_combine(const Rows& ys, const Rows& pairs, const Rows& weights, const Rows& shared, const Rows& shared_gate,
                 const Rows& y) {
    const int64_t h = y.cols, k = weights.cols;
    for (int64_t t = 0; t < y.rows; ++t) std::fill(y.row(t), y.row(t) + h, 0.0f);
    const int32_t* pr = pairs.row<int32_t>(0);
    for (int64_t i = 0; i < pairs.cols; ++i) {
        const int64_t pair = pr[i];
        const float wgt = weights.row(pair / k)[pair % k];
        const float* src = ys.row(i);
        float* dst = y.row(pair / k);
        for (int64_t c = 0; c < h; ++c) dst[c] += wgt * src[c];
    }
    if (!shared) return;
    for (int64_t t = 0; t < y.rows; ++t) {
        const float gate = nn::sigmoid(shared_gate.row(t)[0]);
        const float* sh = shared.row(t);
        float* dst = y.row(t);
        for (int64_t c = 0; c < h; ++c) dst[c] += gate * sh[c];
    }
}

}  // namespace regolith::cpu
