#include "model/moe.h"

#include <algorithm>
#include <numeric>

#include "model/nn.h"

namespace regolith {
namespace {

// out[t][:] = silu(gate x_t) * (up x_t), x: [ntok][hidden] -> [ntok][ff], then down -> y [ntok][hidden]
void swiglu_mlp(Backend& be, const WeightView& gate, const WeightView& up, const WeightView& down, const float* x,
                int64_t ntok, float* y) {
    const int64_t ff = gate.rows;
    std::vector<float> g(size_t(ntok * ff)), u(size_t(ntok * ff));
    be.matmul(gate, x, ntok, g.data());
    be.matmul(up, x, ntok, u.data());
    for (size_t i = 0; i < g.size(); ++i) g[i] = nn::silu(g[i]) * u[i];
    be.matmul(down, g.data(), ntok, y);
}

}  // namespace

SparseMoe SparseMoe::load(const ModelWeights& w, int layer, const MoeShape& shape) {
    SparseMoe m;
    m.shape_ = shape;
    const std::string p = "blk." + std::to_string(layer) + ".";
    m.router_ = w.matrix(p + "ffn_gate_inp.weight", shape.n_expert, shape.hidden);
    for (int64_t e = 0; e < shape.n_expert; ++e) {
        m.gate_.push_back(w.stacked(p + "ffn_gate_exps.weight", shape.n_expert, e, shape.ff_expert, shape.hidden));
        m.up_.push_back(w.stacked(p + "ffn_up_exps.weight", shape.n_expert, e, shape.ff_expert, shape.hidden));
        m.down_.push_back(w.stacked(p + "ffn_down_exps.weight", shape.n_expert, e, shape.hidden, shape.ff_expert));
    }
    if (shape.ff_shared > 0) {
        m.sh_gate_ = w.matrix(p + "ffn_gate_shexp.weight", shape.ff_shared, shape.hidden);
        m.sh_up_ = w.matrix(p + "ffn_up_shexp.weight", shape.ff_shared, shape.hidden);
        m.sh_down_ = w.matrix(p + "ffn_down_shexp.weight", shape.hidden, shape.ff_shared);
        m.sh_router_ = w.matrix(p + "ffn_gate_inp_shexp.weight", 1, shape.hidden);
    }
    return m;
}

Routing SparseMoe::route(Backend& be, const float* x, int64_t ntok) const {
    const int64_t ne = shape_.n_expert, k = shape_.n_used;
    std::vector<float> probs(size_t(ntok * ne));  // [ntok][n_expert]
    be.matmul(router_, x, ntok, probs.data());
    Routing r;
    r.experts.resize(size_t(ntok * k));
    r.weights.resize(size_t(ntok * k));
    std::vector<int32_t> order(static_cast<size_t>(ne));
    for (int64_t t = 0; t < ntok; ++t) {
        float* p = probs.data() + t * ne;
        nn::softmax(p, ne);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += p[order[size_t(j)]];
        for (int64_t j = 0; j < k; ++j) {
            r.experts[size_t(t * k + j)] = order[size_t(j)];
            r.weights[size_t(t * k + j)] = shape_.norm_topk_prob ? p[order[size_t(j)]] / sum : p[order[size_t(j)]];
        }
    }
    return r;
}

void SparseMoe::forward(Backend& be, const float* x, int64_t ntok, float* y) const {
    const int64_t h = shape_.hidden, k = shape_.n_used;
    const Routing r = route(be, x, ntok);
    std::fill(y, y + ntok * h, 0.0f);
    // Group the (token, slot) pairs by expert so each expert's weights are used once for all its tokens.
    std::vector<std::vector<int64_t>> by_expert(size_t(shape_.n_expert));
    for (int64_t i = 0; i < ntok * k; ++i) by_expert[size_t(r.experts[size_t(i)])].push_back(i);
    std::vector<int64_t> active, offset;  // experts with tokens; their first row in the packed buffers
    int64_t rows = 0;
    for (int64_t e = 0; e < shape_.n_expert; ++e) {
        if (by_expert[size_t(e)].empty()) continue;
        active.push_back(e);
        offset.push_back(rows);
        rows += int64_t(by_expert[size_t(e)].size());
    }
    const int64_t ff = shape_.ff_expert;
    std::vector<float> xs(size_t(rows * h)), g(size_t(rows * ff)), u(size_t(rows * ff)), ys(size_t(rows * h));
    for (size_t a = 0; a < active.size(); ++a) {
        const auto& pairs = by_expert[size_t(active[a])];
        for (size_t j = 0; j < pairs.size(); ++j)
            std::copy_n(x + pairs[j] / k * h, h, xs.data() + (offset[a] + int64_t(j)) * h);
    }
    // Every active expert's gate and up products in one batch, then every down product.
    std::vector<MatmulJob> jobs;
    for (size_t a = 0; a < active.size(); ++a) {
        const int64_t e = active[a], n = int64_t(by_expert[size_t(e)].size()), o = offset[a];
        jobs.push_back({gate_[size_t(e)], xs.data() + o * h, n, g.data() + o * ff});
        jobs.push_back({up_[size_t(e)], xs.data() + o * h, n, u.data() + o * ff});
    }
    be.matmul_batch(jobs.data(), int64_t(jobs.size()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = nn::silu(g[i]) * u[i];
    jobs.clear();
    for (size_t a = 0; a < active.size(); ++a) {
        const int64_t e = active[a], n = int64_t(by_expert[size_t(e)].size()), o = offset[a];
        jobs.push_back({down_[size_t(e)], g.data() + o * ff, n, ys.data() + o * h});
    }
    be.matmul_batch(jobs.data(), int64_t(jobs.size()));
    for (size_t a = 0; a < active.size(); ++a) {
        const auto& pairs = by_expert[size_t(active[a])];
        for (size_t j = 0; j < pairs.size(); ++j) {
            const float wgt = r.weights[size_t(pairs[j])];
            const float* src = ys.data() + (offset[a] + int64_t(j)) * h;
            float* dst = y + pairs[j] / k * h;
            for (int64_t c = 0; c < h; ++c) dst[c] += wgt * src[c];
        }
    }
    if (shape_.ff_shared == 0) return;
    std::vector<float> sh(static_cast<size_t>(ntok * h)), sg(static_cast<size_t>(ntok));
    swiglu_mlp(be, sh_gate_, sh_up_, sh_down_, x, ntok, sh.data());
    be.matmul(sh_router_, x, ntok, sg.data());
    for (int64_t t = 0; t < ntok; ++t) {
        const float g = nn::sigmoid(sg[size_t(t)]);
        for (int64_t c = 0; c < h; ++c) y[t * h + c] += g * sh[size_t(t * h + c)];
    }
}

}  // namespace regolith
