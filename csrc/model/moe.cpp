#include "model/moe.h"

#include <algorithm>
#include <numeric>

namespace regolith {
namespace {

// Device-routed experts of steps of more tokens than this are staged in device memory a layer at a time (the
// products' decode and speculative-verify range reads them in place).
constexpr int64_t kStageTokens = 16;

// The token rows routed to the active experts, packed by expert: expert a's rows start at offset[a].
struct ExpertBatch {
    std::vector<int64_t> active, offset, count;  // ascending expert ids
    std::vector<int32_t> token, pair;            // per packed row: its token t and its routing index t * k + j
    int64_t rows = 0;
};

ExpertBatch group_by_expert(const std::vector<int32_t>& experts, int64_t n_expert, int64_t k) {
    const int64_t n = int64_t(experts.size());
    std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(n_expert));
    for (int64_t i = 0; i < n; ++i) by_expert[size_t(experts[size_t(i)])].push_back(int32_t(i));
    ExpertBatch b;
    for (int64_t e = 0; e < n_expert; ++e) {
        if (by_expert[size_t(e)].empty()) continue;
        b.active.push_back(e);
        b.offset.push_back(b.rows);
        b.count.push_back(int64_t(by_expert[size_t(e)].size()));
        b.rows += b.count.back();
        for (int32_t p : by_expert[size_t(e)]) {
            b.pair.push_back(p);
            b.token.push_back(int32_t(p / k));
        }
    }
    return b;
}

// The batch's index tensors on the backend and the packed token rows xs [rows][hidden].
struct PackedRows {
    Tensor pairs, xs;
};

PackedRows pack(Workspace& ws, const ExpertBatch& b, const Tensor& x) {
    Backend& be = ws.backend();
    const Tensor token = ws.i32(1, b.rows), pairs = ws.i32(1, b.rows);
    be.write(token, b.token.data());
    be.write(pairs, b.pair.data());
    const Tensor xs = ws.f32(b.rows, x.cols);
    be.gather_rows(x, token, xs);
    return {pairs, xs};
}

// Runs experts `which` (indices into b.active) with weights `w[i]`: ys rows of those experts from xs rows,
// with `set`'s act and biases. g, u: [b.rows][ff] scratch. Every product is independent of which others
// share its batch (Backend contract), so any split into calls gives the same bits.
void run_experts(Backend& be, const ExpertBatch& b, const std::vector<size_t>& which,
                 const std::vector<ExpertWeights>& w, const ExpertSet& set, const Tensor& xs, const Tensor& g,
                 const Tensor& u, const Tensor& ys) {
    std::vector<MatmulJob> jobs;
    for (size_t i = 0; i < which.size(); ++i) {
        const int64_t n = b.count[which[i]], o = b.offset[which[i]];
        jobs.push_back({w[i].gate, xs.row_range(o, n), g.row_range(o, n)});
        jobs.push_back({w[i].up, xs.row_range(o, n), u.row_range(o, n)});
    }
    be.matmul(jobs.data(), int64_t(jobs.size()));
    // expert e's bias row added to each of its rows
    const auto add_bias = [&](const Tensor& z, const Tensor& bias) {
        if (!bias) return;
        for (size_t i : which) {
            const int64_t n = b.count[i], o = b.offset[i];
            be.add(z.row_range(o, n), bias.row_range(b.active[i], 1), z.row_range(o, n));
        }
    };
    add_bias(g, set.gate_bias);
    add_bias(u, set.up_bias);
    // act(g, u) over the experts' rows, one op per run of adjacent experts (all of them when none waited)
    std::vector<size_t> sorted(which);
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size();) {
        size_t j = i + 1;
        while (j < sorted.size() && sorted[j] == sorted[j - 1] + 1) ++j;
        const int64_t r0 = b.offset[sorted[i]], n = b.offset[sorted[j - 1]] + b.count[sorted[j - 1]] - r0;
        be.glu(g.row_range(r0, n), u.row_range(r0, n), set.act, g.row_range(r0, n));
        i = j;
    }
    jobs.clear();
    for (size_t i = 0; i < which.size(); ++i) {
        const int64_t n = b.count[which[i]], o = b.offset[which[i]];
        jobs.push_back({w[i].down, g.row_range(o, n), ys.row_range(o, n)});
    }
    be.matmul(jobs.data(), int64_t(jobs.size()));
    add_bias(ys, set.down_bias);
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
    m.experts_.act = shape.act;
    if (shape.biases) {
        const int64_t ne = shape.n_expert, ff = shape.ff_expert, h = shape.hidden;
        m.router_bias_ = w.f32_converted(p + "ffn_gate_inp.bias", {ne});
        m.experts_.gate_bias = w.f32_converted(p + "ffn_gate_exps.bias", {ff, ne}).reshaped(ne, ff);
        m.experts_.up_bias = w.f32_converted(p + "ffn_up_exps.bias", {ff, ne}).reshaped(ne, ff);
        m.experts_.down_bias = w.f32_converted(p + "ffn_down_exps.bias", {h, ne}).reshaped(ne, h);
    }
    if (routed) {
        const int64_t ne = shape.n_expert;
        m.experts_.gate = w.stacked_all(p + "ffn_gate_exps.weight", ne, shape.ff_expert, shape.hidden);
        m.experts_.up = w.stacked_all(p + "ffn_up_exps.weight", ne, shape.ff_expert, shape.hidden);
        m.experts_.down = w.stacked_all(p + "ffn_down_exps.weight", ne, shape.hidden, shape.ff_expert);
        m.experts_.n_expert = ne;
    }
    if (shape.ff_shared > 0) {
        m.sh_gate_ = w.matrix(p + "ffn_gate_shexp.weight", shape.ff_shared, shape.hidden);
        m.sh_up_ = w.matrix(p + "ffn_up_shexp.weight", shape.ff_shared, shape.hidden);
        m.sh_down_ = w.matrix(p + "ffn_down_shexp.weight", shape.hidden, shape.ff_shared);
        m.sh_router_ = w.matrix(p + "ffn_gate_inp_shexp.weight", 1, shape.hidden);
    }
    return m;
}

