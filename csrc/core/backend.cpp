// The public ops of every backend: their arguments checked once, here (types, shapes, sequences inside the
// step), then handed to the backend's implementation. Each backend also checks that a view lies inside its
// buffer, which only it can know.
#include "core/backend.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "core/errors.h"
#include "core/types.h"

namespace regolith {

namespace {

std::atomic<bool>& exact_flag() {
    static std::atomic<bool> flag{[] {
        const char* env = std::getenv("REGOLITH_EXACT_ACTIVATIONS");
        return env != nullptr && std::string(env) == "1";
    }()};
    return flag;
}

}  // namespace

void set_exact_activations(bool on) { exact_flag().store(on); }
bool exact_activations() { return exact_flag().load(); }

namespace {

[[noreturn]] void fail(const char* op, const std::string& what) { throw Error(std::string(op) + ": " + what); }

void need(bool ok, const char* op, const char* what) {
    if (!ok) fail(op, what);
}

std::string shape(const Tensor& t) { return "[" + std::to_string(t.rows) + "][" + std::to_string(t.cols) + "]"; }

void need_type(const Tensor& t, uint32_t type, const char* op, const char* name) {
    if (!t) fail(op, std::string(name) + " is missing");
    if (t.type != type)
        fail(op, std::string(name) + " has type id " + std::to_string(t.type) + ", expected " + std::to_string(type));
}

void need_f32(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
    for (const auto& [name, t] : ts) need_type(*t, RG_TYPE_F32, op, name);
}

void same_shape(const Tensor& a, const Tensor& b, const char* op) {
    if (a.rows != b.rows || a.cols != b.cols) fail(op, "shapes " + shape(a) + " and " + shape(b) + " differ");
}

// Each sequence's rows lie in the step's `rows` rows.
template <class S>
void check_seqs(const S* seqs, int64_t n, int64_t rows, const char* op) {
    for (int64_t i = 0; i < n; ++i)
        if (seqs[i].t0 < 0 || seqs[i].ntok < 0 || seqs[i].t0 + seqs[i].ntok > rows)
            fail(op, "a sequence's rows [" + std::to_string(seqs[i].t0) + ", +" + std::to_string(seqs[i].ntok) +
                         ") are outside the step's " + std::to_string(rows));
}

// A cache of a type the backend takes, its I8 scales [rows][1] F32 (and none for other types).
void check_cache(const Backend& be, const Tensor& t, const Tensor& scale, const char* op, const char* name) {
    if (!t) fail(op, std::string(name) + " is missing");
    if (!be.supports_cache(t.type))
        fail(op, std::string(name) + ": the " + be.name() + " backend has no kernels for " +
                     std::string(cache_type_name(t.type)) + " attention caches");
    if (t.type == RG_TYPE_I8) {
        need_type(scale, RG_TYPE_F32, op, (std::string(name) + " scale").c_str());
        need(scale.cols == 1 && scale.rows >= t.rows, op, "an I8 cache's scales are [rows][1]");
    } else if (scale) {
        fail(op, std::string(name) + " has scales but is not an I8 cache");
    }
}

// A dense cache: F16 / F32 keys and transposed values, or Q8_0 / I8 key and value rows (check_cache).
void check_kv(const Backend& be, const KvSeq& q, int64_t n_head_kv, const char* op) {
    if (q.k.type == RG_TYPE_F16 || q.k.type == RG_TYPE_F32) {
        need(q.vt && q.k.type == q.vt.type && q.k.contiguous() && q.k.rows == q.vt.cols * n_head_kv &&
                 q.vt.rows == q.k.cols * n_head_kv && !q.v && !q.k_scale && !q.v_scale,
             op, "F16 / F32 caches are packed keys and transposed values of the same type");
        return;
    }
    check_cache(be, q.k, q.k_scale, op, "k");
    check_cache(be, q.v, q.v_scale, op, "v");
    need(!q.vt && q.v.type == q.k.type && q.v.rows == q.k.rows && q.v.cols == q.k.cols, op,
         "Q8_0 / I8 caches are key and value rows of the same type and shape");
}

void check_qsa(const Backend& be, const QsaSeq* seqs, int64_t n, const QsaDims& d, const char* op) {
    for (int64_t i = 0; i < n; ++i) {
        const QsaSeq& q = seqs[i];
        check_cache(be, q.k, q.k_scale, op, "k");
        check_cache(be, q.v, q.v_scale, op, "v");
        check_cache(be, q.index_k, q.index_k_scale, op, "index_k");
        check_cache(be, q.block_k, q.block_k_scale, op, "block_k");
        const int64_t n1 = q.n0 + q.ntok;
        need(q.k.rows >= n1 * d.n_head_kv && q.v.rows >= n1 * d.n_head_kv && q.index_k.rows >= n1 && q.pos.rows >= n1 &&
                 q.block_k.rows >= n1 / d.ratio && q.k.cols == d.head_dim && q.index_k.cols == d.index_head_dim &&
                 q.block_k.cols == d.index_head_dim && q.pos.cols == 3,
             op, "a sequence's key tensors are too small for its tokens");
    }
}

}  // namespace

void Backend::copy(const Tensor& src, const Tensor& dst) {
    need(src.type == dst.type, "copy", "tensors of different types");
    same_shape(src, dst, "copy");
    do_copy(src, dst);
}

void Backend::zero(const Tensor& dst) { do_zero(dst); }

const char* cache_type_name(uint32_t type) {
    switch (type) {
        case RG_TYPE_F32:
            return "f32";
        case RG_TYPE_F16:
            return "f16";
        case RG_TYPE_Q8_0:
            return "q8_0";
        case RG_TYPE_I8:
            return "i8";
        default:
            return "unknown";
    }
}

void Backend::store_rows(const Tensor& x, const Tensor& dst, const Tensor& scale) {
    need_f32("store_rows", {{"x", &x}});
    same_shape(x, dst, "store_rows");
    check_cache(*this, dst, scale, "store_rows", "dst");
    need(dst.type != RG_TYPE_Q8_0 || dst.cols % QK8_0 == 0, "store_rows", "Q8_0 rows are whole blocks of 32");
    if (dst.type == RG_TYPE_F32)
        do_copy(x, dst);
    else
        do_store_rows(x, dst, scale);
}

void Backend::do_store_rows(const Tensor&, const Tensor& dst, const Tensor&) {
    throw Error(std::string("store_rows: the ") + name() + " backend has no kernels for " +
                cache_type_name(dst.type) + " attention caches");
}

void Backend::matmul(const MatmulJob* jobs, int64_t n_jobs) {
    for (int64_t i = 0; i < n_jobs; ++i) {
        const MatmulJob& j = jobs[i];
        need_f32("matmul", {{"x", &j.x}, {"y", &j.y}});
        need(j.w.cols == j.x.cols, "matmul", "x must have as many columns as the weight");
        need(j.y.rows == j.x.rows && j.y.cols == j.w.rows, "matmul", "y must be [ntok][weight rows]");
        need(j.x.contiguous() && j.y.contiguous(), "matmul", "x and y must be packed");
    }
    do_matmul(jobs, n_jobs);
}

void Backend::get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat, const Tensor& out) {
    need_type(ids, RG_TYPE_I32, "get_rows", "ids");
    need_f32("get_rows", {{"out", &out}});
    need(out.rows == ids.rows * ids.cols && out.cols == repeat * table.cols, "get_rows", "out must be [ids][repeat * cols]");
    do_get_rows(table, ids, scale, repeat, out);
}

