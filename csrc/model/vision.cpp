#include "model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/errors.h"
#include "model/metadata.h"
#include "model/weights.h"

namespace regolith {

namespace {

constexpr const char* kProjector = "qwen3vl_merger";
constexpr int64_t kQueryChunk = 96;  // attention queries per score block: [heads][chunk][patches] floats

// Bilinear taps (align_corners=True) of target index i of `size` into a source axis of `side` entries, as
// transformers' _interpolation_axis_taps_weights computes them in float32.
void axis_taps(int64_t i, int64_t size, int64_t side, int64_t tap[2], float weight[2]) {
    const float src = float(i * (side - 1)) / float(std::max<int64_t>(size - 1, 1));
    const float fl = std::floor(src);
    for (int k = 0; k < 2; ++k) {
        tap[k] = std::clamp<int64_t>(int64_t(fl) + k, 0, side - 1);
        weight[k] = std::max(1.0f - std::fabs(src - fl - float(k)), 0.0f);
    }
}

}  // namespace

VisionConfig VisionConfig::from_gguf(const GgufSet& f) {
    const std::string p = meta::require_arch(f, "clip");
    VisionConfig c;
    const std::string proj =
        meta::get_string(f, p + "vision.projector_type").value_or(meta::get_string(f, p + "projector_type").value_or(""));
    if (proj != kProjector)
        throw ModelFormatError("projector type '" + proj + "' is not supported: regolith runs the qwen4_exp vision tower ('" +
                               kProjector + "')");
    if (!meta::get_bool(f, p + "has_vision_encoder").value_or(false))
        throw ModelFormatError("the projector file has no vision encoder (clip.has_vision_encoder)");
    c.hidden = meta::require_positive_int(f, p + "vision.embedding_length");
    c.ff = meta::require_positive_int(f, p + "vision.feed_forward_length");
    c.n_layer = meta::require_positive_int(f, p + "vision.block_count");
    c.n_head = meta::require_positive_int(f, p + "vision.attention.head_count");
    c.patch = meta::require_positive_int(f, p + "vision.patch_size");
    c.merge = meta::get_int(f, p + "vision.spatial_merge_size").value_or(2);
    c.out_dim = meta::require_positive_int(f, p + "vision.projection_dim");
    c.eps = meta::get_float(f, p + "vision.attention.layer_norm_epsilon").value_or(1e-6f);
    if (c.merge <= 0) throw ModelFormatError("clip.vision.spatial_merge_size must be positive");
    if (c.hidden % c.n_head != 0 || c.head_dim() % 4 != 0)
        throw ModelFormatError("clip.vision: embedding_length / head_count must be a multiple of 4 (2-D rotary halves)");
    if (c.n_layer > int64_t(f.tensors().size()))
        throw ModelFormatError("clip.vision.block_count " + std::to_string(c.n_layer) + " exceeds the file's tensors");
    if (auto ds = meta::get_int_array(f, p + "vision.is_deepstack_layers", 0, /*allow_bool=*/true))
        if (std::any_of(ds->begin(), ds->end(), [](int64_t v) { return v != 0; }))
            throw ModelFormatError("deepstack vision layers (Qwen3-VL) are not supported; qwen4_exp has none");
    const GgufTensor* pos = f.find_tensor("v.position_embd.weight");
    if (!pos) throw ModelFormatError("missing tensor 'v.position_embd.weight'");
    c.grid_side = int64_t(std::llround(std::sqrt(double(pos->ne[1]))));
    if (c.grid_side * c.grid_side != int64_t(pos->ne[1]))
        throw ModelFormatError("v.position_embd.weight must hold a square grid of positions, got " +
                               std::to_string(pos->ne[1]));
    c.temporal = f.find_tensor("v.patch_embd.weight.1") ? 2 : 1;
    return c;
}

VisionEncoder::VisionEncoder(const std::string& path, Backend& backend)
    : file_(path), backend_(backend), store_(file_, backend), config_(VisionConfig::from_gguf(file_)) {
    const VisionConfig& c = config_;
    const ModelWeights w(store_);
    const int64_t h = c.hidden, pp = c.patch * c.patch, hd = c.head_dim();
    auto vec = [&](const std::string& name, int64_t n) { return w.f32_converted(name, {n}); };

    // Conv3d kernel [hidden][channels][temporal][p][p]; llama.cpp stores one [hidden][channels][p][p] per frame
    std::vector<float> patch(size_t(h * c.patch_dim()));
    for (int64_t fr = 0; fr < c.temporal; ++fr) {
        const std::string name = fr == 0 ? "v.patch_embd.weight" : "v.patch_embd.weight." + std::to_string(fr);
        const GgufTensor& t = w.tensor(name, {c.patch, c.patch, c.channels, h});
        std::vector<float> src(size_t(t.n_elements));
        w.to_f32(name, int64_t(t.n_elements), src.data());
        for (int64_t o = 0; o < h; ++o)
            for (int64_t ch = 0; ch < c.channels; ++ch)
                std::copy_n(&src[size_t((o * c.channels + ch) * pp)], pp,
                            &patch[size_t(((o * c.channels + ch) * c.temporal + fr) * pp)]);
    }
    patch_w_ = store_.upload(RG_TYPE_F32, h, c.patch_dim(), patch.data());
    patch_b_ = vec("v.patch_embd.bias", h);
    pos_embd_ = w.f32_converted("v.position_embd.weight", {h, c.grid_side * c.grid_side}).reshaped(c.grid_side * c.grid_side, h);
    // 2-D rotary pairs j < hd/2: the row position for j < hd/4, the column position after, each quarter
    // with inv_freq[j % (hd/4)] = 1 / theta^(2i / (hd/2))
    std::vector<float> freq(size_t(hd / 2));
    std::vector<int32_t> axis(size_t(hd / 2));
    for (int64_t j = 0; j < hd / 2; ++j) {
        const int64_t i = j % (hd / 4);
        freq[size_t(j)] = 1.0f / std::pow(c.rope_theta, float(2 * i) / float(hd / 2));
        axis[size_t(j)] = j < hd / 4 ? 0 : 1;
    }
    rope_freq_ = store_.upload(RG_TYPE_F32, 1, hd / 2, freq.data());
    rope_axis_ = store_.upload(RG_TYPE_I32, 1, hd / 2, axis.data());
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const std::string b = "v.blk." + std::to_string(il) + ".";
        blocks_.push_back({vec(b + "ln1.weight", h), vec(b + "ln1.bias", h), vec(b + "ln2.weight", h),
                           vec(b + "ln2.bias", h), w.matrix(b + "attn_qkv.weight", 3 * h, h),
                           w.matrix(b + "attn_out.weight", h, h), w.matrix(b + "ffn_up.weight", c.ff, h),
                           w.matrix(b + "ffn_down.weight", h, c.ff), vec(b + "attn_qkv.bias", 3 * h),
                           vec(b + "attn_out.bias", h), vec(b + "ffn_up.bias", c.ff), vec(b + "ffn_down.bias", h)});
    }
    const int64_t merged = h * c.merge * c.merge;
    post_w_ = vec("v.post_ln.weight", h);
    post_b_ = vec("v.post_ln.bias", h);
    mm0_ = w.matrix("mm.0.weight", merged, merged);
    mm0_b_ = vec("mm.0.bias", merged);
    mm2_ = w.matrix("mm.2.weight", c.out_dim, merged);
    mm2_b_ = vec("mm.2.bias", c.out_dim);
}

