#include "model/qsa_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/errors.h"
#include "core/gguf_set.h"
#include "core/types.h"
#include "model/metadata.h"
#include "model/state_move.h"
#include "model/weights.h"

namespace regolith {

namespace {

bool same_shape(const QsaShape& a, const QsaShape& b) {
    return a.hidden == b.hidden && a.n_head == b.n_head && a.n_head_kv == b.n_head_kv && a.head_dim == b.head_dim &&
           a.index_n_head == b.index_n_head && a.index_head_dim == b.index_head_dim &&
           a.compress_ratio == b.compress_ratio;
}

}  // namespace

// ---- state ------------------------------------------------------------------------------------------------

QsaState::QsaState(Backend& be, const QsaShape& shape, int64_t max_ctx, uint32_t cache_type)
    : be_(&be), shape_(shape), max_ctx_(max_ctx), type_(cache_type) {
    if (max_ctx < 1) throw Error("QSA state: max_ctx must be at least 1, got " + std::to_string(max_ctx));
    check_cache_type(be, shape, cache_type);
}

void QsaState::check_cache_type(const Backend& be, const QsaShape& shape, uint32_t cache_type) {
    if (std::string(cache_type_name(cache_type)) == "unknown")
        throw Error("QSA state: type id " + std::to_string(cache_type) + " is not an attention cache type");
    if (cache_type == RG_TYPE_Q8_0 && (shape.head_dim % QK8_0 != 0 || shape.index_head_dim % QK8_0 != 0))
        throw Error("QSA state: a q8_0 cache needs key lengths that are multiples of 32, not " +
                    std::to_string(shape.head_dim) + " and " + std::to_string(shape.index_head_dim));
    if (!be.supports_cache(cache_type))
        throw Error(std::string("QSA state: the ") + be.name() + " backend has no kernels for " +
                    cache_type_name(cache_type) + " attention caches");
}

uint64_t QsaState::bytes() const {
    uint64_t n = 0;
    for (const OwnedTensor* t :
         {&k_, &v_, &index_k_, &block_k_, &pos_, &k_scale_, &v_scale_, &index_k_scale_, &block_k_scale_})
        if (t->t) n += t->buffer.bytes();
    return n;
}

void QsaState::reserve(int64_t n) {
    if (n <= cap_) return;
    const QsaShape& s = shape_;
    const int64_t cap = std::min(max_ctx_, std::max({n, 2 * cap_, int64_t(64)})), r = s.compress_ratio;
    const int64_t kv_rows = cap * s.n_head_kv, blocks = std::max<int64_t>(cap / r, 1);
    OwnedTensor k(*be_, type_, kv_rows, s.head_dim), v(*be_, type_, kv_rows, s.head_dim);
    OwnedTensor ik(*be_, type_, cap, s.index_head_dim), bk(*be_, type_, blocks, s.index_head_dim);
    OwnedTensor pos(*be_, RG_TYPE_I64, cap, 3);
    OwnedTensor ks, vs, iks, bks;
    if (type_ == RG_TYPE_I8) {
        ks = OwnedTensor(*be_, RG_TYPE_F32, kv_rows, 1), vs = OwnedTensor(*be_, RG_TYPE_F32, kv_rows, 1);
        iks = OwnedTensor(*be_, RG_TYPE_F32, cap, 1), bks = OwnedTensor(*be_, RG_TYPE_F32, blocks, 1);
    }
    // the first `rows` rows of a tensor of the old storage into the new one
    const auto keep = [&](const OwnedTensor& from, const OwnedTensor& to, int64_t rows) {
        if (rows > 0 && from.t) be_->copy(from.t.row_range(0, rows), to.t.row_range(0, rows));
    };
    const int64_t held[] = {n_ * s.n_head_kv, n_ * s.n_head_kv, n_, n_ / r};
    const OwnedTensor* olds[] = {&k_,       &v_,       &index_k_,       &block_k_,
                                 &k_scale_, &v_scale_, &index_k_scale_, &block_k_scale_};
    const OwnedTensor* news[] = {&k, &v, &ik, &bk, &ks, &vs, &iks, &bks};
    for (int i = 0; i < 8; ++i) keep(*olds[i], *news[i], held[i % 4]);
    keep(pos_, pos, n_);
    k_ = std::move(k), v_ = std::move(v), index_k_ = std::move(ik), block_k_ = std::move(bk), pos_ = std::move(pos);
    k_scale_ = std::move(ks), v_scale_ = std::move(vs), index_k_scale_ = std::move(iks),
    block_k_scale_ = std::move(bks);
    cap_ = cap;
}

void QsaState::truncate(int64_t n) {
    if (n < 0 || n > n_)
        throw Error("QSA state: cannot truncate to " + std::to_string(n) + " tokens, it holds " + std::to_string(n_));
    n_ = n;  // complete blocks below n are unchanged; the storage is kept for reuse
}

void QsaState::state_tensors(int64_t from, int64_t to, std::vector<Tensor>& out) const {
    if (from < 0 || from > to || to > n_)
        throw Error("QSA state: tokens [" + std::to_string(from) + ", " + std::to_string(to) + ") of " +
                    std::to_string(n_));
    const QsaShape& s = shape_;
    const auto rows = [&](const OwnedTensor& t, int64_t per_token, int64_t lo, int64_t hi) {
        if (hi > lo) out.push_back(t.t.row_range(lo * per_token, (hi - lo) * per_token));
    };
    rows(k_, s.n_head_kv, from, to);
    rows(v_, s.n_head_kv, from, to);
    rows(index_k_, 1, from, to);
    rows(pos_, 1, from, to);
    rows(block_k_, 1, from / s.compress_ratio, to / s.compress_ratio);
    if (type_ == RG_TYPE_I8) {
        rows(k_scale_, s.n_head_kv, from, to);
        rows(v_scale_, s.n_head_kv, from, to);
        rows(index_k_scale_, 1, from, to);
        rows(block_k_scale_, 1, from / s.compress_ratio, to / s.compress_ratio);
    }
}

void QsaState::grow(int64_t n) {
    if (n < n_ || n > max_ctx_)
        throw Error("QSA state: cannot grow from " + std::to_string(n_) + " to " + std::to_string(n) +
                    " tokens (max " + std::to_string(max_ctx_) + ")");
    reserve(n);
    n_ = n;
}

void QsaState::move_state(const uint8_t* saved, size_t saved_bytes, int64_t total, const std::vector<float>& freq,
                          int64_t src, int64_t to, int64_t n, const std::vector<StateSpan>& dst) const {
    const QsaShape& s = shape_;
    const int64_t KV = s.n_head_kv, D = s.head_dim, ID = s.index_head_dim, r = s.compress_ratio;
    if (src < 0 || n < 0 || src + n > total || 2 * int64_t(freq.size()) > D)
        throw Error("QSA state: cannot move tokens [" + std::to_string(src) + ", " + std::to_string(src + n) +
                    ") of a saved state of " + std::to_string(total));
    if (n == 0) return;
    const bool i8 = type_ == RG_TYPE_I8;
    const auto row_bytes = [&](int64_t cols) { return i8 ? cols : type_row_bytes(*type_traits(type_), cols); };
    const int64_t kb = row_bytes(D), ib = row_bytes(ID);
    // state_tensors' items over tokens [lo, hi): keys, values, indexer keys, positions, block keys, then
    // I8's scales of the four
    const auto items = [&](int64_t lo, int64_t hi) {
        const int64_t len = hi - lo, blocks = hi / r - lo / r;
        std::vector<size_t> b{size_t(len * KV * kb), size_t(len * KV * kb), size_t(len * ib), size_t(len * 3 * 8),
                              size_t(blocks * ib)};
        if (i8)
            for (int64_t rows : {len * KV, len * KV, len, blocks}) b.push_back(size_t(rows) * sizeof(float));
        return b;
    };
    MovedItems m(saved, saved_bytes, items(0, total), items(to, to + n), dst, "QSA state");
    const RopeShift turn(freq, to - src);
    std::vector<float> buf(static_cast<size_t>(D));
    for (int64_t i = 0; i < n * KV; ++i)  // keys: rows (token, head)
        move_key_row(type_, m.in(0) + (src * KV + i) * kb,
                     i8 ? reinterpret_cast<const float*>(m.in(5)) + src * KV + i : nullptr, m.out(0) + i * kb,
                     i8 ? reinterpret_cast<float*>(m.out(5)) + i : nullptr, D, turn, buf.data());
    std::memcpy(m.out(1), m.in(1) + src * KV * kb, size_t(n * KV * kb));  // values
    std::memcpy(m.out(2), m.in(2) + src * ib, size_t(n * ib));            // indexer keys
    const auto* pos = reinterpret_cast<const int64_t*>(m.in(3)) + src * 3;
    auto* moved = reinterpret_cast<int64_t*>(m.out(3));
    for (int64_t i = 0; i < n * 3; ++i) moved[i] = pos[i] + (to - src);  // every M-RoPE axis moves alike
    if (i8) {  // the values' and indexer keys' scales; the block keys (left zero) are pooled again
        std::memcpy(m.out(6), m.in(6) + src * KV * sizeof(float), size_t(n * KV) * sizeof(float));
        std::memcpy(m.out(7), m.in(7) + src * sizeof(float), size_t(n) * sizeof(float));
    }
    m.scatter();
}

QsaSeq QsaState::seq(int64_t t0, int64_t ntok) const {
    return {k_.t, v_.t, index_k_.t, block_k_.t, pos_.t,           n_,
            t0,   ntok, k_scale_.t, v_scale_.t, index_k_scale_.t, block_k_scale_.t};
}

// ---- layer ------------------------------------------------------------------------------------------------

QsaAttention::QsaAttention(const ModelWeights& wt, int64_t layer) : shape_(qsa_shape_from_gguf(wt.file(), layer)) {
    const QsaShape& s = shape_;
    auto fail = [](const std::string& what) { throw ModelFormatError("QSA layer: " + what); };
    if (s.hidden <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 || s.index_n_head <= 0 ||
        s.index_head_dim <= 0 || s.compress_ratio <= 0 || s.index_budget < 0)
        fail("every dimension must be positive");
    if (s.n_head % s.n_head_kv != 0) fail("head_count must be a multiple of head_count_kv");
    if (s.n_rot < 0 || s.n_rot % 2 != 0 || s.n_rot > s.head_dim || s.n_rot > s.index_head_dim)
        fail("rope.dimension_count " + std::to_string(s.n_rot) +
             " must be even and at most key_length and indexer key_length");
    with_context("qwen4exp QSA layer " + std::to_string(layer) + ": ", [&] {
        const std::string blk = "blk." + std::to_string(layer) + ".";
        w_.q = wt.matrix(blk + "attn_q.weight", s.n_head * 2 * s.head_dim, s.hidden);
        w_.k = wt.matrix(blk + "attn_k.weight", s.n_head_kv * s.head_dim, s.hidden);
        w_.v = wt.matrix(blk + "attn_v.weight", s.n_head_kv * s.head_dim, s.hidden);
        w_.o = wt.matrix(blk + "attn_output.weight", s.hidden, s.n_head * s.head_dim);
        w_.q_norm = wt.f32_vector(blk + "attn_q_norm.weight", s.head_dim);
        w_.k_norm = wt.f32_vector(blk + "attn_k_norm.weight", s.head_dim);
        w_.index_q = wt.matrix(blk + "indexer.q_proj.weight", s.index_n_head * s.index_head_dim, s.hidden);
        w_.index_k = wt.matrix(blk + "indexer.k_proj.weight", s.index_head_dim, s.hidden);
        w_.index_q_norm = wt.f32_vector(blk + "indexer.q_norm.weight", s.index_head_dim);
        w_.index_k_norm = wt.f32_vector(blk + "indexer.k_norm.weight", s.index_head_dim);
        return 0;
    });

    // inv_freq[i] = 1 / base^(2i / n_rot), in float32 as transformers computes it
    const int64_t half = s.n_rot / 2;
    std::vector<float> freq(static_cast<size_t>(std::max<int64_t>(half, 1)));
    std::vector<int32_t> axis(freq.size());
    for (int64_t i = 0; i < half; ++i) {
        freq[size_t(i)] = 1.0f / std::pow(s.rope_base, float(2 * i) / float(s.n_rot));
        axis[size_t(i)] = i % 3 == 1 && i < 3 * s.rope_sections[1] ? 1 : i % 3 == 2 && i < 3 * s.rope_sections[2] ? 2 : 0;
    }
    freq_ = wt.store().upload(RG_TYPE_F32, 1, half, freq.data());
    axis_ = wt.store().upload(RG_TYPE_I32, 1, half, axis.data());
    freq.resize(size_t(half));
    freq_host_ = std::move(freq);
}

void QsaAttention::pool(Workspace& ws, QsaState& st, int64_t from) const {
    if (from < 0 || from > st.n_) throw Error("QSA state: cannot pool from token " + std::to_string(from));
    QsaSeq seq = st.seq(0, st.n_ - from);
    seq.n0 = from;
    ws.backend().qsa_pool(&seq, 1, w_.index_k_norm, freq_, axis_, shape_.dims());
}

void QsaAttention::forward(Workspace& ws, const Tensor& x, const int64_t* pos3, QsaState& st, const Tensor& y) const {
    forward(ws, x, {QsaRows{&st, pos3, 0, x.rows}}, y);
}

void QsaAttention::forward(Workspace& ws, const Tensor& x, const std::vector<QsaRows>& seqs, const Tensor& y) const {
    const QsaShape& s = shape_;
    const int64_t ntok = x.rows;
    if (ntok == 0) return;
    for (const QsaRows& q : seqs) {
        const QsaState& st = *q.state;
        if (!same_shape(st.shape_, s)) throw Error("QSA forward: the state was made for a layer of another shape");
        if (st.n_ + q.ntok > st.max_ctx_)
            throw Error("QSA context full: the state holds " + std::to_string(st.n_) + " of " +
                        std::to_string(st.max_ctx_) + " tokens and cannot take " + std::to_string(q.ntok) +
                        " more; use a larger context or truncate the state");
    }
    Backend& be = ws.backend();
    Workspace::Scope scope(ws);
    const int64_t H = s.n_head, KV = s.n_head_kv, D = s.head_dim, IH = s.index_n_head, ID = s.index_head_dim;

    // projections
    const Tensor qg = ws.f32(ntok, H * 2 * D);  // [ntok][H][2][D]: per head q, then gate
    const Tensor kx = ws.f32(ntok, KV * D);     // [ntok][KV][D]
    const Tensor vx = ws.f32(ntok, KV * D);     // [ntok][KV][D]
    const Tensor iq = ws.f32(ntok, IH * ID);    // [ntok][IH][ID]
    const Tensor ik = ws.f32(ntok, ID);         // [ntok][ID]
    const MatmulJob in[] = {{w_.q, x, qg}, {w_.k, x, kx}, {w_.v, x, vx}, {w_.index_q, x, iq}, {w_.index_k, x, ik}};
    be.matmul(in, 5);

    // queries (normed, rotated) and the new tokens' keys, values, raw indexer keys and positions into the states
    const Tensor pos = ws.alloc(RG_TYPE_I64, ntok, 3);  // [ntok][3] every row's position
    for (const QsaRows& q : seqs) {
        q.state->reserve(q.state->n_ + q.ntok);
        be.write(q.state->pos_.t.row_range(q.state->n_, q.ntok), q.pos3);
        be.write(pos.row_range(q.t0, q.ntok), q.pos3);
    }
    const Tensor rot = ws.f32(ntok, s.n_rot);  // [ntok][cos | sin of each rotary pair]
    be.rope_table(pos, freq_, axis_, rot);
    const Tensor heads = qg.reshaped(ntok * H, 2 * D);
    const Tensor q = ws.f32(ntok * H, D);  // [ntok][H][D]
    be.rms_norm(heads.col_range(0, D), w_.q_norm, s.eps, q);
    be.rope(q, rot, H);
    // a cache's rows [r0, r0 + n) and their scales (I8)
    const auto rows = [](const OwnedTensor& t, const OwnedTensor& scale, int64_t r0, int64_t n) {
        return std::make_pair(t.t.row_range(r0, n), scale.t ? scale.t.row_range(r0, n) : Tensor{});
    };
    const Tensor k = ws.f32(ntok * KV, D);
    be.rms_norm(kx.reshaped(ntok * KV, D), w_.k_norm, s.eps, k);
    be.rope(k, rot, KV);
    const Tensor v = vx.reshaped(ntok * KV, D);
    for (const QsaRows& r : seqs) {
        const QsaState& st = *r.state;
        const int64_t n0 = st.n_;
        const auto [kc, kcs] = rows(st.k_, st.k_scale_, n0 * KV, r.ntok * KV);
        const auto [vc, vcs] = rows(st.v_, st.v_scale_, n0 * KV, r.ntok * KV);
        const auto [ic, ics] = rows(st.index_k_, st.index_k_scale_, n0, r.ntok);
        be.store_rows(k.row_range(r.t0 * KV, r.ntok * KV), kc, kcs);
        be.store_rows(v.row_range(r.t0 * KV, r.ntok * KV), vc, vcs);
        be.store_rows(ik.row_range(r.t0, r.ntok), ic, ics);
    }
    const Tensor iqh = iq.reshaped(ntok * IH, ID);
    be.rms_norm(iqh, w_.index_q_norm, s.eps, iqh);
    be.rope(iqh, rot, IH);

    // blocks completed by this step, then per query the top blocks, then attention over them and the tail
    const QsaDims d = s.dims();
    std::vector<QsaSeq> qseqs;
    for (const QsaRows& r : seqs) qseqs.push_back(r.state->seq(r.t0, r.ntok));
    const int64_t n_seqs = int64_t(qseqs.size());
    be.qsa_pool(qseqs.data(), n_seqs, w_.index_k_norm, freq_, axis_, d);
    const Tensor sel = ws.i32(ntok, std::max<int64_t>(d.topk, 1));  // [ntok][topk] selected block ids
    const Tensor n_sel = ws.i32(1, ntok);
    be.qsa_select(iq, qseqs.data(), n_seqs, d, sel, n_sel);
    const Tensor attn = ws.f32(ntok * H, D);  // [ntok][H][D]
    be.qsa_attend(q, heads.col_range(D, D), sel, n_sel, qseqs.data(), n_seqs, d, attn);
    for (const QsaRows& r : seqs) r.state->n_ += r.ntok;

    be.matmul(w_.o, attn.reshaped(ntok, H * D), y);
}

// ---- GGUF loading -----------------------------------------------------------------------------------------

namespace {

std::string context(int64_t layer) { return "qwen4exp QSA layer " + std::to_string(layer) + ": "; }

}  // namespace

QsaShape qsa_shape_from_gguf(const GgufSet& file, int64_t layer) {
    return with_context(context(layer), [&] {
        const std::string prefix = meta::require_arch(file, "qwen4exp");
        auto key = [&](const char* suffix) { return prefix + suffix; };
        const int64_t n_layer = meta::require_int(file, key("block_count"));
        if (layer < 0 || layer >= n_layer)
            throw ModelFormatError("no such layer, the model has " + std::to_string(n_layer));

        QsaShape s;
        s.hidden = meta::require_int(file, key("embedding_length"));
        s.n_head = meta::require_int(file, key("attention.head_count"));
        s.n_head_kv = meta::require_int(file, key("attention.head_count_kv"));
        s.head_dim = meta::require_int(file, key("attention.key_length"));
        if (meta::require_int(file, key("attention.value_length")) != s.head_dim)
            throw ModelFormatError("attention.value_length must equal attention.key_length");
        s.n_rot = meta::get_int(file, key("rope.dimension_count")).value_or(s.head_dim);
        s.rope_base = meta::require_float(file, key("rope.freq_base"));
        if (auto sections = meta::get_int_array(file, key("rope.dimension_sections")))
            for (size_t j = 0; j < 3 && j < sections->size(); ++j) s.rope_sections[j] = (*sections)[j];
        s.eps = meta::require_float(file, key("attention.layer_norm_rms_epsilon"));
        s.index_n_head = meta::require_int(file, key("attention.indexer.head_count"));
        s.index_head_dim = meta::require_int(file, key("attention.indexer.key_length"));
        s.index_budget = meta::require_int(file, key("attention.indexer.top_k"));
        const auto ratios = meta::get_int_array(file, key("attention.compress_ratios"), n_layer);
        if (!ratios) throw ModelFormatError("missing metadata key '" + key("attention.compress_ratios") + "'");
        s.compress_ratio = (*ratios)[size_t(layer)];
        if (s.compress_ratio <= 0)
            throw ModelFormatError("attention.compress_ratios is " + std::to_string(s.compress_ratio) +
                                   " for this layer: it is not a QSA (full attention) layer");
        return s;
    });
}

}  // namespace regolith