void Backend::gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
    need_type(rows, RG_TYPE_I32, "gather_rows", "rows");
    need_f32("gather_rows", {{"x", &x}, {"out", &out}});
    need(rows.rows == 1 && out.rows == rows.cols && out.cols == x.cols, "gather_rows", "out must be [rows][x.cols]");
    do_gather_rows(x, rows, out);
}

void Backend::top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) {
    need_f32("top_k", {{"x", &x}});
    need(k >= 1 && k <= x.cols, "top_k", "k must be in 1..columns");
    if (ids) need(ids.type == RG_TYPE_I32 && ids.rows == x.rows && ids.cols == k, "top_k", "ids must be I32 [rows][k]");
    if (values)
        need(values.type == RG_TYPE_F32 && values.rows == x.rows && values.cols == k, "top_k", "values must be [rows][k]");
    do_top_k(x, k, ids, values);
}

void Backend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    need_f32("rms_norm", {{"x", &x}, {"y", &y}});
    same_shape(x, y, "rms_norm");
    if (w) need(w.type == RG_TYPE_F32 && w.cols == x.cols && w.rows >= 1, "rms_norm", "w must be [groups][cols] F32");
    do_rms_norm(x, w, eps, y);
}

void Backend::rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act, const Tensor& y) {
    need_f32("rms_norm_gated", {{"x", &x}, {"z", &z}, {"w", &w}, {"y", &y}});
    same_shape(x, y, "rms_norm_gated");
    same_shape(x, z, "rms_norm_gated");
    need(act == Unary::Sigmoid || act == Unary::Silu, "rms_norm_gated", "the gate is sigmoid or silu");
    do_rms_norm_gated(x, z, w, eps, act, y);
}

