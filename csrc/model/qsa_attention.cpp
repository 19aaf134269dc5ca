#include "model/qsa_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "core/errors.h"
#include "core/gguf.h"
#include "core/thread_pool.h"
#include "model/metadata.h"
#include "model/nn.h"
#include "model/weights.h"

namespace regolith {

namespace {

using nn::dot;

bool same_shape(const QsaShape& a, const QsaShape& b) {
    return a.hidden == b.hidden && a.n_head == b.n_head && a.n_head_kv == b.n_head_kv && a.head_dim == b.head_dim &&
           a.index_n_head == b.index_n_head && a.index_head_dim == b.index_head_dim &&
           a.compress_ratio == b.compress_ratio;
}

}  // namespace

// ---- state ------------------------------------------------------------------------------------------------

QsaState::QsaState(const QsaShape& shape, int64_t max_ctx) : shape_(shape), max_ctx_(max_ctx) {
    if (max_ctx < 1) throw Error("QSA state: max_ctx must be at least 1, got " + std::to_string(max_ctx));
}

void QsaState::reserve_(int64_t n) {
    const QsaShape& s = shape_;
    auto grow = [](auto& v, int64_t size) {
        if (int64_t(v.size()) < size) v.resize(size_t(size));
    };
    grow(k_, n * s.n_head_kv * s.head_dim);
    grow(v_, n * s.n_head_kv * s.head_dim);
    grow(index_k_, n * s.index_head_dim);
    grow(block_k_, n / s.compress_ratio * s.index_head_dim);
    grow(pos_, 3 * n);
}

void QsaState::truncate(int64_t n) {
    if (n < 0 || n > n_)
        throw Error("QSA state: cannot truncate to " + std::to_string(n) + " tokens, it holds " + std::to_string(n_));
    n_ = n;  // complete blocks below n are unchanged; the storage is kept for reuse
}

void QsaState::state_spans(int64_t from, int64_t to, std::vector<StateSpan>& out) {
    if (from < 0 || from > to || to > n_)
        throw Error("QSA state: tokens [" + std::to_string(from) + ", " + std::to_string(to) + ") of " +
                    std::to_string(n_));
    const QsaShape& s = shape_;
    const auto rows = [&](auto& v, int64_t width, int64_t lo, int64_t hi) {
        if (hi > lo)
            out.push_back({reinterpret_cast<uint8_t*>(&v[size_t(lo * width)]),
                           size_t((hi - lo) * width) * sizeof(v[0])});
    };
    rows(k_, s.n_head_kv * s.head_dim, from, to);
    rows(v_, s.n_head_kv * s.head_dim, from, to);
    rows(index_k_, s.index_head_dim, from, to);
    rows(pos_, 3, from, to);
    rows(block_k_, s.index_head_dim, from / s.compress_ratio, to / s.compress_ratio);
}

void QsaState::grow(int64_t n) {
    if (n < n_ || n > max_ctx_)
        throw Error("QSA state: cannot grow from " + std::to_string(n_) + " to " + std::to_string(n) +
                    " tokens (max " + std::to_string(max_ctx_) + ")");
    reserve_(n);
    n_ = n;
}

// ---- layer ------------------------------------------------------------------------------------------------

QsaAttention::QsaAttention(const QsaShape& shape, const QsaWeights& weights, Backend& backend)
    : shape_(shape), w_(weights), backend_(backend) {
    const QsaShape& s = shape_;
    auto fail = [](const std::string& what) { throw ModelFormatError("QSA layer: " + what); };
    if (s.hidden <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 || s.index_n_head <= 0 ||
        s.index_head_dim <= 0 || s.compress_ratio <= 0 || s.index_budget < 0)
        fail("every dimension must be positive");
    if (s.n_head % s.n_head_kv != 0) fail("head_count must be a multiple of head_count_kv");
    if (s.n_rot < 0 || s.n_rot % 2 != 0 || s.n_rot > s.head_dim || s.n_rot > s.index_head_dim)
        fail("rope.dimension_count " + std::to_string(s.n_rot) +
             " must be even and at most key_length and indexer key_length");
    auto check = [&](const WeightView& w, int64_t rows, int64_t cols, const char* name) {
        if (!w.data || w.rows != rows || w.cols != cols)
            fail(std::string(name) + " must be [" + std::to_string(rows) + " rows][" + std::to_string(cols) +
                 " cols], got [" + std::to_string(w.rows) + "][" + std::to_string(w.cols) + "]");
    };
    check(w_.q, s.n_head * 2 * s.head_dim, s.hidden, "attn_q");
    check(w_.k, s.n_head_kv * s.head_dim, s.hidden, "attn_k");
    check(w_.v, s.n_head_kv * s.head_dim, s.hidden, "attn_v");
    check(w_.o, s.hidden, s.n_head * s.head_dim, "attn_output");
    check(w_.index_q, s.index_n_head * s.index_head_dim, s.hidden, "indexer.q_proj");
    check(w_.index_k, s.index_head_dim, s.hidden, "indexer.k_proj");
    if (!w_.q_norm || !w_.k_norm || !w_.index_q_norm || !w_.index_k_norm) fail("a norm weight is missing");

    // inv_freq[i] = 1 / base^(2i / n_rot), in float32 as transformers computes it
    inv_freq_.resize(size_t(s.n_rot / 2));
    for (int64_t i = 0; i < s.n_rot / 2; ++i)
        inv_freq_[i] = 1.0f / std::pow(s.rope_base, float(2 * i) / float(s.n_rot));
    rope_axis_.resize(size_t(s.n_rot / 2));
    for (int64_t i = 0; i < s.n_rot / 2; ++i)
        rope_axis_[i] = i % 3 == 1 && i < 3 * s.rope_sections[1] ? 1 : i % 3 == 2 && i < 3 * s.rope_sections[2] ? 2 : 0;
}

// Rotates the leading n_rot dims of n_rows rows (NEOX pairs i, i + n_rot/2) at M-RoPE position pos3
// (t, h, w): pair i turns by pos3[rope_axis_[i]] * inv_freq[i].
void QsaAttention::rope_(float* x, int64_t n_rows, int64_t row_stride, const int64_t* pos3) const {
    const int64_t half = shape_.n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float angle = float(pos3[rope_axis_[i]]) * inv_freq_[i];
        const float c = std::cos(angle), s = std::sin(angle);
        for (int64_t r = 0; r < n_rows; ++r) {
            float* row = x + r * row_stride;
            const float a = row[i], b = row[i + half];
            row[i] = a * c - b * s;
            row[i + half] = b * c + a * s;
        }
    }
}