std::vector<int32_t> SparseMoe::route(Workspace& ws, const Tensor& logits, bool cache_aware, const Tensor& weights) const {
    Backend& be = ws.backend();
    const int64_t ntok = logits.rows, k = shape_.n_used;
    Tensor resident;
    MoeRouting r{k, shape_.norm_topk_prob, 0.0f, 0};
    if (cache_aware && moce_.enabled && arena_) {
        std::vector<uint8_t> mask(size_t(shape_.n_expert));
        arena_->resident_mask(layer_, mask.data());
        resident = ws.alloc(RG_TYPE_I8, 1, shape_.n_expert);
        be.write(resident, mask.data());
        r.bonus = moce_.bonus;
        r.protect = moce_.protect;
    }
    const Tensor ids = ws.i32(ntok, k);
    be.moe_route(logits, resident, r, ids, weights);
    std::vector<int32_t> host(size_t(ntok * k));
    be.read(ids, host.data());  // the host hop: the arena and the expert batch are decided here
    return host;
}

void SparseMoe::router_logits(Backend& be, const Tensor& x, const Tensor& logits) const {
    be.matmul(router_, x, logits);
    if (router_bias_) be.add(logits, router_bias_, logits);
}

void SparseMoe::prefetch(Workspace& ws, const Tensor& x) const {
    if (!arena_ || arena_->device_routed()) return;
    Workspace::Scope scope(ws);
    const Tensor logits = ws.f32(x.rows, shape_.n_expert), weights = ws.f32(x.rows, shape_.n_used);
    router_logits(ws.backend(), x, logits);
    const std::vector<int32_t> ids = route(ws, logits, false, weights);
    arena_->prefetch(layer_, ids.data(), int64_t(ids.size()));
}