void Backend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y) {
    need_f32("layer_norm", {{"x", &x}, {"w", &w}, {"b", &b}, {"y", &y}});
    same_shape(x, y, "layer_norm");
    do_layer_norm(x, w, b, eps, y);
}

void Backend::rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis, const Tensor& table) {
    need_type(pos, RG_TYPE_I64, "rope_table", "pos");
    need_type(axis, RG_TYPE_I32, "rope_table", "axis");
    need_f32("rope_table", {{"freq", &freq}, {"table", &table}});
    need(pos.cols == 3 && table.rows == pos.rows && table.cols == 2 * freq.cols && axis.cols == freq.cols, "rope_table",
         "pos [n][3], freq / axis [1][half], table [n][2 * half]");
    do_rope_table(pos, freq, axis, table);
}

void Backend::rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) {
    need_f32("rope", {{"x", &x}, {"table", &table}});
    need(rows_per_pos >= 1 && table.rows * rows_per_pos >= x.rows && table.cols <= x.cols, "rope",
         "the table needs a row per rows_per_pos rows of x and at most x.cols columns");
    do_rope(x, table, rows_per_pos);
}

void Backend::unary(const Tensor& x, Unary op, float p, const Tensor& y) {
    need_f32("unary", {{"x", &x}, {"y", &y}});
    same_shape(x, y, "unary");
    do_unary(x, op, p, y);
}

void Backend::glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) {
    need_f32("glu", {{"gate", &gate}, {"up", &up}, {"y", &y}});
    same_shape(gate, up, "glu");
    same_shape(gate, y, "glu");
    do_glu(gate, up, act, y);
}

void Backend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
    need_f32("add", {{"a", &a}, {"b", &b}, {"y", &y}});
    same_shape(a, y, "add");
    need(b.cols == a.cols && (b.rows == a.rows || b.rows == 1), "add", "b must be a's shape or one row");
    do_add(a, b, y);
}

void Backend::hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) {
    need_f32("hc_mix", {{"gate", &gate}, {"xn", &xn}, {"mixed", &mixed}});
    same_shape(gate, xn, "hc_mix");
    need(mixed.rows == gate.rows && mixed.cols * hc == gate.cols, "hc_mix", "mixed must be [ntok][hidden]");
    do_hc_mix(gate, xn, hc, mixed);
}

void Backend::hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) {
    need_f32("hc_write", {{"out", &out}, {"w", &w}, {"streams", &streams}});
    need(streams.rows == out.rows && streams.cols == hc * out.cols && w.rows == out.rows && w.cols == hc, "hc_write",
         "streams [ntok][hc * hidden], out [ntok][hidden], w [ntok][hc]");
    do_hc_write(out, w, hc, streams);
}