void QsaAttention::forward(const float* x, const int64_t* positions, int64_t ntok, QsaState& st, float* y) const {
    std::vector<int64_t> pos3(static_cast<size_t>(3 * std::max<int64_t>(ntok, 0)));  // [ntok][3]
    for (int64_t t = 0; t < ntok; ++t) std::fill_n(&pos3[size_t(3 * t)], 3, positions[t]);
    forward_mrope(x, pos3.data(), ntok, st, y);
}

void QsaAttention::forward_mrope(const float* x, const int64_t* positions, int64_t ntok, QsaState& st, float* y) const {
    const QsaShape& s = shape_;
    if (ntok < 0) throw Error("QSA forward: negative token count");
    if (ntok == 0) return;
    if (!same_shape(st.shape_, s)) throw Error("QSA forward: the state was made for a layer of another shape");
    const int64_t n0 = st.n_, n1 = n0 + ntok;
    if (n1 > st.max_ctx_)
        throw Error("QSA context full: the state holds " + std::to_string(n0) + " of " + std::to_string(st.max_ctx_) +
                    " tokens and cannot take " + std::to_string(ntok) +
                    " more; use a larger context or truncate the state");

    const int64_t H = s.n_head, KV = s.n_head_kv, D = s.head_dim, IH = s.index_n_head, ID = s.index_head_dim;
    const int64_t r = s.compress_ratio, topk = s.block_topk();

    // projections
    std::vector<float> qg(static_cast<size_t>(ntok * H * 2 * D));  // [ntok][H][2][D]: per head q, then gate
    std::vector<float> kx(static_cast<size_t>(ntok * KV * D));     // [ntok][KV][D]
    std::vector<float> vx(static_cast<size_t>(ntok * KV * D));     // [ntok][KV][D]
    std::vector<float> iq(static_cast<size_t>(ntok * IH * ID));    // [ntok][IH][ID]
    std::vector<float> ik(static_cast<size_t>(ntok * ID));         // [ntok][ID]
    const MatmulJob in[] = {{w_.q, x, ntok, qg.data()},
                            {w_.k, x, ntok, kx.data()},
                            {w_.v, x, ntok, vx.data()},
                            {w_.index_q, x, ntok, iq.data()},
                            {w_.index_k, x, ntok, ik.data()}};
    backend_.matmul_batch(in, 5);

    // queries (normed, rotated) and the new tokens' keys, values and raw indexer keys into the state
    st.reserve_(n1);
    std::vector<float> q(static_cast<size_t>(ntok * H * D));  // [ntok][H][D]
    for (int64_t t = 0; t < ntok; ++t) {
        const int64_t i = n0 + t;
        const int64_t* pos = positions + 3 * t;
        float* qt = &q[size_t(t * H * D)];
        for (int64_t h = 0; h < H; ++h) nn::rms_norm(&qg[size_t((t * H + h) * 2 * D)], D, w_.q_norm, s.eps, qt + h * D);
        rope_(qt, H, D, pos);
        float* kt = &st.k_[size_t(i * KV * D)];
        for (int64_t h = 0; h < KV; ++h) nn::rms_norm(&kx[size_t((t * KV + h) * D)], D, w_.k_norm, s.eps, kt + h * D);
        rope_(kt, KV, D, pos);
        std::memcpy(&st.v_[size_t(i * KV * D)], &vx[size_t(t * KV * D)], sizeof(float) * size_t(KV * D));
        std::memcpy(&st.index_k_[size_t(i * ID)], &ik[size_t(t * ID)], sizeof(float) * size_t(ID));
        std::copy_n(pos, 3, &st.pos_[size_t(3 * i)]);
        float* iqt = &iq[size_t(t * IH * ID)];
        for (int64_t h = 0; h < IH; ++h) nn::rms_norm(iqt + h * ID, ID, w_.index_q_norm, s.eps, iqt + h * ID);
        rope_(iqt, IH, ID, pos);
    }

    // blocks completed by this call: mean of raw keys -> norm -> RoPE at the block's first position
    std::vector<float> mean(static_cast<size_t>(ID));  // [ID]
    for (int64_t b = n0 / r; b < n1 / r; ++b) {
        std::fill(mean.begin(), mean.end(), 0.0f);
        for (int64_t j = b * r; j < (b + 1) * r; ++j)
            for (int64_t d = 0; d < ID; ++d) mean[d] += st.index_k_[size_t(j * ID + d)];
        for (int64_t d = 0; d < ID; ++d) mean[d] /= float(r);
        float* bk = &st.block_k_[size_t(b * ID)];
        nn::rms_norm(mean.data(), ID, w_.index_k_norm, s.eps, bk);
        rope_(bk, 1, ID, &st.pos_[size_t(3 * b * r)]);
    }

    // block selection per query: the top min(topk, nb) complete blocks, listed in increasing block order
    std::vector<int32_t> sel(static_cast<size_t>(ntok * topk));  // [ntok][topk] selected block ids
    std::vector<int64_t> n_sel(static_cast<size_t>(ntok));       // [ntok]
    const float index_scale = 1.0f / std::sqrt(float(ID));
    default_pool()->parallel_for(ntok, 1, [&](int64_t t0, int64_t t1) {
        std::vector<float> score;   // [nb]
        std::vector<int32_t> order;  // [nb]
        for (int64_t t = t0; t < t1; ++t) {
            const int64_t nb = (n0 + t + 1) / r, k = std::min(topk, nb);
            n_sel[t] = k;
            if (k == 0) continue;
            int32_t* out = &sel[size_t(t * topk)];
            if (k == nb) {
                std::iota(out, out + k, 0);
                continue;
            }
            score.resize(size_t(nb));
            const float* iqt = &iq[size_t(t * IH * ID)];
            for (int64_t b = 0; b < nb; ++b) {
                const float* bk = &st.block_k_[size_t(b * ID)];
                float sum = 0.0f;
                for (int64_t h = 0; h < IH; ++h) sum += std::max(dot(iqt + h * ID, bk, ID), 0.0f);
                score[b] = sum * index_scale;
            }
            order.resize(size_t(nb));
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
                return score[a] > score[b] || (score[a] == score[b] && a < b);
            });
            std::copy(order.begin(), order.begin() + k, out);
            std::sort(out, out + k);
        }
    });

    // attention per (query, head) over the selected blocks' tokens and the tail, gated by sigmoid(gate)
    std::vector<float> attn(static_cast<size_t>(ntok * H * D));  // [ntok][H][D]
    const float scale = 1.0f / std::sqrt(float(D));
    const int64_t group = H / KV;
    default_pool()->parallel_for(ntok * H, 1, [&](int64_t p0, int64_t p1) {
        std::vector<int64_t> idx;  // [n_keys] cache indices attended
        std::vector<float> w;      // [n_keys]
        for (int64_t p = p0; p < p1; ++p) {
            const int64_t t = p / H, h = p % H, i = n0 + t, kvh = h / group;
            idx.clear();
            for (int64_t j = 0; j < n_sel[t]; ++j) {
                const int64_t b = sel[size_t(t * topk + j)];
                for (int64_t c = b * r; c < (b + 1) * r; ++c) idx.push_back(c);
            }
            for (int64_t c = (i + 1) / r * r; c <= i; ++c) idx.push_back(c);

            const float* qh = &q[size_t((t * H + h) * D)];
            w.resize(idx.size());
            for (size_t j = 0; j < idx.size(); ++j) w[j] = dot(qh, &st.k_[size_t((idx[j] * KV + kvh) * D)], D) * scale;
            nn::softmax(w.data(), int64_t(w.size()));
            float* out = &attn[size_t((t * H + h) * D)];
            std::fill(out, out + D, 0.0f);
            for (size_t j = 0; j < idx.size(); ++j) {
                const float* vj = &st.v_[size_t((idx[j] * KV + kvh) * D)];
                const float pj = w[j];
                for (int64_t d = 0; d < D; ++d) out[d] += pj * vj[d];
            }
            const float* gate = &qg[size_t((t * H + h) * 2 * D + D)];
            for (int64_t d = 0; d < D; ++d) out[d] *= nn::sigmoid(gate[d]);
        }
    });
    st.n_ = n1;

    backend_.matmul(w_.o, attn.data(), ntok, y);
}

