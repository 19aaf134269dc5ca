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

// The token rows routed to the active experts, packed by expert: expert a's rows start at offset[a].
struct ExpertBatch {
    std::vector<int64_t> active, offset, count;  // ascending expert ids
    std::vector<std::vector<int64_t>> pairs;      // per active expert: indices t * k + j into the routing
    int64_t rows = 0;
};

ExpertBatch group_by_expert(const Routing& r, int64_t n_expert, int64_t ntok, int64_t k) {
    std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(n_expert));
    for (int64_t i = 0; i < ntok * k; ++i) by_expert[size_t(r.experts[size_t(i)])].push_back(i);
    ExpertBatch b;
    for (int64_t e = 0; e < n_expert; ++e) {
        if (by_expert[size_t(e)].empty()) continue;
        b.active.push_back(e);
        b.offset.push_back(b.rows);
        b.count.push_back(int64_t(by_expert[size_t(e)].size()));
        b.rows += b.count.back();
        b.pairs.push_back(std::move(by_expert[size_t(e)]));
    }
    return b;
}

// The token rows of every active expert, packed as b orders them: xs [b.rows][hidden].
std::vector<float> gather(const ExpertBatch& b, const float* x, int64_t h, int64_t k) {
    std::vector<float> xs(size_t(b.rows * h));
    for (size_t a = 0; a < b.active.size(); ++a)
        for (size_t j = 0; j < b.pairs[a].size(); ++j)
            std::copy_n(x + b.pairs[a][j] / k * h, h, xs.data() + (b.offset[a] + int64_t(j)) * h);
    return xs;
}

// y = sum over a token's experts of weight * expert output (in expert-id order), plus the gated shared
// expert. ys: [b.rows][hidden] expert outputs; sh: [ntok][hidden] and sg: [ntok] the shared expert's output
// and gate logit (unused without one).
void combine(const MoeShape& shape, const Routing& r, const ExpertBatch& b, const float* ys, const float* sh,
             const float* sg, int64_t ntok, float* y) {
    const int64_t h = shape.hidden, k = shape.n_used;
    std::fill(y, y + ntok * h, 0.0f);
    for (size_t a = 0; a < b.active.size(); ++a) {
        for (size_t j = 0; j < b.pairs[a].size(); ++j) {
            const float wgt = r.weights[size_t(b.pairs[a][j])];
            const float* src = ys + (b.offset[a] + int64_t(j)) * h;
            float* dst = y + b.pairs[a][j] / k * h;
            for (int64_t c = 0; c < h; ++c) dst[c] += wgt * src[c];
        }
    }
    if (shape.ff_shared == 0) return;
    for (int64_t t = 0; t < ntok; ++t) {
        const float gate = nn::sigmoid(sg[t]);
        for (int64_t c = 0; c < h; ++c) y[t * h + c] += gate * sh[t * h + c];
    }
}

// Runs experts `which` (indices into b.active) with weights `w[i]`: ys rows of those experts from xs rows.
// g, u: [b.rows][ff] scratch. Every product is independent of which others share its batch (Backend
// contract), so any split into calls gives the same bits.
void run_experts(Backend& be, const ExpertBatch& b, const std::vector<size_t>& which,
                 const std::vector<ExpertWeights>& w, const float* xs, int64_t h, int64_t ff, float* g, float* u,
                 float* ys) {
    std::vector<MatmulJob> jobs;
    for (size_t i = 0; i < which.size(); ++i) {
        const int64_t n = b.count[which[i]], o = b.offset[which[i]];
        jobs.push_back({w[i].gate, xs + o * h, n, g + o * ff});
        jobs.push_back({w[i].up, xs + o * h, n, u + o * ff});
    }
    be.matmul_batch(jobs.data(), int64_t(jobs.size()));
    for (size_t i : which)
        for (int64_t j = b.offset[i] * ff; j < (b.offset[i] + b.count[i]) * ff; ++j) g[j] = nn::silu(g[j]) * u[j];
    jobs.clear();
    for (size_t i = 0; i < which.size(); ++i) {
        const int64_t n = b.count[which[i]], o = b.offset[which[i]];
        jobs.push_back({w[i].down, g + o * ff, n, ys + o * h});
    }
    be.matmul_batch(jobs.data(), int64_t(jobs.size()));
}

