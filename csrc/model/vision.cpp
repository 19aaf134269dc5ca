#include "model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/errors.h"
#include "core/exp_nonpos.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "model/metadata.h"
#include "model/weights.h"

namespace regolith {

namespace {

constexpr const char* kProjector = "qwen3vl_merger";
constexpr int64_t kQueryChunk = 96;  // attention queries per score block: [heads][chunk][patches] floats

// Runs fn(r) for rows 0..n-1 on the thread pool.
template <class F>
void for_rows(int64_t n, F&& fn) {
    default_pool()->parallel_for(n, 8, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) fn(r);
    });
}

// sum over x[0..n) of f(x[i]) in double, in 8 interleaved lanes combined in a fixed order (no serial chain).
template <class F>
double sum_lanes(const float* x, int64_t n, F f) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += f(double(x[i + j]));
    for (; i < n; ++i) acc[0] += f(double(x[i]));
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
double identity(double v) { return v; }

// torch.nn.LayerNorm over n elements: mean and variance in double, the rest in float.
void layer_norm(const float* x, int64_t n, const float* w, const float* b, float eps, float* y) {
    const double mean = sum_lanes(x, n, identity) / double(n);
    const double var = sum_lanes(x, n, [mean](double v) { return (v - mean) * (v - mean); }) / double(n);
    const float m = float(mean), rstd = float(1.0 / std::sqrt(var + double(eps)));
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * rstd * w[i] + b[i];
}

// softmax(scale * s) over n scores in place: max in 8 lanes, e^x by exp_nonpos, the sum in double lanes.
// (std::max, not std::fmax: scores are never NaN, and fmax is a libm call per element.)
void scaled_softmax(float* s, int64_t n, float scale) {
    float lane[8];
    for (int j = 0; j < 8; ++j) lane[j] = -std::numeric_limits<float>::infinity();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) lane[j] = std::max(lane[j], s[i + j] * scale);
    for (; i < n; ++i) lane[0] = std::max(lane[0], s[i] * scale);
    const float mx = std::max(std::max(std::max(lane[0], lane[1]), std::max(lane[2], lane[3])),
                              std::max(std::max(lane[4], lane[5]), std::max(lane[6], lane[7])));
    for (i = 0; i < n; ++i) s[i] = exp_nonpos(s[i] * scale - mx);
    const float inv = float(1.0 / sum_lanes(s, n, identity));
    for (i = 0; i < n; ++i) s[i] *= inv;
}

// transformers' gelu_pytorch_tanh (the ViT blocks), tanh(u) = sign(u) (1 - e) / (1 + e) with e = e^(-2|u|):
// branch-free, so a row of it vectorises.
float gelu_tanh(float x) {
    const float beta = float(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    const float u = beta * (x + kappa * x * x * x);
    const float e = exp_nonpos(-2.0f * std::fabs(u));
    return 0.5f * x * (1.0f + std::copysign((1.0f - e) / (1.0f + e), u));
}
// torch.nn.GELU() (the merger), in float.
float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * float(M_SQRT1_2))); }

WeightView f32_view(const float* data, int64_t rows, int64_t cols) {
    return {RG_TYPE_F32, data, rows, cols, cols * int64_t(sizeof(float))};
}

// y[r] = W x[r] + b for n rows.
void linear(Backend& be, const WeightView& w, const float* b, const float* x, int64_t n, float* y) {
    be.matmul(w, x, n, y);
    for_rows(n, [&](int64_t r) {
        float* row = y + r * w.rows;
        for (int64_t i = 0; i < w.rows; ++i) row[i] += b[i];
    });
}

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