void Backend::ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs, const Tensor& out) {
    need_f32("ssm_conv", {{"x", &x}, {"w_t", &w_t}, {"out", &out}});
    same_shape(x, out, "ssm_conv");
    need(w_t.cols == x.cols, "ssm_conv", "w_t must be [kernel][channels]");
    check_seqs(seqs, n_seqs, x.rows, "ssm_conv");
    for (int64_t i = 0; i < n_seqs; ++i) {
        const ConvSeq& q = seqs[i];
        if (w_t.rows > 1)
            need(q.state.rows == w_t.rows - 1 && q.state.cols == x.cols && q.state.contiguous(), "ssm_conv",
                 "a state is not [kernel-1][channels], packed");
        if (q.after)
            need(q.after.rows >= q.ntok && q.after.cols == (w_t.rows - 1) * x.cols, "ssm_conv",
                 "after must be [ntok][(kernel-1) * channels]");
    }
    do_ssm_conv(x, w_t, seqs, n_seqs, out);
}

void Backend::gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a,
                          const Tensor& dt_bias, const GdnDims& d) {
    need_f32("gdn_prepare", {{"qkv", &qkv}, {"g", &g}, {"beta", &beta}, {"a", &a}, {"dt_bias", &dt_bias}});
    need(qkv.cols == d.conv_dim() && g.cols == d.n_v_heads && beta.cols == d.n_v_heads && g.rows == qkv.rows &&
             beta.rows == qkv.rows && a.cols == d.n_v_heads && dt_bias.cols == d.n_v_heads,
         "gdn_prepare", "qkv [ntok][conv_dim], g / beta [ntok][n_v_heads], a / dt_bias [1][n_v_heads]");
    do_gdn_prepare(qkv, g, beta, a, dt_bias, d);
}

void Backend::gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs, int64_t n_seqs,
                       const GdnDims& d, int64_t chunk, const Tensor& out) {
    need_f32("gdn_scan", {{"qkv", &qkv}, {"g", &g}, {"beta", &beta}, {"out", &out}});
    need(out.rows == qkv.rows && out.cols == d.value_dim() && qkv.cols == d.conv_dim() && d.n_k_heads > 0 &&
             d.n_v_heads % d.n_k_heads == 0 && chunk > 0,
         "gdn_scan", "qkv [ntok][conv_dim], out [ntok][value_dim]");
    check_seqs(seqs, n_seqs, qkv.rows, "gdn_scan");
    const int64_t state = d.n_v_heads * d.k_dim * d.v_dim;
    for (int64_t i = 0; i < n_seqs; ++i) {
        const GdnSeq& q = seqs[i];
        need(q.state.type == RG_TYPE_F32 && q.state.rows * q.state.cols == state && q.state.contiguous(), "gdn_scan",
             "a state is not n_v_heads * k_dim * v_dim packed floats");
        if (q.after) need(q.after.rows >= q.ntok && q.after.cols == state, "gdn_scan", "after must be [ntok][state]");
    }
    do_gdn_scan(qkv, g, beta, seqs, n_seqs, d, chunk, out);
}

void Backend::qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq, const Tensor& axis,
                       const QsaDims& d) {
    need_f32("qsa_pool", {{"norm", &norm}, {"freq", &freq}});
    need_type(axis, RG_TYPE_I32, "qsa_pool", "axis");
    need(d.ratio > 0 && 2 * freq.cols == d.n_rot && d.n_rot <= d.index_head_dim, "qsa_pool",
         "ratio must be positive and n_rot at most the indexer key length");
    check_qsa(*this, seqs, n_seqs, d, "qsa_pool");
    do_qsa_pool(seqs, n_seqs, norm, freq, axis, d);
}

