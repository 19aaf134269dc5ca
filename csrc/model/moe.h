// Sparse mixture of experts with a gated shared expert (qwen4_exp / qwen3-next style):
//   p = softmax(W_router x); top-k experts by p (renormalised when norm_topk_prob);
//   y = sum_k p_k * down_k(silu(gate_k x) * up_k x) + sigmoid(w_sg . x) * down_s(silu(gate_s x) * up_s x)
// gpt-oss's: biases on the router and on every expert product, its clamped SwiGLU, no shared expert (the
// softmax of the top-k logits is the renormalised top-k of the softmax).
//
// The routed experts are either views into the mapped model file (resident) or streamed through an
// ExpertArena: the layer pins the experts its tokens need, runs those already resident and the shared
// expert while the others load, and runs each of the rest as soon as its record lands; or, in the arena's
// device-routed mode, they run as resident ones do, from whichever slot holds each record. The sum over
// experts is always taken in expert-id order, so the output is bit-identical whatever the arena holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/buffers.h"
#include "core/expert_arena.h"
#include "model/weights.h"

namespace regolith {

struct MoeShape {
    int64_t hidden = 0;
    int64_t n_expert = 0;
    int64_t n_used = 0;         // top-k
    int64_t ff_expert = 0;      // routed expert intermediate width
    int64_t ff_shared = 0;      // shared expert intermediate width (0: none)
    bool norm_topk_prob = true;
    Glu act = Glu::Silu;        // joins the routed experts' gate and up (Silu or SwigluOai)
    bool biases = false;        // ffn_gate_inp.bias and ffn_{gate,up,down}_exps.bias (gpt-oss)
};

// Cache-aware routing (MoCE, arXiv 2412.00099): the `protect` experts ranked highest by the router are kept;
// the other k - protect are chosen by router logit + `bonus` for experts resident in the arena. The routing
// weights stay the router's probabilities of the chosen experts (renormalised when norm_topk_prob).
struct MoceOptions {
    bool enabled = false;
    float bonus = 2.0f;    // added to the logits of resident experts
    int64_t protect = 2;   // top-r experts never displaced
};

// How a mixture-of-experts model's routed experts are reached (every MoE architecture's load options): views
// into the mapped GGUF (arena.slots 0), or streamed through an ExpertArena of arena.slots slots, from
// `experts_path` (a packed experts.bin) or the GGUF's own *_exps tensors.
struct ExpertLoadOptions {
    std::string experts_path;
    ArenaOptions arena;
    bool lookahead = true;  // prefetch a layer's predicted experts while the layer's mixer runs
    MoceOptions moce;
};

class SparseMoe {
public:
    // With `routed` false the *_exps tensors are not read (they are streamed: see stream_from).
    static SparseMoe load(const ModelWeights& w, int layer, const MoeShape& shape, bool routed = true);

    const MoeShape& shape() const { return shape_; }
    // Run the routed experts through `arena` (layer `layer` of its file).
    void stream_from(ExpertArena* arena, int64_t layer) { arena_ = arena, layer_ = layer; }
    void set_moce(const MoceOptions& moce) { moce_ = moce; }
    // x: [ntok][hidden] -> y: [ntok][hidden]. Resident experts run on the backend from the routing to the
    // sum (Backend::moe_experts), as do those of a device-routed arena; streamed ones bring the routing ids to
    // the host once per layer, where the arena pins and loads the experts and the batch by expert is formed.
    // `ids`, where given, is where a backend-side routing writes its expert ids ([ntok][k] I32: a step's
    // routing for ExpertArena::after_step).
    void forward(Workspace& ws, const Tensor& x, const Tensor& y, const Tensor& ids = Tensor{}) const;
    // Lookahead: route x (a prediction of this layer's input) and queue prefetch reads of the experts chosen.
    void prefetch(Workspace& ws, const Tensor& x) const;

private:
    // Router logits [ntok][n_expert] -> the routing ids on the host and the weights [ntok][k] on the backend.
    std::vector<int32_t> route(Workspace& ws, const Tensor& logits, bool cache_aware, const Tensor& weights) const;

    // Router logits of x, its bias added.
    void router_logits(Backend& be, const Tensor& x, const Tensor& logits) const;

    MoeShape shape_;
    Tensor router_;    // [n_expert, hidden]
    Tensor router_bias_;  // [1][n_expert] or empty
    // resident: the stacked [n_expert * ff][hidden] (twice), [n_expert * hidden][ff]; always the act and the
    // biases (resident also when the matrices stream)
    ExpertSet experts_;
    Tensor sh_gate_, sh_up_, sh_down_, sh_router_;  // shared expert and its gate [1, hidden]
    ExpertArena* arena_ = nullptr;
    int64_t layer_ = 0;
    MoceOptions moce_;
};

}  // namespace regolith