// Releases the arena slots still pinned when a layer's expert work ends, by exception or not.
struct Pins {
    ExpertArena& arena;
    std::vector<int64_t> slots;
    ~Pins() {
        for (int64_t s : slots) arena.release(s);
    }
};

}  // namespace

SparseMoe SparseMoe::load(const ModelWeights& w, int layer, const MoeShape& shape, bool routed) {
    SparseMoe m;
    m.shape_ = shape;
    const std::string p = "blk." + std::to_string(layer) + ".";
    m.router_ = w.matrix(p + "ffn_gate_inp.weight", shape.n_expert, shape.hidden);
    for (int64_t e = 0; routed && e < shape.n_expert; ++e) {
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
    if (!moce_.enabled || !arena_) return route_impl(be, x, ntok, nullptr);
    std::vector<uint8_t> resident(size_t(shape_.n_expert));
    arena_->resident_mask(layer_, resident.data());
    return route_impl(be, x, ntok, resident.data());
}

Routing SparseMoe::route_impl(Backend& be, const float* x, int64_t ntok, const uint8_t* resident) const {
    std::vector<float> logits(size_t(ntok * shape_.n_expert));  // [ntok][n_expert]
    be.matmul(router_, x, ntok, logits.data());
    return select(logits, ntok, resident);
}

Routing SparseMoe::select(const std::vector<float>& logits, int64_t ntok, const uint8_t* resident) const {
    const int64_t ne = shape_.n_expert, k = shape_.n_used;
    std::vector<float> probs = logits;  // [ntok][n_expert]
    Routing r;
    r.experts.resize(size_t(ntok * k));
    r.weights.resize(size_t(ntok * k));
    std::vector<int32_t> order(static_cast<size_t>(ne));
    std::vector<float> score(static_cast<size_t>(ne));
    const int64_t keep = resident ? std::clamp<int64_t>(moce_.protect, 0, k) : k;
    for (int64_t t = 0; t < ntok; ++t) {
        float* p = probs.data() + t * ne;
        nn::softmax(p, ne);
        const auto by = [](const float* s) {
            return [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
        };
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + keep, order.end(), by(p));
        if (keep < k) {
            // MoCE: the rest by logit plus the bonus of resident experts.
            const float* l = logits.data() + t * ne;
            for (int64_t e = 0; e < ne; ++e) score[size_t(e)] = l[e] + (resident[e] ? moce_.bonus : 0.0f);
            std::partial_sort(order.begin() + keep, order.begin() + k, order.end(), by(score.data()));
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += p[order[size_t(j)]];
        for (int64_t j = 0; j < k; ++j) {
            r.experts[size_t(t * k + j)] = order[size_t(j)];
            r.weights[size_t(t * k + j)] = shape_.norm_topk_prob ? p[order[size_t(j)]] / sum : p[order[size_t(j)]];
        }
    }
    return r;
}

void SparseMoe::prefetch(Backend& be, const float* x, int64_t ntok) const {
    if (!arena_) return;
    const Routing r = route_impl(be, x, ntok, nullptr);
    arena_->prefetch(layer_, r.experts.data(), int64_t(r.experts.size()));
}

void SparseMoe::forward_resident(Backend& be, const float* x, int64_t ntok, float* y) const {
    const int64_t h = shape_.hidden, k = shape_.n_used, ff = shape_.ff_expert, fs = shape_.ff_shared;
    std::vector<float> logits(size_t(ntok * shape_.n_expert));  // [ntok][n_expert]
    // the shared expert: gate and up [ntok][ff_shared], output [ntok][hidden], gate logits [ntok]
    std::vector<float> shg(size_t(ntok * fs)), shu(size_t(ntok * fs)), sh(size_t(ntok * h));
    std::vector<float> sg(static_cast<size_t>(ntok));
    std::vector<MatmulJob> jobs{{router_, x, ntok, logits.data()}};
    if (fs > 0) {
        jobs.push_back({sh_gate_, x, ntok, shg.data()});
        jobs.push_back({sh_up_, x, ntok, shu.data()});
        jobs.push_back({sh_router_, x, ntok, sg.data()});
    }
    be.matmul_batch(jobs.data(), int64_t(jobs.size()));
    const Routing r = select(logits, ntok, nullptr);
    const ExpertBatch b = group_by_expert(r, shape_.n_expert, ntok, k);
    const std::vector<float> xs = gather(b, x, h, k);
    std::vector<float> g(size_t(b.rows * ff)), u(size_t(b.rows * ff)), ys(size_t(b.rows * h));

    jobs.clear();
    for (size_t a = 0; a < b.active.size(); ++a) {
        const size_t e = size_t(b.active[a]);
        const int64_t n = b.count[a], o = b.offset[a];
        jobs.push_back({gate_[e], xs.data() + o * h, n, g.data() + o * ff});
        jobs.push_back({up_[e], xs.data() + o * h, n, u.data() + o * ff});
    }
    be.matmul_batch(jobs.data(), int64_t(jobs.size()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = nn::silu(g[i]) * u[i];
    for (size_t i = 0; i < shg.size(); ++i) shg[i] = nn::silu(shg[i]) * shu[i];
    jobs.clear();
    for (size_t a = 0; a < b.active.size(); ++a) {
        const int64_t n = b.count[a], o = b.offset[a];
        jobs.push_back({down_[size_t(b.active[a])], g.data() + o * ff, n, ys.data() + o * h});
    }
    if (fs > 0) jobs.push_back({sh_down_, shg.data(), ntok, sh.data()});
    be.matmul_batch(jobs.data(), int64_t(jobs.size()));
    combine(shape_, r, b, ys.data(), sh.data(), sg.data(), ntok, y);
}

void SparseMoe::forward(Backend& be, const float* x, int64_t ntok, float* y) const {
    if (!arena_) return forward_resident(be, x, ntok, y);
    const int64_t h = shape_.hidden, k = shape_.n_used, ff = shape_.ff_expert;
    const Routing r = route(be, x, ntok);
    const ExpertBatch b = group_by_expert(r, shape_.n_expert, ntok, k);
    const std::vector<float> xs = gather(b, x, h, k);
    std::vector<float> g(size_t(b.rows * ff)), u(size_t(b.rows * ff)), ys(size_t(b.rows * h));

    std::vector<float> sh, sg;  // the shared expert's output [ntok][hidden] and gate logits [ntok]
    const auto shared = [&] {
        if (shape_.ff_shared == 0) return;
        sh.resize(size_t(ntok * h));
        sg.resize(size_t(ntok));
        swiglu_mlp(be, sh_gate_, sh_up_, sh_down_, x, ntok, sh.data());
        be.matmul(sh_router_, x, ntok, sg.data());
    };

    // Resident experts first (they cannot be evicted by this layer's own misses), then the misses with the
    // most tokens first; waves of at most slots() experts when the layer needs more than the arena holds.
    std::vector<uint8_t> resident(size_t(shape_.n_expert));
    auto use = arena_->use();
    arena_->resident_mask(layer_, resident.data());
    std::vector<size_t> order(b.active.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) {
        const bool ri = resident[size_t(b.active[i])], rj = resident[size_t(b.active[j])];
        return ri != rj ? ri : b.count[i] > b.count[j];
    });
    bool shared_done = false;
    for (size_t w0 = 0; w0 < order.size(); w0 += size_t(arena_->slots())) {
        const size_t w1 = std::min(order.size(), w0 + size_t(arena_->slots()));
        Pins pins{*arena_, {}};
        std::vector<size_t> pending;  // indices into b.active
        for (size_t i = w0; i < w1; ++i) {
            pins.slots.push_back(arena_->acquire(layer_, b.active[order[i]]));
            pending.push_back(order[i]);
        }
        if (!shared_done) shared(), shared_done = true;  // overlaps the first wave's reads
        std::vector<int64_t> slot_of(b.active.size(), -1);
        for (size_t i = w0; i < w1; ++i) slot_of[order[i]] = pins.slots[i - w0];
        while (!pending.empty()) {
            // Everything already in memory runs now; else wait for the first record still loading.
            std::vector<size_t> run, rest;
            for (size_t i : pending) (arena_->ready(slot_of[i]) ? run : rest).push_back(i);
            if (run.empty()) run.push_back(rest.front()), rest.erase(rest.begin());
            std::vector<ExpertWeights> w;
            for (size_t i : run) w.push_back(arena_->wait(slot_of[i]));
            run_experts(be, b, run, w, xs.data(), h, ff, g.data(), u.data(), ys.data());
            pending = std::move(rest);
        }
    }
    if (!shared_done) shared();
    combine(shape_, r, b, ys.data(), sh.data(), sg.data(), ntok, y);
}

}  // namespace regolith
