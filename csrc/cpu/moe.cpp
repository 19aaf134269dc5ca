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

ExpertMatrix stacked_experts(const Rows& gate, const Rows& up, const Rows& down, int64_t n_expert) {
    return [gate, up, down, n_expert](int64_t e, int part) {
        const Rows& r = part == 0 ? gate : part == 1 ? up : down;
        const int64_t n = r.rows / n_expert;
        return WeightView{r.type, r.base + e * n * r.stride, n, r.cols, r.stride};
    };
}

// The resident experts of a layer, as model/moe.cpp ran them before they moved here: the tokens grouped by
// expert (ascending ids), every expert's gate and up in one batch, every down product (the shared one's
// too) in the next, then the sum in expert-id order.
void moe_experts(const Rows& x, const Rows& ids, const Rows& weights, const ExpertMatrix& expert, int64_t n_expert,
                 const ExpertAct& act, const SharedExpertRows* shared, const Rows& y) {
    const int64_t ntok = x.rows, h = x.cols, k = ids.cols, ff = expert(0, 0).rows;
    std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(n_expert));
    for (int64_t t = 0; t < ntok; ++t)
        for (int64_t j = 0; j < k; ++j) by_expert[size_t(ids.row<int32_t>(t)[j])].push_back(int32_t(t * k + j));
    std::vector<int64_t> active, offset, count;
    std::vector<int32_t> pairs;
    for (int64_t e = 0; e < n_expert; ++e) {
        if (by_expert[size_t(e)].empty()) continue;
        active.push_back(e);
        offset.push_back(int64_t(pairs.size()));
        count.push_back(int64_t(by_expert[size_t(e)].size()));
        pairs.insert(pairs.end(), by_expert[size_t(e)].begin(), by_expert[size_t(e)].end());
    }
    const int64_t rows = int64_t(pairs.size());
    thread_local std::vector<float> xs, g, u, ys, sh;
    xs.resize(size_t(rows * h)), g.resize(size_t(rows * ff)), u.resize(size_t(rows * ff)), ys.resize(size_t(rows * h));
    for (int64_t i = 0; i < rows; ++i) std::copy_n(x.row(pairs[size_t(i)] / k), h, &xs[size_t(i * h)]);

    std::vector<MatmulJob> jobs;
    for (size_t a = 0; a < active.size(); ++a) {
        const int64_t e = active[a], n = count[a], o = offset[a];
        jobs.push_back({expert(e, 0), &xs[size_t(o * h)], n, &g[size_t(o * ff)]});
        jobs.push_back({expert(e, 1), &xs[size_t(o * h)], n, &u[size_t(o * ff)]});
    }
    matmul_batch(jobs.data(), int64_t(jobs.size()));
    // expert e's bias row added to each of its rows (as Backend::add would), then act
    const auto add_bias = [&](std::vector<float>& z, const Rows& bias, int64_t n) {
        if (!bias) return;
        for (size_t a = 0; a < active.size(); ++a) {
            const float* b = bias.row(active[a]);
            for (int64_t r = offset[a]; r < offset[a] + count[a]; ++r)
                for (int64_t c = 0; c < n; ++c) z[size_t(r * n + c)] += b[c];
        }
    };
    add_bias(g, act.gate_bias, ff);
    add_bias(u, act.up_bias, ff);
    if (act.act == Glu::SwigluOai)
        for (size_t i = 0; i < g.size(); ++i) g[i] = nn::swiglu_oai(g[i], u[i]);
    else
        for (size_t i = 0; i < g.size(); ++i) g[i] = nn::silu(g[i]) * u[i];
    if (shared) {
        const int64_t fs = shared->gate.cols;
        for (int64_t t = 0; t < ntok; ++t) {
            float* sg = shared->gate.row(t);
            const float* su = shared->up.row(t);
            for (int64_t i = 0; i < fs; ++i) sg[i] = nn::silu(sg[i]) * su[i];
        }
    }
    jobs.clear();
    for (size_t a = 0; a < active.size(); ++a) {
        const int64_t e = active[a], n = count[a], o = offset[a];
        jobs.push_back({expert(e, 2), &g[size_t(o * ff)], n, &ys[size_t(o * h)]});
    }
    if (shared) {
        sh.resize(size_t(ntok * h));
        const Rows& d = shared->down;
        jobs.push_back({WeightView{d.type, d.base, d.rows, d.cols, d.stride}, shared->gate.row(0), ntok, sh.data()});
    }
    matmul_batch(jobs.data(), int64_t(jobs.size()));
    add_bias(ys, act.down_bias, h);
    const Rows ys_rows{reinterpret_cast<uint8_t*>(ys.data()), RG_TYPE_F32, rows, h, h * 4};
    const Rows pairs_rows{reinterpret_cast<uint8_t*>(pairs.data()), RG_TYPE_I32, 1, rows, rows * 4};
    const Rows sh_rows = shared ? Rows{reinterpret_cast<uint8_t*>(sh.data()), RG_TYPE_F32, ntok, h, h * 4} : Rows{};
    moe_combine(ys_rows, pairs_rows, weights, sh_rows, shared ? shared->gate_logit : Rows{}, y);
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
