#include "model/ple.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string_view>
#include <variant>

#include "core/dequant.h"
#include "core/errors.h"
#include "core/gguf.h"
#include "core/types.h"

namespace regolith {

// ---- hashing ---------------------------------------------------------------------------------------

void ple_ngram_rows(const PleHashParams& p, const int64_t* context, const int32_t* tokens, int64_t ntok,
                    int64_t* rows) {
    const int64_t n = p.ngram_size, nctx = n - 1, heads = p.n_heads();
    // token at history position i: context for i < nctx, then tokens
    auto at = [&](int64_t i) -> int64_t { return i < nctx ? context[i] : int64_t(tokens[i - nctx]); };
    std::vector<int64_t> w(static_cast<size_t>(n));
    for (int64_t t = 0; t < ntok; ++t) {
        const int64_t pos = nctx + t;
        w[0] = at(pos);
        bool cut = false;  // an EOS was passed walking back: everything at or before it reads as EOS
        for (int64_t s = 1; s < n; ++s) {
            const int64_t tok = cut ? p.eos_token_id : at(pos - s);
            cut = cut || tok == p.eos_token_id;
            w[s] = tok;
        }
        // torch int64 multiply and xor wrap modulo 2^64: do them in uint64, reinterpret as int64
        uint64_t mixed = uint64_t(w[0]) * uint64_t(p.multipliers[0]);
        for (int64_t k = 2; k <= n; ++k) {
            mixed ^= uint64_t(w[k - 1]) * uint64_t(p.multipliers[k - 1]);
            const int64_t m = int64_t(mixed);
            for (int64_t g = 0; g < p.heads_per_ngram; ++g) {
                const int64_t h = (k - 2) * p.heads_per_ngram + g;
                const int64_t size = p.head_vocab_sizes[size_t(h)];
                int64_t r = m % size;  // torch.remainder: the result takes the divisor's sign
                if (r < 0) r += size;
                rows[t * heads + h] = r + p.head_offsets[size_t(h)];
            }
        }
    }
}

// ---- table ---------------------------------------------------------------------------------------

PleTable::PleTable(const std::string& path, uint64_t offset, uint32_t type, int64_t rows, int64_t head_dim,
                   int64_t row_bytes)
    : path_(path),
      offset_(offset),
      type_(type),
      rows_(rows),
      head_dim_(head_dim),
      row_bytes_(row_bytes),
      buf_(size_t(row_bytes)) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error("PLE table: cannot open " + path + ": " + std::strerror(errno));
}

PleTable::~PleTable() {
    if (fd_ >= 0) ::close(fd_);
}

