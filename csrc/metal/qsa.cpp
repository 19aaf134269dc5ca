// QSA sparse attention (metal/qsa.metal): pooling, block selection (scores, then a top-k per query) and gated
// attention over the selected blocks in key splits, merged by rg_attention_merge (attention.metal). The
// caches may be of any type supports_cache() names; an I8 cache's scales are bound after the kernels' other
// buffers (another buffer stands in where a cache has none).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/errors.h"
#include "metal/metal_backend.h"

namespace regolith::metal {

namespace {

constexpr int64_t kRows = 8;          // heads per threadgroup (qsa.metal: kQsaRows)
constexpr int64_t kChunk = 32;        // keys per chunk (kQsaChunk)
constexpr int64_t kMaxHeadDim = 512;  // 128 * kQsaMaxE
constexpr int64_t kScoreBlocks = 64;  // blocks per rg_qsa_score threadgroup

}  // namespace

void MetalBackend::do_qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq,
                               const Tensor& axis, const QsaDims& d) {
    const View vn = view(norm), vf = view(freq), va = view(axis);
    const uint32_t threads = uint32_t(std::clamp<int64_t>((d.index_head_dim + 31) / 32 * 32, 32, 256));
    for (int64_t i = 0; i < n_seqs; ++i) {
        const QsaSeq& s = seqs[i];
        const int64_t b0 = s.n0 / d.ratio, b1 = (s.n0 + s.ntok) / d.ratio;
        if (b1 <= b0) continue;
        const View ik = view(s.index_k), bk = view(s.block_k), pos = view(s.pos);
        const View iks = view(s.index_k_scale), bks = view(s.block_k_scale);
        RgQsaPoolArgs a{};
        a.index_k = ik.shape, a.block_k = bk.shape, a.pos = pos.shape, a.norm = vn.shape, a.freq = vf.shape;
        a.index_k_scale = iks.shape, a.block_k_scale = bks.shape;
        a.axis = va.shape, a.b0 = b0, a.ratio = int32_t(d.ratio),
        a.index_head_dim = int32_t(d.index_head_dim);
        a.n_rot = int32_t(d.n_rot), a.eps = d.eps;
        launch("rg_qsa_pool", uint32_t(b1 - b0), 1, threads,
               uint32_t((32 + d.index_head_dim) * sizeof(float)),
               {bytes(a), ik.arg, bk.arg, pos.arg, vn.arg, vf ? vf.arg : vn.arg, va ? va.arg : vn.arg,
                iks ? iks.arg : ik.arg, bks ? bks.arg : bk.arg});
    }
}

void MetalBackend::do_qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d,
                                 const Tensor& sel, const Tensor& n_sel) {
    const View viq = view(iq), vs = view(sel), vns = view(n_sel);
    // The scores of the queries that do not keep every block, [ntok][complete blocks]; launches run in order,
    // so one scratch serves every sequence.
    uint64_t score_bytes = 0;
    for (int64_t i = 0; i < n_seqs; ++i) {
        const int64_t nb = (seqs[i].n0 + seqs[i].ntok) / d.ratio;
        if (seqs[i].ntok > 0 && nb > d.topk)
            score_bytes = std::max(score_bytes, uint64_t(seqs[i].ntok * nb) * sizeof(float));
    }
    const KernelArg scores = score_bytes > 0 ? scratch(score_bytes) : vs.arg;
    for (int64_t i = 0; i < n_seqs; ++i) {
        const QsaSeq& s = seqs[i];
        if (s.ntok == 0) continue;
        const View bk = view(s.block_k), bks = view(s.block_k_scale);
        const int64_t nb = (s.n0 + s.ntok) / d.ratio;
        RgQsaSelectArgs a{};
        a.iq = viq.shape, a.block_k = bk.shape, a.sel = vs.shape, a.n_sel = vns.shape;
        a.block_k_scale = bks.shape;
        a.t0 = s.t0, a.ntok = s.ntok, a.n0 = s.n0, a.nb_stride = nb;
        a.ratio = int32_t(d.ratio), a.topk = int32_t(d.topk), a.index_n_head = int32_t(d.index_n_head);
        a.index_head_dim = int32_t(d.index_head_dim),
        a.index_scale = 1.0f / std::sqrt(float(d.index_head_dim));
        if (nb > d.topk)
            launch("rg_qsa_score", uint32_t((nb + kScoreBlocks - 1) / kScoreBlocks), uint32_t(s.ntok), 128, 0,
                   {bytes(a), viq.arg, bk ? bk.arg : viq.arg, scores, bks ? bks.arg : viq.arg});
        launch("rg_qsa_topk", uint32_t(s.ntok), 1, 256, (256 + 8 + 2) * sizeof(uint32_t),
               {bytes(a), scores, vs.arg, vns.arg});
    }
}