void Backend::qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& sel,
                         const Tensor& n_sel) {
    need_f32("qsa_select", {{"iq", &iq}});
    need_type(sel, RG_TYPE_I32, "qsa_select", "sel");
    need_type(n_sel, RG_TYPE_I32, "qsa_select", "n_sel");
    need(iq.cols == d.index_n_head * d.index_head_dim && sel.rows == iq.rows &&
             sel.cols == std::max<int64_t>(d.topk, 1) && n_sel.rows == 1 && n_sel.cols == iq.rows,
         "qsa_select", "iq [ntok][IH * ID], sel [ntok][max(topk, 1)], n_sel [1][ntok]");
    check_seqs(seqs, n_seqs, iq.rows, "qsa_select");
    check_qsa(*this, seqs, n_seqs, d, "qsa_select");
    do_qsa_select(iq, seqs, n_seqs, d, sel, n_sel);
}

void Backend::qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel,
                         const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& out) {
    need_f32("qsa_attend", {{"q", &q}, {"gate", &gate}, {"out", &out}});
    same_shape(q, gate, "qsa_attend");
    same_shape(q, out, "qsa_attend");
    need(q.cols == d.head_dim && d.n_head % d.n_head_kv == 0, "qsa_attend", "q rows are heads of head_dim");
    check_seqs(seqs, n_seqs, q.rows / d.n_head, "qsa_attend");
    check_qsa(*this, seqs, n_seqs, d, "qsa_attend");
    do_qsa_attend(q, gate, sel, n_sel, seqs, n_seqs, d, out);
}

void Backend::kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs, int64_t n_head_kv) {
    need_f32("kv_append", {{"k", &k}, {"v", &v}});
    same_shape(k, v, "kv_append");
    check_seqs(seqs, n_seqs, k.rows, "kv_append");
    for (int64_t i = 0; i < n_seqs; ++i) {
        const KvSeq& q = seqs[i];
        check_kv(*this, q, n_head_kv, "kv_append");
        need(q.k.cols * n_head_kv == k.cols && q.n0 + q.ntok <= q.k.rows / n_head_kv, "kv_append",
             "the cache cannot hold the sequence's tokens");
    }
    do_kv_append(k, v, seqs, n_seqs, n_head_kv);
}

void Backend::attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& s, const Tensor& out) {
    need_f32("attention", {{"q", &q}, {"out", &out}});
    same_shape(q, out, "attention");
    need(q.cols == s.n_head * s.head_dim && s.n_head % s.n_head_kv == 0, "attention",
         "q must be [ntok][n_head * head_dim]");
    check_seqs(seqs, n_seqs, q.rows, "attention");
    for (int64_t i = 0; i < n_seqs; ++i) {
        const KvSeq& c = seqs[i];
        need(c.k.cols == s.head_dim && c.k.rows % s.n_head_kv == 0 && c.k.rows / s.n_head_kv % 16 == 0,
             "attention", "caches are [n_head_kv * cap][head_dim] with cap a multiple of 16");
        check_kv(*this, c, s.n_head_kv, "attention");
    }
    if (s.sinks) {
        need_f32("attention", {{"sinks", &s.sinks}});
        need(s.sinks.rows == 1 && s.sinks.cols == s.n_head, "attention", "sinks must be [1][n_head]");
    }
    do_attention(q, seqs, n_seqs, s, out);
}

void Backend::moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids,
                        const Tensor& weights) {
    need_f32("moe_route", {{"logits", &logits}, {"weights", &weights}});
    need_type(ids, RG_TYPE_I32, "moe_route", "ids");
    need(r.k >= 1 && r.k <= logits.cols && ids.rows == logits.rows && ids.cols == r.k && weights.rows == logits.rows &&
             weights.cols == r.k,
         "moe_route", "ids / weights must be [ntok][k]");
    if (resident)
        need(resident.type == RG_TYPE_I8 && resident.cols == logits.cols, "moe_route", "resident must be I8 [1][n_expert]");
    do_moe_route(logits, resident, r, ids, weights);
}

