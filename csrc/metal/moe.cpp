// Mixture of experts (metal/moe.metal; the experts' products are metal/matmul.metal's).
//
// moe_experts without a host round trip: rg_moe_group groups the routing pairs by expert in device scratch,
// the grouped gate / up / down products run as the matmul kernels' tiles (the same bits as the streamed
// path's matmul jobs), rg_moe_swiglu joins gate and up, and the weighted sum is rg_moe_combine over the
// grouped rows, the kernel of moe_combine itself, so the resident and streamed paths add in one order.
#include <algorithm>
#include <string>

#include "core/errors.h"
#include "metal/metal_backend.h"

namespace regolith::metal {

namespace {

constexpr uint32_t kMaxShmem = 32 * 1024;
constexpr uint32_t kGroupThreads = 256;
constexpr int64_t kGroupChunk = 1024;  // rg_moe_group's staged ids (RG_MOE_GROUP_CHUNK)
constexpr int64_t kMaxGroupExperts = 4096;
constexpr uint32_t kCombineThreads = 256;
constexpr int64_t kCombineColumns = 4 * kCombineThreads;  // columns of one rg_moe_combine threadgroup

uint64_t align(uint64_t n) { return (n + 255) / 256 * 256; }

KernelArg at(const KernelArg& base, uint64_t offset) {
    return KernelArg{base.buffer, base.offset + offset, nullptr, 0};
}

View packed_f32(const KernelArg& arg, int64_t rows, int64_t cols) {
    View v;
    v.arg = arg;
    v.shape = RgShape{rows, cols, cols * 4, RG_TYPE_F32, 0};
    return v;
}

// The routed experts' act and biases: the routing ids and the grouped rows' pairs (`order`) name each row's
// expert (all empty for silu without biases).
struct ExpertAct {
    Glu act = Glu::Silu;
    View ids, gate_bias, up_bias, down_bias;
    KernelArg order;
};

void swiglu(MetalBackend& be, const View& g, const View& u, const View& out, const ExpertAct& e = {}) {
    RgMoeSwigluArgs a{};
    a.g = g.shape, a.u = u.shape, a.out = out.shape;
    a.act = e.act == Glu::SwigluOai ? 1 : 0;
    const bool bias = bool(e.gate_bias);
    if (bias) {
        a.ids = e.ids.shape, a.gate_bias = e.gate_bias.shape, a.up_bias = e.up_bias.shape;
        a.k = uint32_t(e.ids.shape.cols), a.has_bias = 1;
    }
    const int64_t cols = g.shape.cols;
    be.launch("rg_moe_swiglu", uint32_t(std::min<int64_t>((cols + 255) / 256, 64)), uint32_t(g.shape.rows),
              256, 0,
              {MetalBackend::bytes(a), g.arg, u.arg, out.arg, bias ? e.order : g.arg, bias ? e.ids.arg : g.arg,
               bias ? e.gate_bias.arg : g.arg, bias ? e.up_bias.arg : g.arg});
}

// y[t] = the token's rows of ys (pairs, n_rows of them) weighted, in row order (+ the shared expert's), each
// row plus its expert's down bias where e has them.
void combine(MetalBackend& be, const View& ys, const KernelArg& pairs, int64_t n_rows, const View& weights,
             const View& shared, const View& shared_gate, const View& y, const ExpertAct& e = {}) {
    const int64_t k = weights.shape.cols;
    RgMoeCombineArgs a{};
    a.ys = ys.shape, a.weights = weights.shape, a.y = y.shape;
    if (shared) a.shared = shared.shape, a.shared_gate = shared_gate.shape;
    a.n_rows = uint32_t(n_rows), a.k = uint32_t(k), a.has_shared = shared ? 1 : 0;
    const bool bias = bool(e.down_bias);
    if (bias) a.ids = e.ids.shape, a.down_bias = e.down_bias.shape, a.has_bias = 1;
    const uint64_t shmem = uint64_t(3 * k + 1) * 4;
    if (shmem > kMaxShmem) throw Error("metal moe: too many experts per token");
    be.launch("rg_moe_combine", uint32_t(y.shape.rows),
              uint32_t((y.shape.cols + kCombineColumns - 1) / kCombineColumns), kCombineThreads,
              uint32_t(shmem),
              {MetalBackend::bytes(a), ys.arg, pairs, weights.arg, shared ? shared.arg : ys.arg,
               shared ? shared_gate.arg : ys.arg, y.arg, bias ? e.ids.arg : ys.arg, bias ? e.down_bias.arg : ys.arg});
}

}  // namespace

void MetalBackend::do_moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r,
                                const Tensor& ids, const Tensor& weights) {
    const View vl = view(logits), vr = view(resident), vi = view(ids), vw = view(weights);
    if (logits.rows == 0) return;
    const int64_t ne = logits.cols, k = r.k;
    const uint64_t shmem = uint64_t(8 * ne + 4 * k + ne);
    if (shmem > kMaxShmem) throw Error("metal moe_route: at most ~3,600 experts");
    RgMoeRouteArgs a{};
    a.logits = vl.shape, a.ids = vi.shape, a.weights = vw.shape;
    a.k = uint32_t(k);
    a.keep = uint32_t(resident ? std::clamp<int64_t>(r.protect, 0, k) : k);
    a.norm_topk = r.norm_topk ? 1 : 0;
    a.has_resident = resident ? 1 : 0;
    a.bonus = r.bonus;
    launch("rg_moe_route", uint32_t(logits.rows), 1, 32, uint32_t(shmem),
           {bytes(a), vl.arg, resident ? vr.arg : vl.arg, vi.arg, vw.arg});
}