VisionEncoder::~VisionEncoder() = default;

void VisionEncoder::encode(const float* pixels, const int64_t* grids, int64_t n_images, float* out) const {
    const VisionConfig& c = config_;
    for (int64_t i = 0; i < n_images; ++i) {
        const int64_t t = grids[3 * i], h = grids[3 * i + 1], w = grids[3 * i + 2];
        if (t <= 0 || h <= 0 || w <= 0 || h % c.merge || w % c.merge)
            throw Error("image grid (" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(w) +
                        ") must be positive with h and w multiples of the merge size " + std::to_string(c.merge));
    }
    Workspace ws(backend_);
    for (int64_t i = 0; i < n_images; ++i) {
        const int64_t t = grids[3 * i], h = grids[3 * i + 1], w = grids[3 * i + 2];
        encode_image(ws, pixels, t, h, w, out);
        ws.reset();
        pixels += t * h * w * c.patch_dim();
        out += t * h * w / (c.merge * c.merge) * c.out_dim;
    }
}

// y[r] = W x[r] + b for every row.
void VisionEncoder::linear(const Tensor& w, const Tensor& b, const Tensor& x, const Tensor& y) const {
    backend_.matmul(w, x, y);
    backend_.add(y, b, y);
}

// Per-image working memory, allocated once for all blocks. S: the patches of one frame.
struct VisionEncoder::Scratch {
    Scratch(Workspace& ws, const VisionConfig& c, int64_t S)
        : hp((c.head_dim() + 15) / 16 * 16),
          nq(std::min(S, kQueryChunk)),
          qkv(ws.f32(S, 3 * c.hidden)),
          q(ws.f32(c.n_head * S, hp)),
          k(ws.f32(c.n_head * S, hp)),
          vt(ws.f32(c.n_head * c.head_dim(), S)),
          scores(ws.f32(c.n_head * nq, S)),
          heads(ws.f32(c.n_head * S, c.head_dim())),
          attn(ws.f32(S, c.hidden)) {}
    const int64_t hp;  // head_dim padded with zero columns to whole 16-lane matmul steps
    const int64_t nq;  // queries per score block
    Tensor qkv;        // [S][3][heads][head_dim]
    Tensor q, k;       // [heads][S][hp] rotated
    Tensor vt;         // [heads][head_dim][S]: V^T
    Tensor scores;     // [heads][nq][S]
    Tensor heads;      // [heads][S][head_dim]
    Tensor attn;       // [S][hidden]
};