void PleTable::read_row(int64_t row, float* dst) {
    if (row < 0 || row >= rows_)
        throw Error("PLE table: row " + std::to_string(row) + " out of range [0, " + std::to_string(rows_) +
                    ")");
    const uint64_t at = offset_ + uint64_t(row) * uint64_t(row_bytes_);
    size_t done = 0;
    while (done < buf_.size()) {
        const ssize_t got = ::pread(fd_, buf_.data() + done, buf_.size() - done, off_t(at + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            throw Error("PLE table: reading row " + std::to_string(row) + " of " + path_ + ": " +
                        (got < 0 ? std::strerror(errno) : "unexpected end of file"));
        done += size_t(got);
    }
    dequantize_row(type_, buf_.data(), dst, head_dim_);
    rows_read_ += 1;
    bytes_read_ += uint64_t(row_bytes_);
}

// ---- loading ---------------------------------------------------------------------------------------

namespace {

class Reader {
  public:
    Reader(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}

    const GgufValue& value(const std::string& suffix) const {
        const std::string key = arch_ + "." + suffix;
        const GgufValue* v = f_.find(key);
        if (!v) throw ModelFormatError("PLE: metadata key '" + key + "' is missing");
        return *v;
    }

    int64_t integer(const std::string& suffix) const {
        const GgufValue& v = value(suffix);
        return std::visit(
            [&](const auto& x) -> int64_t {
                using T = std::decay_t<decltype(x)>;
                if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
                    if constexpr (std::is_same_v<T, uint64_t>)
                        if (x > uint64_t(INT64_MAX)) bad(suffix, "does not fit int64");
                    return int64_t(x);
                } else {
                    bad(suffix, "is not an integer");
                    return 0;
                }
            },
            static_cast<const GgufVariant&>(v));
    }

    double real(const std::string& suffix) const {
        const GgufValue& v = value(suffix);
        if (const auto* f = std::get_if<float>(&v)) return *f;
        if (const auto* d = std::get_if<double>(&v)) return *d;
        bad(suffix, "is not a float");
        return 0;
    }

    // An integer array of any integer element type (the hash constants are written as uint64).
    std::vector<int64_t> integers(const std::string& suffix) const {
        const auto* a = std::get_if<GgufArray>(&value(suffix));
        if (!a || !a->data) bad(suffix, "is not an integer array");
        std::vector<int64_t> out(size_t(a->size));
        for (uint64_t i = 0; i < a->size; ++i) {
            const uint8_t* p = a->data;
            switch (a->type) {
                case GgufValueType::UINT8:
                    out[i] = p[i];
                    break;
                case GgufValueType::INT8:
                    out[i] = int8_t(p[i]);
                    break;
                case GgufValueType::UINT16:
                    out[i] = load<uint16_t>(p, i);
                    break;
                case GgufValueType::INT16:
                    out[i] = load<int16_t>(p, i);
                    break;
                case GgufValueType::UINT32:
                    out[i] = load<uint32_t>(p, i);
                    break;
                case GgufValueType::INT32:
                    out[i] = load<int32_t>(p, i);
                    break;
                case GgufValueType::INT64:
                    out[i] = load<int64_t>(p, i);
                    break;
                case GgufValueType::UINT64: {
                    const uint64_t x = load<uint64_t>(p, i);
                    if (x > uint64_t(INT64_MAX)) bad(suffix, "has an element that does not fit int64");
                    out[i] = int64_t(x);
                    break;
                }
                default:
                    bad(suffix, "is not an integer array");
            }
        }
        return out;
    }

    const GgufTensor& tensor(const std::string& name) const {
        const GgufTensor* t = f_.find_tensor(name);
        if (!t) throw ModelFormatError("PLE: tensor '" + name + "' is missing");
        return *t;
    }

    [[noreturn]] void bad(const std::string& suffix, const std::string& what) const {
        throw ModelFormatError("PLE: metadata key '" + arch_ + "." + suffix + "' " + what);
    }

  private:
    template <class T>
    static T load(const uint8_t* p, uint64_t i) {
        T v;
        std::memcpy(&v, p + i * sizeof(T), sizeof(T));
        return v;
    }

    const GgufFile& f_;
    std::string arch_;
};

std::string dims(const GgufTensor& t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
    return s + "]";
}

void expect_shape(const GgufTensor& t, int64_t ne0, int64_t ne1) {
    if (int64_t(t.ne[0]) != ne0 || int64_t(t.n_elements) != ne0 * ne1)
        throw ModelFormatError("PLE: tensor '" + std::string(t.name) + "' has shape " + dims(t) +
                               ", expected [" + std::to_string(ne0) + ", " + std::to_string(ne1) + "]");
}

WeightView matrix(const GgufTensor& t, int64_t cols, int64_t rows) {
    expect_shape(t, cols, rows);
    const TypeTraits* tt = type_traits(t.type);
    if (!tt || !tt->supported || cols % tt->block_elems != 0)
        throw ModelFormatError("PLE: tensor '" + std::string(t.name) +
                               "' has a type regolith cannot multiply with");
    return {t.type, nullptr, rows, cols, int64_t(t.row_bytes)};
}

}  // namespace

PleLayer::PleLayer(const GgufFile& file, const std::string& path, int64_t layer) {
    const auto* arch = file.find("general.architecture");
    const auto* arch_name = arch ? std::get_if<std::string_view>(arch) : nullptr;
    if (!arch_name || *arch_name != "qwen4exp")
        throw ModelFormatError("PLE: general.architecture must be 'qwen4exp'");
    Reader r(file, "qwen4exp");

    const std::vector<int64_t> layers = r.integers("ple.layers");
    if (std::find(layers.begin(), layers.end(), layer) == layers.end())
        throw ModelFormatError("PLE: layer " + std::to_string(layer) + " has no PLE (qwen4exp.ple.layers)");
    // The format holds one table and one set of hash constants, so one PLE layer (as llama.cpp requires).
    if (layers.size() != 1)
        throw ModelFormatError("PLE: qwen4exp.ple.layers lists " + std::to_string(layers.size()) +
                               " layers; the GGUF format holds the hash constants of one");

    hash_.ngram_size = r.integer("ple.ngram_size");
    hash_.heads_per_ngram = r.integer("ple.heads_per_ngram");
    hash_.eos_token_id = r.integer("ple.eos_token_id");
    if (hash_.ngram_size < 2 || hash_.ngram_size > 64) r.bad("ple.ngram_size", "must be in [2, 64]");
    if (hash_.heads_per_ngram < 1 || hash_.heads_per_ngram > 4096)
        r.bad("ple.heads_per_ngram", "must be in [1, 4096]");
    const int64_t heads = hash_.n_heads();
    hash_.multipliers = r.integers("ple.layer_multipliers");
    hash_.head_offsets = r.integers("ple.head_offsets");
    hash_.head_vocab_sizes = r.integers("ple.head_vocab_sizes");
    if (int64_t(hash_.multipliers.size()) != hash_.ngram_size)
        r.bad("ple.layer_multipliers",
              "must have ngram_size = " + std::to_string(hash_.ngram_size) + " elements");
    if (int64_t(hash_.head_offsets.size()) != heads)
        r.bad("ple.head_offsets",
              "must have (ngram_size-1)*heads_per_ngram = " + std::to_string(heads) + " elements");
    if (int64_t(hash_.head_vocab_sizes.size()) != heads)
        r.bad("ple.head_vocab_sizes", "must have " + std::to_string(heads) + " elements");

    shape_.hidden = r.integer("embedding_length");
    shape_.hc = r.integer("hyper_connection.count");
    shape_.conv_kernel = r.integer("ple.conv_kernel");
    shape_.eps = float(r.real("attention.layer_norm_rms_epsilon"));
    if (shape_.hidden < 1 || shape_.hc < 1 || shape_.conv_kernel < 1)
        throw ModelFormatError(
            "PLE: embedding_length, hyper_connection.count and ple.conv_kernel must be positive");

    const GgufTensor& tab = r.tensor("per_layer_token_embd.weight");
    shape_.head_dim = int64_t(tab.ne[0]);
    const int64_t table_rows = int64_t(tab.n_elements) / std::max<int64_t>(shape_.head_dim, 1);
    if (tab.n_dims != 2)
        throw ModelFormatError("PLE: tensor 'per_layer_token_embd.weight' must be 2-D, is " + dims(tab));
    if (file.find("qwen4exp.embedding_length_per_layer_input") &&
        r.integer("embedding_length_per_layer_input") != shape_.head_dim)
        throw ModelFormatError("PLE: embedding_length_per_layer_input disagrees with the table row length " +
                               std::to_string(shape_.head_dim));
    const TypeTraits* tt = type_traits(tab.type);
    if (!tt || !tt->supported || shape_.head_dim % tt->block_elems != 0)
        throw ModelFormatError("PLE: the table's type cannot be decoded row by row");
    for (int64_t h = 0; h < heads; ++h) {
        const int64_t off = hash_.head_offsets[size_t(h)], size = hash_.head_vocab_sizes[size_t(h)];
        if (size < 1 || off < 0 || off > table_rows - size)
            throw ModelFormatError("PLE: head " + std::to_string(h) + " rows [" + std::to_string(off) +
                                   ", +" + std::to_string(size) + ") do not fit the table's " +
                                   std::to_string(table_rows) + " rows");
    }
    shape_.ple_dim = heads * shape_.head_dim;
    table_ = std::make_unique<PleTable>(path, tab.offset, tab.type, table_rows, shape_.head_dim,
                                        int64_t(tab.row_bytes));

    const std::string blk = "blk." + std::to_string(layer) + ".";
    const int64_t C = shape_.channels();
    const GgufTensor& tk = r.tensor(blk + "ple_key.weight");
    const GgufTensor& tv = r.tensor(blk + "ple_value.weight");
    w_.key = matrix(tk, shape_.ple_dim, C);
    w_.key.data = file.tensor_data(tk);
    w_.value = matrix(tv, shape_.ple_dim, shape_.hidden);
    w_.value.data = file.tensor_data(tv);

    // Small vectors become f32 copies whatever their file type.
    const char* names[4] = {"ple_norm_key.weight", "ple_norm_query.weight", "ple_norm_conv.weight",
                            "ple_conv1d.weight"};
    // The conv tensor's shape bounds conv_kernel by the file size before anything is sized by it.
    expect_shape(r.tensor(blk + names[3]), shape_.conv_kernel, C);
    vectors_.resize(size_t(C * (3 + shape_.conv_kernel)));
    float* dst = vectors_.data();
    const float* ptr[4];
    for (int i = 0; i < 4; ++i) {
        const GgufTensor& t = r.tensor(blk + names[i]);
        const int64_t ne0 = i < 3 ? C : shape_.conv_kernel;
        if (i < 3 && int64_t(t.n_elements) != C)  // llama.cpp also accepts [hidden, hc]
            throw ModelFormatError("PLE: tensor '" + std::string(t.name) + "' has shape " + dims(t) +
                                   ", expected " + std::to_string(C) + " elements");
        if (i == 3) expect_shape(t, ne0, C);
        const TypeTraits* vt = type_traits(t.type);
        if (!vt || !vt->supported || int64_t(t.n_elements) % vt->block_elems != 0)
            throw ModelFormatError("PLE: tensor '" + std::string(t.name) +
                                   "' has a type regolith cannot decode");
        dequantize_row(t.type, file.tensor_data(t), dst, int64_t(t.n_elements));
        ptr[i] = dst;
        dst += t.n_elements;
    }
    w_.norm_key = ptr[0];
    w_.norm_query = ptr[1];
    w_.norm_conv = ptr[2];
    w_.conv = ptr[3];
}

PleState PleLayer::new_state() const {
    PleState s;
    s.context.assign(size_t(hash_.ngram_size - 1), hash_.eos_token_id);
    s.conv.assign(size_t(history() * shape_.channels()), 0.0f);
    return s;
}

// ---- forward ---------------------------------------------------------------------------------------

namespace {

// 1 / rms(x[n]) with the mean accumulated in double.
float inv_rms(const float* x, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
    return float(1.0 / std::sqrt(double(float(ss / double(n))) + double(eps)));
}

}  // namespace

void PleLayer::forward(const int32_t* token_ids, const float* hidden, int64_t ntok, PleState& state,
                       float* out) {
    if (ntok <= 0) return;
    const int64_t H = hash_.n_heads(), hd = shape_.head_dim, P = shape_.ple_dim;
    const int64_t D = shape_.hidden, hc = shape_.hc, C = shape_.channels();
    const int64_t K = shape_.conv_kernel, dil = dilation(), hist = history();
    if (int64_t(state.context.size()) != hash_.ngram_size - 1 || int64_t(state.conv.size()) != hist * C)
        throw Error("PleLayer::forward: the state belongs to another layer");

    std::vector<int64_t> rows(size_t(ntok * H));  // [ntok][H]
    ple_ngram_rows(hash_, state.context.data(), token_ids, ntok, rows.data());

    std::vector<float> emb(size_t(ntok * P));  // [ntok][H * hd]
    for (int64_t i = 0; i < ntok * H; ++i) table_->read_row(rows[size_t(i)], emb.data() + i * hd);

    std::vector<float> key(size_t(ntok * C)), value(size_t(ntok * D));  // [ntok][hc*D], [ntok][D]
    Backend& be = cpu_backend();
    be.matmul(w_.key, emb.data(), ntok, key.data());
    be.matmul(w_.value, emb.data(), ntok, value.data());

    // xs: [hist + ntok][C], the conv input: the state's history, then this call's normed gated values.
    std::vector<float> xs(size_t((hist + ntok) * C));
    std::copy(state.conv.begin(), state.conv.end(), xs.begin());
    const float inv_sqrt_d = float(1.0 / std::sqrt(double(D)));
    for (int64_t t = 0; t < ntok; ++t) {
        float* gated = out + t * C;  // [hc][D], finished below by adding the conv
        for (int64_t s = 0; s < hc; ++s) {
            const float* k = key.data() + t * C + s * D;
            const float* q = hidden + t * C + s * D;
            const float* gk = w_.norm_key + s * D;
            const float* gq = w_.norm_query + s * D;
            const float ik = inv_rms(k, D, shape_.eps), iq = inv_rms(q, D, shape_.eps);
            double dot = 0.0;
            for (int64_t d = 0; d < D; ++d) dot += double((k[d] * ik) * gk[d]) * double((q[d] * iq) * gq[d]);
            float g = float(dot) * inv_sqrt_d;
            const float sgn = g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f);
            g = std::sqrt(std::max(std::fabs(g), 1e-6f)) * sgn;  // signed square root
            const float sig = 1.0f / (1.0f + std::exp(-g));
            for (int64_t d = 0; d < D; ++d) gated[s * D + d] = sig * value[size_t(t * D + d)];
            const float ig = inv_rms(gated + s * D, D, shape_.eps);
            float* x = xs.data() + (hist + t) * C + s * D;
            for (int64_t d = 0; d < D; ++d) x[d] = (gated[s * D + d] * ig) * w_.norm_conv[s * D + d];
        }
    }
    // Depthwise causal conv, dilation = ngram_size: tap k reads (K-1-k)*dil tokens back.
    for (int64_t t = 0; t < ntok; ++t) {
        for (int64_t c = 0; c < C; ++c) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; ++k)
                acc += w_.conv[c * K + k] * xs[size_t((hist + t - (K - 1 - k) * dil) * C + c)];
            out[t * C + c] += acc / (1.0f + std::exp(-acc));  // silu
        }
    }

    // Advance the state: the last hist conv inputs and the last ngram_size-1 token ids.
    std::copy(xs.end() - hist * C, xs.end(), state.conv.begin());
    const int64_t nctx = hash_.ngram_size - 1;
    std::vector<int64_t> ctx(state.context);
    for (int64_t t = 0; t < ntok; ++t) ctx.push_back(token_ids[t]);
    std::copy(ctx.end() - nctx, ctx.end(), state.context.begin());
}

}  // namespace regolith