void MetalBackend::do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                  const ExpertSet& experts, const SharedExpert* shared, const Tensor& y) {
    const View vx = view(x), vi = view(ids), vw = view(weights), vy = view(y);
    const View vg = view(experts.gate), vu = view(experts.up), vd = view(experts.down);
    const int64_t ntok = x.rows, h = x.cols, k = ids.cols, pairs = ntok * k, ne = experts.n_expert;
    const int64_t ff = experts.gate.rows / ne, fs = shared ? shared->gate.cols : 0;
    if (ntok == 0) return;
    if (ne > kMaxGroupExperts) throw Error("metal moe_experts: at most 4,096 experts");
    // scratch: the grouping, g and u [pairs][ff], ys [pairs][h]; the shared expert's silu(gate) * up
    // [ntok][fs] and output [ntok][h]
    const uint64_t groups_at = 0;
    const uint64_t g_at = groups_at + align(uint64_t(2 * (ne + 1) + pairs) * 4);
    const uint64_t u_at = g_at + align(uint64_t(pairs * ff) * 4);
    const uint64_t ys_at = u_at + align(uint64_t(pairs * ff) * 4);
    const uint64_t act_at = ys_at + align(uint64_t(pairs * h) * 4);
    const uint64_t sh_at = act_at + align(uint64_t(ntok * fs) * 4);
    const KernelArg base = scratch(sh_at + (shared ? uint64_t(ntok * h) * 4 : 0));
    const KernelArg groups = at(base, groups_at), order = at(base, groups_at + uint64_t(2 * (ne + 1)) * 4);
    const View g = packed_f32(at(base, g_at), pairs, ff), u = packed_f32(at(base, u_at), pairs, ff);
    const View ys = packed_f32(at(base, ys_at), pairs, h);

    RgMoeGroupArgs ga{};
    ga.ids = vi.shape, ga.n_expert = uint32_t(ne);
    launch("rg_moe_group", 1, 1, kGroupThreads, uint32_t((kGroupChunk + ne + 16) * 4),
           {bytes(ga), vi.arg, groups});
    const int64_t x_ld = vx.shape.stride / 4;
    encode_expert_products(*this, vg, ff, ne, vx.arg, x_ld, g.arg, ff, groups, k, ntok, pairs);
    encode_expert_products(*this, vu, ff, ne, vx.arg, x_ld, u.arg, ff, groups, k, ntok, pairs);
    const ExpertAct act{experts.act, vi, view(experts.gate_bias), view(experts.up_bias), view(experts.down_bias), order};
    swiglu(*this, g, u, g, act);
    encode_expert_products(*this, vd, h, ne, g.arg, ff, ys.arg, h, groups, 0, ntok, pairs);
    View sh, sg;
    if (shared) {
        const View act = packed_f32(at(base, act_at), ntok, fs);
        sh = packed_f32(at(base, sh_at), ntok, h);
        swiglu(*this, view(shared->gate), view(shared->up), act);
        const View down = view(shared->down);
        encode_products(*this, &down, &act, &sh, 1);
        sg = view(shared->gate_logit);
    }
    combine(*this, ys, order, pairs, vw, sh, sg, vy, act);
}

void MetalBackend::do_moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights,
                                  const Tensor& shared, const Tensor& shared_gate, const Tensor& y) {
    const View vys = view(ys), vp = view(pairs), vw = view(weights), vs = view(shared),
               vg = view(shared_gate);
    const View vy = view(y);
    if (y.rows == 0) return;
    combine(*this, vys, vp.arg, pairs.cols, vw, vs, vg, vy);
}

}  // namespace regolith::metal
