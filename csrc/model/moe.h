// Sparse mixture of experts with a gated shared expert (qwen4_exp / qwen3-next style):
//   p = softmax(W_router x); top-k experts by p (renormalised when norm_topk_prob);
//   y = sum_k p_k * down_k(silu(gate_k x) * up_k x) + sigmoid(w_sg . x) * down_s(silu(gate_s x) * up_s x)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ops.h"
#include "model/weights.h"

namespace regolith {

struct MoeShape {
    int64_t hidden = 0;
    int64_t n_expert = 0;
    int64_t n_used = 0;         // top-k
    int64_t ff_expert = 0;      // routed expert intermediate width
    int64_t ff_shared = 0;      // shared expert intermediate width (0: none)
    bool norm_topk_prob = true;
};

// The routing decision for a batch of tokens: expert ids and weights, [ntok][n_used].
struct Routing {
    std::vector<int32_t> experts;
    std::vector<float> weights;
};

class SparseMoe {
public:
    static SparseMoe load(const ModelWeights& w, int layer, const MoeShape& shape);

    const MoeShape& shape() const { return shape_; }
    // Router: softmax over experts, top-k (ties to the lower id, as torch.topk), optional renormalisation.
    Routing route(Backend& be, const float* x, int64_t ntok) const;
    // x: [ntok][hidden] -> y: [ntok][hidden]
    void forward(Backend& be, const float* x, int64_t ntok, float* y) const;

private:
    MoeShape shape_;
    WeightView router_;                           // [n_expert, hidden]
    std::vector<WeightView> gate_, up_, down_;    // per expert: [ff, hidden], [ff, hidden], [hidden, ff]
    WeightView sh_gate_, sh_up_, sh_down_, sh_router_;  // shared expert and its gate [1, hidden]
};

}  // namespace regolith
