#include <tuple>

#include "core/backend_check_cases.h"
#include "core/quantize.h"

namespace regolith::check {

namespace {

constexpr QsaDims kQsa{4, 2, 16, 3, 16, 4, 2, 8, 1e-6f};

// A QSA sequence with random keys for its first n0 + ntok tokens (the step's already appended).
QsaSeq qsa_seq(Run& r, int64_t n0, int64_t t0, int64_t ntok) {
    const int64_t cap = 48;
    std::vector<int64_t> pos(static_cast<size_t>(cap * 3));
    for (int64_t i = 0; i < cap; ++i) pos[size_t(3 * i)] = i, pos[size_t(3 * i + 1)] = i / 3, pos[size_t(3 * i + 2)] = i % 5;
    return {r.f32(cap * kQsa.n_head_kv, kQsa.head_dim), r.f32(cap * kQsa.n_head_kv, kQsa.head_dim),
            r.f32(cap, kQsa.index_head_dim), r.f32(cap / kQsa.ratio, kQsa.index_head_dim),
            r.ints(RG_TYPE_I64, cap, 3, pos), n0, t0, ntok, {}, {}, {}, {}};
}

// rows x cols of random floats stored as an attention cache of `type` on the host (quantize.h's quantizers,
// the ones the CPU's store_rows runs), with its I8 scales [rows][1] (else empty).
std::pair<Tensor, Tensor> cache_rows(Run& r, uint32_t type, int64_t rows, int64_t cols) {
    const std::vector<float> x = r.floats(rows * cols);
    if (type == RG_TYPE_F32) return {r.put(type, rows, cols, x.data()), Tensor{}};
    if (type == RG_TYPE_I8) {
        std::vector<int8_t> q(x.size());
        std::vector<float> s(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i)
            s[size_t(i)] = quantize_i8_row(&x[size_t(i * cols)], &q[size_t(i * cols)], cols);
        return {r.put(type, rows, cols, q.data()), r.put(RG_TYPE_F32, rows, 1, s.data())};
    }
    const size_t row = quantized_row_bytes(type, cols);
    std::vector<uint8_t> bytes(row * size_t(rows));
    for (int64_t i = 0; i < rows; ++i)
        quantize_row(type, &x[size_t(i * cols)], &bytes[size_t(i) * row], cols);
    return {r.put(type, rows, cols, bytes.data()), Tensor{}};
}

// qsa_seq with its four caches of `type` (head dims of 32: whole Q8_0 blocks).
constexpr QsaDims kQsaCache{4, 2, 32, 3, 32, 4, 2, 8, 1e-6f};
QsaSeq qsa_cache_seq(Run& r, uint32_t type, int64_t n0, int64_t t0, int64_t ntok) {
    const QsaDims& d = kQsaCache;
    const int64_t cap = 48;
    std::vector<int64_t> pos(static_cast<size_t>(cap * 3));
    for (int64_t i = 0; i < cap; ++i)
        pos[size_t(3 * i)] = i, pos[size_t(3 * i + 1)] = i / 3, pos[size_t(3 * i + 2)] = i % 5;
    QsaSeq s;
    std::tie(s.k, s.k_scale) = cache_rows(r, type, cap * d.n_head_kv, d.head_dim);
    std::tie(s.v, s.v_scale) = cache_rows(r, type, cap * d.n_head_kv, d.head_dim);
    std::tie(s.index_k, s.index_k_scale) = cache_rows(r, type, cap, d.index_head_dim);
    std::tie(s.block_k, s.block_k_scale) = cache_rows(r, type, cap / d.ratio, d.index_head_dim);
    s.pos = r.ints(RG_TYPE_I64, cap, 3, pos);
    s.n0 = n0, s.t0 = t0, s.ntok = ntok;
    return s;
}

// qsa_attend of 8 tokens (5 of seqs[0], 3 of seqs[1]), each attending its first and last complete block
// (ascending, as qsa_select gives them) and its tail.
void attend_first_and_last_blocks(Run& r, const QsaDims& d, const QsaSeq (&seqs)[2]) {
    std::vector<int32_t> sel(static_cast<size_t>(8 * d.topk)), n_sel(8);
    for (int64_t t = 0; t < 8; ++t) {
        const QsaSeq& s = t < 5 ? seqs[0] : seqs[1];
        const int64_t nb = (s.n0 + (t - s.t0) + 1) / d.ratio, k = std::min(d.topk, nb);
        n_sel[size_t(t)] = int32_t(k);
        if (k >= 1) sel[size_t(t * d.topk)] = int32_t(k == 2 ? 0 : nb - 1);
        if (k == 2) sel[size_t(t * d.topk + 1)] = int32_t(nb - 1);
    }
    const int64_t rows = 8 * d.n_head;
    const Tensor q = r.f32(rows, d.head_dim), gate = r.f32(rows, d.head_dim, -3.0f, 3.0f);
    const Tensor out = r.zeros(RG_TYPE_F32, rows, d.head_dim);
    r.be().qsa_attend(q, gate, r.ints(RG_TYPE_I32, 8, d.topk, sel), r.ints(RG_TYPE_I32, 1, 8, n_sel), seqs, 2, d,
                      out);
    r.out(out);
}

}  // namespace

void add_cache_cases(std::vector<Case>& cs) {
    for (uint32_t type : {RG_TYPE_F32, RG_TYPE_F16, RG_TYPE_Q8_0, RG_TYPE_I8}) {
        const std::string name = cache_type_name(type);
        cs.push_back({"store_rows", name + ", 37 rows of 64, magnitudes 2^-20 .. 2^10, a zero row", kExact,
                      [=](Run& r) {
                          std::vector<float> x = r.floats(37 * 64);
                          for (int64_t i = 0; i < 37; ++i)
                              for (int64_t j = 0; j < 64; ++j)
                                  x[size_t(i * 64 + j)] *= std::exp2(float(i % 31 - 20));
                          std::fill_n(x.begin() + 5 * 64, 64, 0.0f);
                          const Tensor dst = r.zeros(type, 37, 64);
                          const Tensor scale = type == RG_TYPE_I8 ? r.zeros(RG_TYPE_F32, 37, 1) : Tensor{};
                          r.be().store_rows(r.put(RG_TYPE_F32, 37, 64, x.data()), dst, scale);
                          r.out(dst);
                          if (scale) r.out(scale);
                      },
                      type});
        if (type == RG_TYPE_F32) continue;  // the F32 QSA cases are below
        const auto tables = [](Run& r) {
            const int64_t half = kQsaCache.n_rot / 2;
            std::vector<float> freq(static_cast<size_t>(half));
            std::vector<int32_t> axis(static_cast<size_t>(half));
            for (int64_t i = 0; i < half; ++i)
                freq[size_t(i)] = 1.0f / std::pow(1e4f, float(2 * i) / float(kQsaCache.n_rot)),
                axis[size_t(i)] = int32_t(i % 3);
            return std::make_pair(r.put(RG_TYPE_F32, 1, half, freq.data()),
                                  r.ints(RG_TYPE_I32, 1, half, axis));
        };
        cs.push_back({"qsa_pool", name + " caches, 2 sequences completing blocks", kCacheRounding,
                      [=](Run& r) {
                          const QsaSeq seqs[] = {qsa_cache_seq(r, type, 37, 0, 5),
                                                 qsa_cache_seq(r, type, 2, 5, 9)};
                          const auto [freq, axis] = tables(r);
                          r.be().qsa_pool(seqs, 2, r.f32(1, kQsaCache.index_head_dim), freq, axis, kQsaCache);
                          for (const QsaSeq& s : seqs) {
                              r.out(s.block_k);
                              if (s.block_k_scale) r.out(s.block_k_scale);
                          }
                      },
                      type});
        cs.push_back({"qsa_select", name + " caches, 2 sequences, top 2 of up to 10 blocks", kExact,
                      [=](Run& r) {
                          const QsaSeq seqs[] = {qsa_cache_seq(r, type, 37, 0, 5),
                                                 qsa_cache_seq(r, type, 2, 5, 3)};
                          const Tensor iq = r.f32(8, kQsaCache.index_n_head * kQsaCache.index_head_dim);
                          const Tensor sel = r.zeros(RG_TYPE_I32, 8, kQsaCache.topk),
                                       n_sel = r.zeros(RG_TYPE_I32, 1, 8);
                          r.be().qsa_select(iq, seqs, 2, kQsaCache, sel, n_sel);
                          r.out(sel), r.out(n_sel);
                      },
                      type});
        cs.push_back(
            {"qsa_attend", name + " caches, 2 sequences, selected blocks and tails", kComposite,
             [=](Run& r) {
                 const QsaSeq seqs[] = {qsa_cache_seq(r, type, 37, 0, 5), qsa_cache_seq(r, type, 2, 5, 3)};
                 attend_first_and_last_blocks(r, kQsaCache, seqs);
             },
             type});
    }
}

void add_qsa_cases(std::vector<Case>& cs) {
    const auto tables = [](Run& r) {
        const int64_t half = kQsa.n_rot / 2;
        std::vector<float> freq(static_cast<size_t>(half));
        std::vector<int32_t> axis(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i) freq[size_t(i)] = 1.0f / std::pow(1e4f, float(2 * i) / float(kQsa.n_rot)), axis[size_t(i)] = int32_t(i % 3);
        return std::make_pair(r.put(RG_TYPE_F32, 1, half, freq.data()), r.ints(RG_TYPE_I32, 1, half, axis));
    };
    cs.push_back({"qsa_pool", "2 sequences completing blocks", kReduction, [=](Run& r) {
                      const QsaSeq seqs[] = {qsa_seq(r, 37, 0, 5), qsa_seq(r, 2, 5, 9)};
                      const auto [freq, axis] = tables(r);
                      r.be().qsa_pool(seqs, 2, r.f32(1, kQsa.index_head_dim), freq, axis, kQsa);
                      r.out(seqs[0].block_k), r.out(seqs[1].block_k);
                  }});
    cs.push_back({"qsa_select", "2 sequences, top 2 of up to 10 blocks", kExact, [](Run& r) {
                      const QsaSeq seqs[] = {qsa_seq(r, 37, 0, 5), qsa_seq(r, 2, 5, 3)};
                      const Tensor iq = r.f32(8, kQsa.index_n_head * kQsa.index_head_dim);
                      const Tensor sel = r.zeros(RG_TYPE_I32, 8, kQsa.topk), n_sel = r.zeros(RG_TYPE_I32, 1, 8);
                      r.be().qsa_select(iq, seqs, 2, kQsa, sel, n_sel);
                      r.out(sel), r.out(n_sel);
                  }});
    // Many blocks (more than a GPU threadgroup takes at once) in runs of 3 with the same pooled key, so the
    // top 40 must break ties the CPU's way (the lower block) at the cut and inside the selection.
    cs.push_back({"qsa_select", "598 blocks in runs of 3 equal keys, top 40, ties", kExact, [](Run& r) {
                      constexpr QsaDims d{2, 1, 16, 2, 12, 2, 40, 4, 1e-6f};
                      const int64_t cap = 1200, n0 = 1196, ntok = 3, nb = cap / d.ratio;
                      const std::vector<float> distinct = r.floats((nb / 3 + 1) * d.index_head_dim);
                      std::vector<float> keys(static_cast<size_t>(nb * d.index_head_dim));
                      for (int64_t b = 0; b < nb; ++b)
                          std::copy_n(&distinct[size_t(b / 3 * d.index_head_dim)], d.index_head_dim,
                                      &keys[size_t(b * d.index_head_dim)]);
                      const QsaSeq seq{r.f32(cap * d.n_head_kv, d.head_dim), r.f32(cap * d.n_head_kv, d.head_dim),
                                       r.f32(cap, d.index_head_dim), r.put(RG_TYPE_F32, nb, d.index_head_dim, keys.data()),
                                       r.zeros(RG_TYPE_I64, cap, 3), n0, 0, ntok, {}, {}, {}, {}};
                      const Tensor iq = r.f32(ntok, d.index_n_head * d.index_head_dim);
                      const Tensor sel = r.zeros(RG_TYPE_I32, ntok, d.topk), n_sel = r.zeros(RG_TYPE_I32, 1, ntok);
                      r.be().qsa_select(iq, &seq, 1, d, sel, n_sel);
                      r.out(sel), r.out(n_sel);
                  }});
    cs.push_back({"qsa_attend", "2 sequences, selected blocks and tails", kComposite, [](Run& r) {
                      const QsaSeq seqs[] = {qsa_seq(r, 37, 0, 5), qsa_seq(r, 2, 5, 3)};
                      attend_first_and_last_blocks(r, kQsa, seqs);
                  }});
    // Flash-Next's attention heads (16 of 256, 2 KV heads) over a few hundred keys: 16 selected blocks and a tail
    cs.push_back({"qsa_attend", "head_dim 256, 8 query heads per KV head, 259 keys", kComposite, [](Run& r) {
                      constexpr QsaDims d{16, 2, 256, 1, 16, 16, 16, 8, 1e-6f};
                      const int64_t cap = 320, n0 = 290, ntok = 2;
                      const QsaSeq seq{r.f32(cap * d.n_head_kv, d.head_dim), r.f32(cap * d.n_head_kv, d.head_dim),
                                       r.f32(cap, d.index_head_dim), r.f32(cap / d.ratio, d.index_head_dim),
                                       r.zeros(RG_TYPE_I64, cap, 3), n0, 0, ntok, {}, {}, {}, {}};
                      std::vector<int32_t> sel(static_cast<size_t>(ntok * d.topk)), n_sel(ntok, int32_t(d.topk));
                      for (int64_t t = 0; t < ntok; ++t)
                          for (int64_t b = 0; b < d.topk; ++b) sel[size_t(t * d.topk + b)] = int32_t(b + b / 8);
                      const int64_t rows = ntok * d.n_head;
                      const Tensor q = r.f32(rows, d.head_dim), gate = r.f32(rows, d.head_dim, -3.0f, 3.0f);
                      const Tensor out = r.zeros(RG_TYPE_F32, rows, d.head_dim);
                      r.be().qsa_attend(q, gate, r.ints(RG_TYPE_I32, ntok, d.topk, sel), r.ints(RG_TYPE_I32, 1, ntok, n_sel),
                                        &seq, 1, d, out);
                      r.out(out);
                  }});
}

void add_attention_cases(std::vector<Case>& cs) {
    for (uint32_t type : {RG_TYPE_F32, RG_TYPE_F16})
        for (int64_t window : {0, 8})
            cs.push_back({"attention", type_name(type) + " cache, GQA 4/2, window " + std::to_string(window) + ", 2 sequences",
                          kComposite, [=](Run& r) {
                              const int64_t KV = 2, H = 4, D = 16, cap = 64;
                              std::vector<KvSeq> seqs;
                              for (auto [n0, t0, ntok] : {std::array<int64_t, 3>{20, 0, 5}, std::array<int64_t, 3>{0, 5, 3}}) {
                                  const Tensor k = r.weights(type, KV * cap, D), vt = r.weights(type, KV * D, cap);
                                  seqs.push_back({k, vt, n0, t0, ntok, {}, {}, {}});
                              }
                              const Tensor kn = r.f32(8, KV * D), vn = r.f32(8, KV * D);
                              r.be().kv_append(kn, vn, seqs.data(), 2, KV);
                              const Tensor q = r.f32(8, H * D), out = r.zeros(RG_TYPE_F32, 8, H * D);
                              r.be().attention(q, seqs.data(), 2, {H, KV, D, window, 0.25f}, out);
                              for (const KvSeq& s : seqs) r.out(s.k), r.out(s.vt);
                              r.out(out);
                          }});
    // Q8_0 / I8 caches: key and value rows
    for (uint32_t type : {RG_TYPE_Q8_0, RG_TYPE_I8})
        for (int64_t window : {0, 8})
            cs.push_back({"attention",
                          std::string(cache_type_name(type)) + " cache, GQA 4/2, window " +
                              std::to_string(window) + ", 2 sequences",
                          kComposite,
                          [=](Run& r) {
                              const int64_t KV = 2, H = 4, D = 32, cap = 64;
                              std::vector<KvSeq> seqs;
                              for (auto [n0, t0, ntok] :
                                   {std::array<int64_t, 3>{20, 0, 5}, std::array<int64_t, 3>{0, 5, 3}}) {
                                  KvSeq s{};
                                  std::tie(s.k, s.k_scale) = cache_rows(r, type, KV * cap, D);
                                  std::tie(s.v, s.v_scale) = cache_rows(r, type, KV * cap, D);
                                  s.n0 = n0, s.t0 = t0, s.ntok = ntok;
                                  seqs.push_back(s);
                              }
                              const Tensor kn = r.f32(8, KV * D), vn = r.f32(8, KV * D);
                              r.be().kv_append(kn, vn, seqs.data(), 2, KV);
                              const Tensor q = r.f32(8, H * D), out = r.zeros(RG_TYPE_F32, 8, H * D);
                              r.be().attention(q, seqs.data(), 2, {H, KV, D, window, 0.25f}, out);
                              for (const KvSeq& s : seqs) {
                                  r.out(s.k), r.out(s.v);
                                  if (s.k_scale) r.out(s.k_scale), r.out(s.v_scale);
                              }
                              r.out(out);
                          },
                          type});
    // gpt-oss's attention sinks: per-head logits in the softmax, with and without a window; over a few hundred
    // keys too (backends that split the keys merge the sink once)
    for (uint32_t type : {RG_TYPE_F32, RG_TYPE_F16, RG_TYPE_Q8_0})
        for (int64_t window : {0, 8})
            cs.push_back({"attention",
                          std::string(cache_type_name(type)) + " cache, sinks, window " + std::to_string(window) +
                              ", 3 tokens after 300",
                          kComposite,
                          [=](Run& r) {
                              const int64_t KV = 2, H = 4, D = 64, cap = 320;
                              KvSeq s{};
                              if (type == RG_TYPE_Q8_0) {
                                  std::tie(s.k, s.k_scale) = cache_rows(r, type, KV * cap, D);
                                  std::tie(s.v, s.v_scale) = cache_rows(r, type, KV * cap, D);
                              } else {
                                  s.k = r.weights(type, KV * cap, D), s.vt = r.weights(type, KV * D, cap);
                              }
                              s.n0 = 300, s.ntok = 3;
                              r.be().kv_append(r.f32(3, KV * D), r.f32(3, KV * D), &s, 1, KV);
                              const Tensor q = r.f32(3, H * D), out = r.zeros(RG_TYPE_F32, 3, H * D);
                              AttentionShape sh{H, KV, D, window, 0.125f};
                              sh.sinks = r.f32(1, H, -2.0f, 6.0f);
                              r.be().attention(q, &s, 1, sh, out);
                              r.out(out);
                          },
                          type == RG_TYPE_Q8_0 ? type : uint32_t(RG_TYPE_F32)});
    // gemma3's heads (head_dim 256) over a few hundred keys
    for (uint32_t type : {RG_TYPE_F32, RG_TYPE_F16})
        cs.push_back({"attention", type_name(type) + " cache, head_dim 256, 2 tokens after 300", kComposite, [=](Run& r) {
                          const int64_t KV = 1, H = 4, D = 256, cap = 320;
                          const KvSeq seq{r.weights(type, KV * cap, D), r.weights(type, KV * D, cap), 300, 0, 2, {}, {}, {}};
                          r.be().kv_append(r.f32(2, KV * D), r.f32(2, KV * D), &seq, 1, KV);
                          const Tensor q = r.f32(2, H * D), out = r.zeros(RG_TYPE_F32, 2, H * D);
                          r.be().attention(q, &seq, 1, {H, KV, D, 0, 0.0625f}, out);
                          r.out(out);
                      }});
}

}  // namespace regolith::check