void SparseMoe::forward(Workspace& ws, const Tensor& x, const Tensor& y, const Tensor& ids_out) const {
    Backend& be = ws.backend();
    Workspace::Scope scope(ws);
    const int64_t ntok = x.rows, h = shape_.hidden, k = shape_.n_used, ff = shape_.ff_expert, fs = shape_.ff_shared;
    const Tensor logits = ws.f32(ntok, shape_.n_expert);  // [ntok][n_expert]
    const Tensor weights = ws.f32(ntok, k);               // [ntok][k]
    // the shared expert: gate and up [ntok][ff_shared], gate logits [ntok]
    Tensor shg, shu, sg;
    if (fs > 0) shg = ws.f32(ntok, fs), shu = ws.f32(ntok, fs), sg = ws.f32(ntok, 1);

    if (!arena_ || arena_->device_routed()) {
        // the router and the shared expert's gate, up and router in one batch; then the experts (and the
        // shared expert's down product) on the backend, without a host round trip
        std::vector<MatmulJob> jobs{{router_, x, logits}};
        if (fs > 0) {
            jobs.push_back({sh_gate_, x, shg});
            jobs.push_back({sh_up_, x, shu});
            jobs.push_back({sh_router_, x, sg});
        }
        be.matmul(jobs.data(), int64_t(jobs.size()));
        if (router_bias_) be.add(logits, router_bias_, logits);
        const Tensor ids = ids_out ? ids_out : ws.i32(ntok, k);
        MoeRouting r{k, shape_.norm_topk_prob, 0.0f, 0};
        Tensor resident;
        ExpertSet experts = experts_;
        ExpertSlots slots;
        if (arena_) {
            slots = arena_->expert_slots(layer_);
            experts.n_expert = shape_.n_expert;
            experts.slots = &slots;
            if (ntok > kStageTokens) {
                // A prefill chunk routes to nearly every expert: the layer's records copied to device memory in
                // one upload cross the bus at the copy engine's speed, where products reading them in place (or
                // a kernel copying them) do not.
                const Tensor staged = ws.alloc(RG_TYPE_I8, slots.host.rows, slots.host.cols);
                arena_->stage(layer_, staged);
                slots.host = staged;
            }
            if (moce_.enabled) resident = arena_->routed_mask(layer_), r.bonus = moce_.bonus, r.protect = moce_.protect;
        }
        be.moe_route(logits, resident, r, ids, weights);
        const SharedExpert shared{shg, shu, sh_down_, sg};
        be.moe_experts(x, ids, weights, experts, fs > 0 ? &shared : nullptr, y);
        return;
    }

    router_logits(be, x, logits);
    const ExpertBatch b = group_by_expert(route(ws, logits, true, weights), shape_.n_expert, k);
    const PackedRows packed = pack(ws, b, x);
    const Tensor g = ws.f32(b.rows, ff), u = ws.f32(b.rows, ff), ys = ws.f32(b.rows, h);
    const Tensor sh = fs > 0 ? ws.f32(ntok, h) : Tensor{};  // the shared expert's output [ntok][hidden]
    const auto shared = [&] {
        if (fs == 0) return;
        const MatmulJob jobs[] = {{sh_gate_, x, shg}, {sh_up_, x, shu}, {sh_router_, x, sg}};  // one dispatch
        be.matmul(jobs, 3);
        be.glu(shg, shu, Glu::Silu, shg);
        be.matmul(sh_down_, shg, sh);
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
            run_experts(be, b, run, w, experts_, packed.xs, g, u, ys);
            pending = std::move(rest);
        }
        // The wave's slots may be reused by the next one: its products must have read them.
        be.submit();
    }
    if (!shared_done) shared();
    be.moe_combine(ys, packed.pairs, weights, sh, sg, y);
}

}  // namespace regolith