VisionConfig VisionConfig::from_gguf(const GgufFile& f) {
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
    : file_(path), backend_(backend), config_(VisionConfig::from_gguf(file_)) {
    const VisionConfig& c = config_;
    const ModelWeights w(file_);
    const int64_t h = c.hidden, pp = c.patch * c.patch;
    auto vec = [&](const std::string& name, int64_t n) { return w.f32_or_convert(name, {n}, owned_); };

    // Conv3d kernel [hidden][channels][temporal][p][p]; llama.cpp stores one [hidden][channels][p][p] per frame
    patch_w_.resize(size_t(h * c.patch_dim()));
    for (int64_t fr = 0; fr < c.temporal; ++fr) {
        const std::string name = fr == 0 ? "v.patch_embd.weight" : "v.patch_embd.weight." + std::to_string(fr);
        const float* src = w.f32_or_convert(name, {c.patch, c.patch, c.channels, h}, owned_);
        for (int64_t o = 0; o < h; ++o)
            for (int64_t ch = 0; ch < c.channels; ++ch)
                std::copy_n(src + (o * c.channels + ch) * pp, pp,
                            &patch_w_[size_t(((o * c.channels + ch) * c.temporal + fr) * pp)]);
    }
    patch_view_ = f32_view(patch_w_.data(), h, c.patch_dim());
    patch_b_ = vec("v.patch_embd.bias", h);
    pos_embd_ = w.f32_or_convert("v.position_embd.weight", {h, c.grid_side * c.grid_side}, owned_);
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
    for (int64_t i = 0; i < n_images; ++i) {
        const int64_t t = grids[3 * i], h = grids[3 * i + 1], w = grids[3 * i + 2];
        encode_image(pixels, t, h, w, out);
        pixels += t * h * w * c.patch_dim();
        out += t * h * w / (c.merge * c.merge) * c.out_dim;
    }
}

// Per-image working memory, allocated once for all blocks. n: patches of the image, S: of one frame.
struct VisionEncoder::Scratch {
    Scratch(const VisionConfig& c, int64_t n, int64_t S)
        : hp((c.head_dim() + 15) / 16 * 16),
          nq(std::min(S, kQueryChunk)),
          x(size_t(n * c.hidden)),
          xn(x.size()),
          y(x.size()),
          ffn(size_t(n * c.ff)),
          qkv(size_t(S * 3 * c.hidden)),
          q(size_t(c.n_head * S * hp)),
          k(q.size()),
          vt(size_t(c.n_head * c.head_dim() * S)),
          scores(size_t(c.n_head * nq * S)),
          heads(size_t(S * c.hidden)),
          attn(heads.size()) {}
    const int64_t hp;  // head_dim padded with zero columns to whole 16-lane matmul steps
    const int64_t nq;  // queries per score block
    std::vector<float> x, xn, y;  // [n][hidden]: residual stream, normed, sublayer output
    std::vector<float> ffn;       // [n][ff]
    std::vector<float> qkv;       // [S][3][heads][head_dim]
    std::vector<float> q, k;      // [heads][S][hp] rotated
    std::vector<float> vt;        // [heads][head_dim][S]: V^T
    std::vector<float> scores;    // [heads][nq][S]
    std::vector<float> heads;     // [heads][S][head_dim]
    std::vector<float> attn;      // [S][hidden]
};

void VisionEncoder::encode_image(const float* pixels, int64_t t, int64_t gh, int64_t gw, float* out) const {
    const VisionConfig& c = config_;
    Backend& be = backend_;
    const int64_t H = c.hidden, m = c.merge, S = gh * gw, n = t * S, hd = c.head_dim(), side = c.grid_side;
    Scratch ws(c, n, S);
    std::vector<float>&x = ws.x, &xn = ws.xn, &y = ws.y, &ffn = ws.ffn;

    // patch embedding + the position grid resampled to gh x gw (patches in merge-block order)
    linear(be, patch_view_, patch_b_, pixels, n, x.data());
    std::vector<float> cos(size_t(n * hd / 2)), sin(size_t(n * hd / 2));  // [n][hd/2]: rows then columns
    std::vector<float> inv_freq(size_t(hd / 4));
    for (int64_t i = 0; i < hd / 4; ++i) inv_freq[i] = 1.0f / std::pow(c.rope_theta, float(2 * i) / float(hd / 2));
    for_rows(n, [&](int64_t k) {
        const int64_t within = k % S, bw = gw / m;
        const int64_t row = within / (m * m * bw) * m + within / m % m;
        const int64_t col = within / (m * m) % bw * m + within % m;
        int64_t ht[2], wt[2];
        float hw[2], ww[2];
        axis_taps(row, gh, side, ht, hw);
        axis_taps(col, gw, side, wt, ww);
        float* xr = &x[size_t(k * H)];
        float* pos = &xn[size_t(k * H)];  // the resampled position embedding (xn is free until the norm)
        std::fill_n(pos, H, 0.0f);
        for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
                const float* pe = pos_embd_ + (ht[a] * side + wt[b]) * H;
                const float wgt = hw[a] * ww[b];
                for (int64_t d = 0; d < H; ++d) pos[d] += pe[d] * wgt;
            }
        for (int64_t d = 0; d < H; ++d) xr[d] += pos[d];
        for (int64_t j = 0; j < hd / 2; ++j) {
            const float angle = float(j < hd / 4 ? row : col) * inv_freq[size_t(j % (hd / 4))];
            cos[size_t(k * hd / 2 + j)] = std::cos(angle);
            sin[size_t(k * hd / 2 + j)] = std::sin(angle);
        }
    });

    // x[r] += y[r] on the pool
    const auto add_rows = [&](const std::vector<float>& src) {
        for_rows(n, [&](int64_t r) {
            for (int64_t i = r * H; i < (r + 1) * H; ++i) x[size_t(i)] += src[size_t(i)];
        });
    };
    for (const Block& b : blocks_) {
        for_rows(n, [&](int64_t r) { layer_norm(&x[size_t(r * H)], H, b.ln1_w, b.ln1_b, c.eps, &xn[size_t(r * H)]); });
        for (int64_t f = 0; f < t; ++f)
            attention(b, xn.data() + f * S * H, S, cos.data() + f * S * hd / 2, sin.data() + f * S * hd / 2,
                      y.data() + f * S * H, ws);
        add_rows(y);
        for_rows(n, [&](int64_t r) { layer_norm(&x[size_t(r * H)], H, b.ln2_w, b.ln2_b, c.eps, &xn[size_t(r * H)]); });
        linear(be, b.up, b.up_b, xn.data(), n, ffn.data());
        for_rows(n, [&](int64_t r) {
            float* row = &ffn[size_t(r * c.ff)];
            for (int64_t i = 0; i < c.ff; ++i) row[i] = gelu_tanh(row[i]);
        });
        linear(be, b.down, b.down_b, ffn.data(), n, y.data());
        add_rows(y);
    }

    // merger: norm each patch, then one row per merge x merge block (its patches are consecutive)
    for_rows(n, [&](int64_t r) { layer_norm(&x[size_t(r * H)], H, post_w_, post_b_, c.eps, &xn[size_t(r * H)]); });
    const int64_t n_out = n / (m * m), merged = H * m * m;
    std::vector<float> mid(size_t(n_out * merged));  // [n_out][merged]
    linear(be, mm0_, mm0_b_, xn.data(), n_out, mid.data());
    for_rows(n_out, [&](int64_t r) {
        for (int64_t i = r * merged; i < (r + 1) * merged; ++i) mid[size_t(i)] = gelu_erf(mid[size_t(i)]);
    });
    linear(be, mm2_, mm2_b_, mid.data(), n_out, out);
}