void VisionEncoder::encode_image(Workspace& ws, const float* pixels, int64_t t, int64_t gh, int64_t gw,
                                 float* out) const {
    const VisionConfig& c = config_;
    Backend& be = backend_;
    const int64_t H = c.hidden, m = c.merge, S = gh * gw, n = t * S, side = c.grid_side;
    const Tensor px = ws.f32(n, c.patch_dim());
    be.write(px, pixels);
    const Tensor x = ws.f32(n, H), xn = ws.f32(n, H), y = ws.f32(n, H), ffn = ws.f32(n, c.ff);

    // patch embedding + the position grid resampled to gh x gw (patches in merge-block order); each patch's
    // (row, column) for the 2-D rotary embedding
    linear(patch_w_, patch_b_, px, x);
    std::vector<int32_t> taps(size_t(4 * n));
    std::vector<float> weights(size_t(4 * n));
    std::vector<int64_t> pos(size_t(3 * n));
    for (int64_t k = 0; k < n; ++k) {
        const int64_t within = k % S, bw = gw / m;
        const int64_t row = within / (m * m * bw) * m + within / m % m;
        const int64_t col = within / (m * m) % bw * m + within % m;
        int64_t ht[2], wt[2];
        float hw[2], ww[2];
        axis_taps(row, gh, side, ht, hw);
        axis_taps(col, gw, side, wt, ww);
        for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
                taps[size_t(4 * k + 2 * a + b)] = int32_t(ht[a] * side + wt[b]);
                weights[size_t(4 * k + 2 * a + b)] = hw[a] * ww[b];
            }
        pos[size_t(3 * k)] = row, pos[size_t(3 * k + 1)] = col, pos[size_t(3 * k + 2)] = 0;
    }
    const Tensor tap = ws.i32(n, 4), weight = ws.f32(n, 4), position = ws.alloc(RG_TYPE_I64, n, 3);
    be.write(tap, taps.data());
    be.write(weight, weights.data());
    be.write(position, pos.data());
    be.add_interpolated(pos_embd_, tap, weight, x);
    const Tensor rope = ws.f32(n, c.head_dim());  // [n][cos | sin of each rotary pair]
    be.rope_table(position, rope_freq_, rope_axis_, rope);

    const Scratch sc(ws, c, S);
    for (const Block& b : blocks_) {
        be.layer_norm(x, b.ln1_w, b.ln1_b, c.eps, xn);
        for (int64_t f = 0; f < t; ++f)
            attention(b, xn.row_range(f * S, S), rope.row_range(f * S, S), y.row_range(f * S, S), sc);
        be.add(x, y, x);
        be.layer_norm(x, b.ln2_w, b.ln2_b, c.eps, xn);
        linear(b.up, b.up_b, xn, ffn);
        be.unary(ffn, Unary::GeluTanhExp, 0.0f, ffn);
        linear(b.down, b.down_b, ffn, y);
        be.add(x, y, x);
    }

    // merger: norm each patch, then one row per merge x merge block (its patches are consecutive)
    be.layer_norm(x, post_w_, post_b_, c.eps, xn);
    const int64_t n_out = n / (m * m), merged = H * m * m;
    const Tensor mid = ws.f32(n_out, merged), result = ws.f32(n_out, c.out_dim);
    linear(mm0_, mm0_b_, xn.reshaped(n_out, merged), mid);
    be.unary(mid, Unary::GeluErf, 0.0f, mid);
    linear(mm2_, mm2_b_, mid, result);
    be.read(result, out);
}