void MetalBackend::do_qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel,
                                 const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& out) {
    const int64_t H = d.n_head, KV = d.n_head_kv, D = d.head_dim, G = H / KV,
                  htiles = (G + kRows - 1) / kRows;
    if (D > kMaxHeadDim)
        throw Error("qsa_attend on metal: head_dim " + std::to_string(D) + " > " +
                    std::to_string(kMaxHeadDim));
    const View vq = view(q), vg = view(gate), vs = view(sel), vns = view(n_sel), vo = view(out);
    std::vector<int64_t> splits(size_t(n_seqs), 1);
    uint64_t part_bytes = 0;
    for (int64_t i = 0; i < n_seqs; ++i) {
        const QsaSeq& s = seqs[i];
        if (s.ntok == 0) continue;
        const int64_t keys = std::min(d.topk, (s.n0 + s.ntok) / d.ratio) * d.ratio + d.ratio;  // at most
        splits[size_t(i)] = key_splits(s.ntok * KV * htiles, keys);
        if (splits[size_t(i)] > 1)
            part_bytes =
                std::max(part_bytes, uint64_t(s.ntok * H * splits[size_t(i)] * (D + 2)) * sizeof(float));
    }
    const KernelArg part = part_bytes > 0 ? scratch(part_bytes) : vo.arg;
    const uint32_t shmem =
        uint32_t((kRows * D + 2 * kChunk * kRows + 2 * kChunk + 4 * kRows) * sizeof(float));
    for (int64_t i = 0; i < n_seqs; ++i) {
        const QsaSeq& s = seqs[i];
        if (s.ntok == 0) continue;
        const View k = view(s.k), v = view(s.v), ks = view(s.k_scale), vsc = view(s.v_scale);
        const int64_t n_split = splits[size_t(i)];
        RgQsaAttendArgs a{};
        a.q = vq.shape, a.gate = vg.shape, a.sel = vs.shape, a.n_sel = vns.shape, a.k = k.shape,
        a.v = v.shape, a.k_scale = ks.shape, a.v_scale = vsc.shape;
        a.out = vo.shape, a.t0 = s.t0, a.ntok = s.ntok, a.n0 = s.n0;
        a.n_head = int32_t(H), a.n_head_kv = int32_t(KV), a.head_dim = int32_t(D), a.ratio = int32_t(d.ratio);
        a.n_split = int32_t(n_split), a.scale = 1.0f / std::sqrt(float(D));
        launch("rg_qsa_attend", uint32_t(s.ntok * KV * htiles), uint32_t(n_split), 128, shmem,
               {bytes(a), vq.arg, vg.arg, vs.arg, vns.arg, k.arg, v.arg, vo.arg, part, ks ? ks.arg : k.arg,
                vsc ? vsc.arg : v.arg});
        if (n_split > 1) {
            RgAttnMergeArgs m{};
            m.out = vo.shape, m.gate = vg.shape, m.t0 = s.t0, m.n_head = int32_t(H), m.heads_per_row = 1;
            m.head_dim = int32_t(D), m.n_split = int32_t(n_split), m.has_gate = 1;
            launch("rg_attention_merge", uint32_t(s.ntok * H), 1, simd_threads(D),
                   uint32_t(n_split * sizeof(float)), {bytes(m), part, vg.arg, vo.arg, vo.arg});
        }
    }
}

}  // namespace regolith::metal