// Bidirectional attention over the n patches of one frame. x: [n][hidden] (normed), cos/sin: [n][hd/2],
// y: [n][hidden] after the output projection. Per block of queries, every head's QK^T, then every head's
// PV, each as one batch of matmuls (one head per job; jobs spread over the pool's threads).
void VisionEncoder::attention(const Block& b, const float* x, int64_t n, const float* cos, const float* sin,
                              float* y, Scratch& ws) const {
    const VisionConfig& c = config_;
    const int64_t H = c.hidden, nh = c.n_head, hd = c.head_dim(), half = hd / 2, hp = ws.hp;
    float *qkv = ws.qkv.data(), *q = ws.q.data(), *k = ws.k.data(), *vt = ws.vt.data();
    float *scores = ws.scores.data(), *heads = ws.heads.data();
    linear(backend_, b.qkv, b.qkv_b, x, n, qkv);
    for_rows(n, [&](int64_t r) {
        const float *cr = cos + r * half, *sr = sin + r * half;
        for (int64_t h = 0; h < nh; ++h) {
            const float* row = qkv + r * 3 * H + h * hd;
            for (int64_t part = 0; part < 2; ++part) {  // q, k rotated: pairs (j, j + hd/2); zero padding
                const float* src = row + part * H;
                float* dst = (part == 0 ? q : k) + (h * n + r) * hp;
                for (int64_t j = 0; j < half; ++j) {
                    const float a = src[j], bb = src[j + half];
                    dst[j] = a * cr[j] - bb * sr[j];
                    dst[j + half] = bb * cr[j] + a * sr[j];
                }
                std::fill(dst + hd, dst + hp, 0.0f);
            }
            for (int64_t d = 0; d < hd; ++d) vt[(h * hd + d) * n + r] = row[2 * H + d];
        }
    });
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<MatmulJob> jobs(static_cast<size_t>(nh));
    for (int64_t q0 = 0; q0 < n; q0 += ws.nq) {
        const int64_t nq = std::min(ws.nq, n - q0);
        for (int64_t h = 0; h < nh; ++h)  // scores[h] = Q_h K_h^T: [nq][n]
            jobs[size_t(h)] = {f32_view(k + h * n * hp, n, hp), q + (h * n + q0) * hp, nq,
                               scores + h * nq * n};
        backend_.matmul_batch(jobs.data(), nh);
        for_rows(nh * nq, [&](int64_t r) { scaled_softmax(scores + r * n, n, scale); });
        for (int64_t h = 0; h < nh; ++h)  // heads[h][q0..] = P_h V_h: [nq][hd]
            jobs[size_t(h)] = {f32_view(vt + h * hd * n, hd, n), scores + h * nq * n, nq,
                               heads + (h * n + q0) * hd};
        backend_.matmul_batch(jobs.data(), nh);
    }
    float* attn = ws.attn.data();
    for_rows(n, [&](int64_t r) {
        for (int64_t h = 0; h < nh; ++h) std::copy_n(heads + (h * n + r) * hd, hd, attn + r * H + h * hd);
    });
    linear(backend_, b.out, b.out_b, attn, n, y);
}

}  // namespace regolith