// Bidirectional attention over the n patches of one frame. x: [n][hidden] (normed), rope: [n][head_dim],
// y: [n][hidden] after the output projection. Per block of queries, every head's QK^T, then every head's
// PV, each as one batch of matmuls (one head per job).
void VisionEncoder::attention(const Block& b, const Tensor& x, const Tensor& rope, const Tensor& y,
                              const Scratch& sc) const {
    const VisionConfig& c = config_;
    Backend& be = backend_;
    const int64_t n = x.rows, nh = c.n_head, hd = c.head_dim();
    const Tensor qkv = sc.qkv.row_range(0, n), q = sc.q.row_range(0, nh * n), k = sc.k.row_range(0, nh * n);
    const Tensor vt = sc.vt.reshaped(nh * hd, n), heads = sc.heads.row_range(0, nh * n);
    linear(b.qkv, b.qkv_b, x, qkv);
    be.vision_qkv(qkv, rope, nh, q, k, vt);
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<MatmulJob> jobs(static_cast<size_t>(nh));
    for (int64_t q0 = 0; q0 < n; q0 += sc.nq) {
        const int64_t nq = std::min(sc.nq, n - q0);
        const Tensor scores = sc.scores.reshaped(nh * nq, n);
        for (int64_t h = 0; h < nh; ++h)  // scores[h] = Q_h K_h^T: [nq][n]
            jobs[size_t(h)] = {k.row_range(h * n, n), q.row_range(h * n + q0, nq), scores.row_range(h * nq, nq)};
        be.matmul(jobs.data(), nh);
        be.softmax_scaled(scores, scale);
        for (int64_t h = 0; h < nh; ++h)  // heads[h][q0..] = P_h V_h: [nq][hd]
            jobs[size_t(h)] = {vt.row_range(h * hd, hd), scores.row_range(h * nq, nq), heads.row_range(h * n + q0, nq)};
        be.matmul(jobs.data(), nh);
    }
    const Tensor attn = sc.attn.row_range(0, n);
    for (int64_t h = 0; h < nh; ++h) be.copy(heads.row_range(h * n, n), attn.col_range(h * hd, hd));
    linear(b.out, b.out_b, attn, y);
}

}  // namespace regolith