void Backend::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& experts,
                          const SharedExpert* shared, const Tensor& y) {
    need_f32("moe_experts", {{"x", &x}, {"weights", &weights}, {"y", &y}});
    need_type(ids, RG_TYPE_I32, "moe_experts", "ids");
    same_shape(x, y, "moe_experts");
    const int64_t ne = experts.n_expert;
    if (const ExpertSlots* sl = experts.slots) {
        need(supports_expert_slots(), "moe_experts", "this backend takes no expert slots");
        const ExpertPart* p = sl->parts;
        need(ne > 0 && p[0].cols == x.cols && p[1].rows == p[0].rows && p[1].cols == x.cols && p[2].rows == x.cols &&
                 p[2].cols == p[0].rows,
             "moe_experts", "the slots' parts must be [ff][hidden] twice and [hidden][ff]");
        for (const ExpertPart& q : sl->parts) {
            const TypeTraits* tt = type_traits(q.type);
            need(tt && q.rows > 0 && q.cols % tt->block_elems == 0 && q.row_bytes >= type_row_bytes(*tt, q.cols),
                 "moe_experts", "an expert part has an unknown type or rows shorter than its columns");
        }
        need_type(sl->device, RG_TYPE_I8, "moe_experts", "device slots");
        need_type(sl->host, RG_TYPE_I8, "moe_experts", "host slots");
        need_type(sl->where, RG_TYPE_I32, "moe_experts", "where");
        need_type(sl->offsets, RG_TYPE_I32, "moe_experts", "offsets");
        need(sl->host.rows == ne && sl->device.cols == sl->host.cols && sl->where.rows == 1 && sl->where.cols == ne &&
                 sl->offsets.rows == ne && sl->offsets.cols == 3,
             "moe_experts", "slots: host [n_expert][slot_bytes], device [n][slot_bytes], where [1][n_expert], "
                            "offsets [n_expert][3]");
    } else {
        need(ne > 0 && experts.gate.rows % ne == 0 && experts.up.rows == experts.gate.rows &&
                 experts.down.rows == ne * x.cols && experts.gate.cols == x.cols &&
                 experts.down.cols == experts.gate.rows / ne,
             "moe_experts", "the stacked experts must be [n_expert * ff][hidden] twice and [n_expert * hidden][ff]");
    }
    need(ids.rows == x.rows && weights.rows == x.rows && weights.cols == ids.cols, "moe_experts",
         "ids and weights must be [ntok][k]");
    if (shared) {
        need_f32("moe_experts", {{"shared gate", &shared->gate},
                                 {"shared up", &shared->up},
                                 {"shared gate logit", &shared->gate_logit}});
        need(shared->gate.contiguous() && shared->gate.rows == x.rows && shared->down.rows == x.cols &&
                 shared->down.cols == shared->gate.cols,
             "moe_experts", "the shared expert's products must be packed [ntok][ff_shared], its down [hidden][ff_shared]");
    }
    need(experts.act == Glu::Silu || experts.act == Glu::SwigluOai, "moe_experts", "act must be Silu or SwigluOai");
    const int64_t ff = experts.slots ? experts.slots->parts[0].rows : experts.gate.rows / ne;
    const bool biased = experts.gate_bias || experts.up_bias || experts.down_bias;
    if (biased) {
        need(experts.gate_bias && experts.up_bias && experts.down_bias, "moe_experts",
             "the expert biases come as gate, up and down together");
        need_f32("moe_experts", {{"gate bias", &experts.gate_bias},
                                 {"up bias", &experts.up_bias},
                                 {"down bias", &experts.down_bias}});
        need(experts.gate_bias.rows == ne && experts.gate_bias.cols == ff && experts.up_bias.rows == ne &&
                 experts.up_bias.cols == ff && experts.down_bias.rows == ne && experts.down_bias.cols == x.cols,
             "moe_experts", "the expert biases must be [n_expert][ff] twice and [n_expert][hidden]");
    }
    do_moe_experts(x, ids, weights, experts, shared, y);
}

