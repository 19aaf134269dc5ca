// Dense attention (metal/attention.metal): kv_append, then flash attention over each sequence's cache in key
// splits, merged by rg_attention_merge where there are several. F32 / F16 caches hold keys and transposed
// values; Q8_0 / I8 caches key and value rows (rg_kv_append_rows, rg_attention_rows), with an I8 cache's row
// scales bound beside them (another buffer stands in where there are none).
#include <algorithm>
#include <string>
#include <vector>

#include "core/errors.h"
#include "metal/metal_backend.h"

namespace regolith::metal {

namespace {

constexpr int64_t kRows = 8;            // query rows per threadgroup (attention.metal: kAttnRows)
constexpr int64_t kChunk = 64;          // keys per chunk (kAttnChunk)
constexpr int64_t kMaxHeadDim = 256;    // O^T tiles held per SIMD-group (kAttnMaxDTiles)
constexpr int64_t kMinSplitKeys = 128;  // keys below which a split is not worth its partial results
constexpr int64_t kTargetGroups = 256;  // threadgroups that keep every core of the largest GPUs busy
constexpr int64_t kAppendRowsPerGroup = 4;  // (token, kv head) pairs per rg_kv_append_rows threadgroup
constexpr int64_t kRowsTile = 4 * 8 * 32;   // rg_attention_rows: each SIMD-group's dequantized tile, floats

// Q8_0 / I8 caches: key and value rows (KvSeq).
bool rows_cache(const KvSeq& s) { return s.k.type == RG_TYPE_Q8_0 || s.k.type == RG_TYPE_I8; }

}  // namespace

int64_t key_splits(int64_t groups, int64_t keys) {
    const int64_t by_keys = std::max<int64_t>(1, (keys + kMinSplitKeys - 1) / kMinSplitKeys);
    const int64_t by_groups = std::max<int64_t>(1, (kTargetGroups + groups - 1) / groups);
    return std::min(by_keys, by_groups);
}

void MetalBackend::do_kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs,
                                int64_t n_head_kv) {
    const View vk = view(k), vv = view(v);
    for (int64_t i = 0; i < n_seqs; ++i) {
        const KvSeq& s = seqs[i];
        if (s.ntok == 0) continue;
        const View kc = view(s.k), vt = view(s.vt), vc = view(s.v);
        const View ks = view(s.k_scale), vs = view(s.v_scale);
        RgKvAppendArgs a{};
        a.k = vk.shape, a.v = vv.shape, a.kc = kc.shape, a.vt = vt.shape, a.vc = vc.shape;
        a.kc_scale = ks.shape, a.vc_scale = vs.shape;
        a.t0 = s.t0, a.ntok = s.ntok, a.n0 = s.n0, a.cap = s.k.rows / n_head_kv;
        a.n_head_kv = int32_t(n_head_kv), a.head_dim = int32_t(k.cols / n_head_kv);
        if (rows_cache(s)) {
            const int64_t items = s.ntok * n_head_kv;
            launch("rg_kv_append_rows", uint32_t((items + kAppendRowsPerGroup - 1) / kAppendRowsPerGroup), 1,
                   uint32_t(32 * kAppendRowsPerGroup), 0,
                   {bytes(a), vk.arg, vv.arg, kc.arg, vc.arg, ks ? ks.arg : kc.arg, vs ? vs.arg : vc.arg});
            continue;
        }
        launch(s.k.type == RG_TYPE_F16 ? "rg_kv_append_f16" : "rg_kv_append_f32",
               uint32_t((s.ntok + 31) / 32), uint32_t(n_head_kv), 256, 32 * 33 * sizeof(float),
               {bytes(a), vk.arg, vv.arg, kc.arg, vt.arg});
    }
}

void MetalBackend::do_attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& sh,
                                const Tensor& out) {
    const int64_t H = sh.n_head, KV = sh.n_head_kv, D = sh.head_dim, G = H / KV;
    if (D % 8 != 0 || D > kMaxHeadDim)
        throw Error("attention on metal: head_dim " + std::to_string(D) + " is not a multiple of 8 up to " +
                    std::to_string(kMaxHeadDim));
    const View vq = view(q), vo = view(out), vsk = view(sh.sinks);
    // Each sequence's splits and their scratch: the launches run in order, so one scratch serves them all.
    std::vector<int64_t> splits(size_t(n_seqs), 1);
    uint64_t part_bytes = 0;
    for (int64_t i = 0; i < n_seqs; ++i) {
        const KvSeq& s = seqs[i];
        const int64_t groups = (s.ntok * G + kRows - 1) / kRows * KV;
        const int64_t keys = sh.window > 0 ? std::min(s.n0 + s.ntok, sh.window + kRows) : s.n0 + s.ntok;
        splits[size_t(i)] = s.ntok == 0 ? 1 : key_splits(groups, keys);
        if (splits[size_t(i)] > 1)
            part_bytes =
                std::max(part_bytes, uint64_t(s.ntok * H * splits[size_t(i)] * (D + 2)) * sizeof(float));
    }
    const KernelArg part = part_bytes > 0 ? scratch(part_bytes) : vo.arg;
    const uint32_t shmem =
        uint32_t((kRows * D + 2 * kChunk * kRows + 4 * kRows + kRows * kRows) * sizeof(float));
    for (int64_t i = 0; i < n_seqs; ++i) {
        const KvSeq& s = seqs[i];
        if (s.ntok == 0) continue;
        const bool rows = rows_cache(s);
        const View kc = view(s.k), vc = view(rows ? s.v : s.vt), ks = view(s.k_scale), vs = view(s.v_scale);
        const int64_t n_split = splits[size_t(i)];
        RgAttentionArgs a{};
        a.q = vq.shape, a.k = kc.shape, a.v = vc.shape, a.out = vo.shape, a.k_scale = ks.shape,
        a.v_scale = vs.shape;
        a.t0 = s.t0, a.ntok = s.ntok, a.n0 = s.n0, a.cap = s.k.rows / KV, a.window = sh.window;
        a.n_head = int32_t(H), a.n_head_kv = int32_t(KV), a.head_dim = int32_t(D),
        a.n_split = int32_t(n_split);
        a.scale = sh.scale;
        a.has_sinks = sh.sinks ? 1 : 0;
        const int64_t tiles = (s.ntok * G + kRows - 1) / kRows;
        const char* kernel = rows                          ? "rg_attention_rows"
                             : s.k.type == RG_TYPE_F16 ? "rg_attention_f16"
                                                       : "rg_attention_f32";
        launch(kernel, uint32_t(tiles * KV), uint32_t(n_split), 128,
               shmem + (rows ? uint32_t(kRowsTile * sizeof(float)) : 0u),
               {bytes(a), vq.arg, kc.arg, vc.arg, vo.arg, part, ks ? ks.arg : kc.arg, vs ? vs.arg : vc.arg,
                sh.sinks ? vsk.arg : vq.arg});
        if (n_split > 1) {
            RgAttnMergeArgs m{};
            m.out = vo.shape, m.t0 = s.t0, m.n_head = int32_t(H), m.heads_per_row = int32_t(H);
            m.head_dim = int32_t(D), m.n_split = int32_t(n_split), m.has_sinks = sh.sinks ? 1 : 0;
            launch("rg_attention_merge", uint32_t(s.ntok * H), 1, simd_threads(D),
                   uint32_t(n_split * sizeof(float)), {bytes(m), part, vo.arg, vo.arg, sh.sinks ? vsk.arg : vo.arg});
        }
    }
}

}  // namespace regolith::metal