// ---- GGUF loading -----------------------------------------------------------------------------------------

namespace {

std::string context(int64_t layer) { return "qwen4exp QSA layer " + std::to_string(layer) + ": "; }

}  // namespace

QsaShape qsa_shape_from_gguf(const GgufFile& file, int64_t layer) {
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

QsaWeights qsa_weights_from_gguf(const GgufFile& file, int64_t layer, const QsaShape& s) {
    return with_context(context(layer), [&] {
        const ModelWeights wt(file);
        const std::string blk = "blk." + std::to_string(layer) + ".";
        QsaWeights w;
        w.q = wt.matrix(blk + "attn_q.weight", s.n_head * 2 * s.head_dim, s.hidden);
        w.k = wt.matrix(blk + "attn_k.weight", s.n_head_kv * s.head_dim, s.hidden);
        w.v = wt.matrix(blk + "attn_v.weight", s.n_head_kv * s.head_dim, s.hidden);
        w.o = wt.matrix(blk + "attn_output.weight", s.hidden, s.n_head * s.head_dim);
        w.q_norm = wt.f32_vector(blk + "attn_q_norm.weight", s.head_dim);
        w.k_norm = wt.f32_vector(blk + "attn_k_norm.weight", s.head_dim);
        w.index_q = wt.matrix(blk + "indexer.q_proj.weight", s.index_n_head * s.index_head_dim, s.hidden);
        w.index_k = wt.matrix(blk + "indexer.k_proj.weight", s.index_head_dim, s.hidden);
        w.index_q_norm = wt.f32_vector(blk + "indexer.q_norm.weight", s.index_head_dim);
        w.index_k_norm = wt.f32_vector(blk + "indexer.k_norm.weight", s.index_head_dim);
        return w;
    });
}

}  // namespace regolith