void Backend::moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared,
                          const Tensor& shared_gate, const Tensor& y) {
    need_f32("moe_combine", {{"ys", &ys}, {"weights", &weights}, {"y", &y}});
    need_type(pairs, RG_TYPE_I32, "moe_combine", "pairs");
    need(pairs.rows == 1 && pairs.cols == ys.rows && ys.cols == y.cols && weights.rows == y.rows, "moe_combine",
         "ys [rows][hidden], pairs [1][rows], weights [ntok][k], y [ntok][hidden]");
    if (shared)
        need(shared.rows == y.rows && shared.cols == y.cols && shared_gate.rows == y.rows, "moe_combine",
             "shared must be [ntok][hidden]");
    do_moe_combine(ys, pairs, weights, shared, shared_gate, y);
}

void Backend::ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key,
                       const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps, const Tensor& gated,
                       const Tensor& normed) {
    need_f32("ple_gate", {{"key", &key}, {"query", &query}, {"value", &value}, {"norm_key", &norm_key},
                          {"norm_query", &norm_query}, {"norm_conv", &norm_conv}, {"gated", &gated}, {"normed", &normed}});
    same_shape(key, query, "ple_gate");
    same_shape(key, gated, "ple_gate");
    same_shape(key, normed, "ple_gate");
    need(value.rows == key.rows && value.cols * hc == key.cols && norm_key.cols == key.cols, "ple_gate",
         "value [ntok][hidden], key [ntok][hc * hidden]");
    do_ple_gate(key, query, value, norm_key, norm_query, norm_conv, hc, eps, gated, normed);
}

void Backend::ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs, int64_t n_seqs,
                       const Tensor& out) {
    need_f32("ple_conv", {{"normed", &normed}, {"w", &w}, {"out", &out}});
    same_shape(normed, out, "ple_conv");
    check_seqs(seqs, n_seqs, normed.rows, "ple_conv");
    const int64_t hist = (w.cols - 1) * dilation;
    need(w.rows == normed.cols && w.cols >= 1 && w.contiguous(), "ple_conv", "w must be [channels][kernel], packed");
    for (int64_t i = 0; i < n_seqs && hist > 0; ++i)
        need(seqs[i].state.rows == hist && seqs[i].state.cols == normed.cols && seqs[i].state.contiguous(),
             "ple_conv", "a state is not [history][channels], packed");
    do_ple_conv(normed, w, dilation, seqs, n_seqs, out);
}

void Backend::add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w, const Tensor& x) {
    need_f32("add_interpolated", {{"table", &table}, {"w", &w}, {"x", &x}});
    need_type(idx, RG_TYPE_I32, "add_interpolated", "idx");
    need(idx.rows == x.rows && idx.cols == 4 && w.rows == x.rows && w.cols == 4 && table.cols == x.cols,
         "add_interpolated", "idx / w [n][4], table [rows][x.cols]");
    do_add_interpolated(table, idx, w, x);
}

void Backend::vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q, const Tensor& k,
                         const Tensor& vt) {
    need_f32("vision_qkv", {{"qkv", &qkv}, {"table", &table}, {"q", &q}, {"k", &k}, {"vt", &vt}});
    const int64_t n = qkv.rows, hd = n_head > 0 ? qkv.cols / 3 / n_head : 0;
    need(n_head > 0 && qkv.cols == 3 * n_head * hd && table.rows == n && table.cols == hd && q.rows == n_head * n &&
             q.cols >= hd && k.rows == q.rows && k.cols == q.cols && vt.rows == n_head * hd && vt.cols == n,
         "vision_qkv", "qkv [n][3 * heads * hd], table [n][hd], q / k [heads * n][>= hd], vt [heads * hd][n]");
    do_vision_qkv(qkv, table, n_head, q, k, vt);
}

void Backend::softmax_scaled(const Tensor& x, float scale) {
    need_f32("softmax_scaled", {{"x", &x}});
    do_softmax_scaled(x, scale);
}

}  // namespace regolith
