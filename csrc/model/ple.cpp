#include "model/ple.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/dequant.h"
#include "core/errors.h"
#include "core/gguf.h"
#include "model/metadata.h"
#include "model/nn.h"
#include "model/weights.h"

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
      row_bytes_(row_bytes) {
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
    thread_local std::vector<uint8_t> buf;  // one raw row; per thread, so windows may read concurrently
    buf.resize(size_t(row_bytes_));
    size_t done = 0;
    while (done < buf.size()) {
        const ssize_t got = ::pread(fd_, buf.data() + done, buf.size() - done, off_t(at + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            throw Error("PLE table: reading row " + std::to_string(row) + " of " + path_ + ": " +
                        (got < 0 ? std::strerror(errno) : "unexpected end of file"));
        done += size_t(got);
    }
    dequantize_row(type_, buf.data(), dst, head_dim_);
    rows_read_.fetch_add(1, std::memory_order_relaxed);
    bytes_read_.fetch_add(uint64_t(row_bytes_), std::memory_order_relaxed);
}

// ---- loading ---------------------------------------------------------------------------------------

PleLayer::PleLayer(const GgufFile& file, const std::string& path, int64_t layer, Backend& backend)
    : backend_(&backend) {
    with_context("PLE: ", [&] {
        const std::string prefix = meta::require_arch(file, "qwen4exp");
        auto key = [&](const std::string& suffix) { return prefix + suffix; };
        auto bad = [&](const std::string& suffix, const std::string& what) {
            throw ModelFormatError("metadata key '" + key(suffix) + "' " + what);
        };
        auto integers = [&](const std::string& suffix) {
            auto v = meta::get_int_array(file, key(suffix));
            if (!v) throw ModelFormatError("missing metadata key '" + key(suffix) + "'");
            return *v;
        };

        const std::vector<int64_t> layers = integers("ple.layers");
        if (std::find(layers.begin(), layers.end(), layer) == layers.end())
            throw ModelFormatError("layer " + std::to_string(layer) + " has no PLE (qwen4exp.ple.layers)");
        // The format holds one table and one set of hash constants, so one PLE layer (as llama.cpp requires).
        if (layers.size() != 1)
            throw ModelFormatError("qwen4exp.ple.layers lists " + std::to_string(layers.size()) +
                                   " layers; the GGUF format holds the hash constants of one");

        hash_.ngram_size = meta::require_int(file, key("ple.ngram_size"));
        hash_.heads_per_ngram = meta::require_int(file, key("ple.heads_per_ngram"));
        hash_.eos_token_id = meta::require_int(file, key("ple.eos_token_id"));
        if (hash_.ngram_size < 2 || hash_.ngram_size > 64) bad("ple.ngram_size", "must be in [2, 64]");
        if (hash_.heads_per_ngram < 1 || hash_.heads_per_ngram > 4096)
            bad("ple.heads_per_ngram", "must be in [1, 4096]");
        const int64_t heads = hash_.n_heads();
        // The multipliers are written as uint64; every one is below 2^63, and a larger one is an error.
        hash_.multipliers = integers("ple.layer_multipliers");
        hash_.head_offsets = integers("ple.head_offsets");
        hash_.head_vocab_sizes = integers("ple.head_vocab_sizes");
        if (int64_t(hash_.multipliers.size()) != hash_.ngram_size)
            bad("ple.layer_multipliers", "must have ngram_size = " + std::to_string(hash_.ngram_size) + " elements");
        if (int64_t(hash_.head_offsets.size()) != heads)
            bad("ple.head_offsets",
                "must have (ngram_size-1)*heads_per_ngram = " + std::to_string(heads) + " elements");
        if (int64_t(hash_.head_vocab_sizes.size()) != heads)
            bad("ple.head_vocab_sizes", "must have " + std::to_string(heads) + " elements");

        shape_.hidden = meta::require_int(file, key("embedding_length"));
        shape_.hc = meta::require_int(file, key("hyper_connection.count"));
        shape_.conv_kernel = meta::require_int(file, key("ple.conv_kernel"));
        shape_.eps = meta::require_float(file, key("attention.layer_norm_rms_epsilon"));
        if (shape_.hidden < 1 || shape_.hc < 1 || shape_.conv_kernel < 1)
            throw ModelFormatError("embedding_length, hyper_connection.count and ple.conv_kernel must be positive");

        // The table is read row by row from `path`; any supported type decodes whole rows (the GGUF parser
        // checks a row is a whole number of blocks).
        const ModelWeights wt(file);
        const std::string table_name = "per_layer_token_embd.weight";
        const GgufTensor* t = file.find_tensor(table_name);
        if (t && t->n_dims != 2)
            throw ModelFormatError("tensor '" + table_name + "' must be 2-D, is " + std::to_string(t->n_dims) + "-D");
        shape_.head_dim = t ? int64_t(t->ne[0]) : 0;
        const int64_t table_rows = t ? int64_t(t->ne[1]) : 0;
        const GgufTensor& tab = wt.tensor(table_name, {shape_.head_dim, table_rows});  // present, decodable
        if (const auto per_layer = meta::get_int(file, key("embedding_length_per_layer_input"));
            per_layer && *per_layer != shape_.head_dim)
            throw ModelFormatError("embedding_length_per_layer_input disagrees with the table row length " +
                                   std::to_string(shape_.head_dim));
        for (int64_t h = 0; h < heads; ++h) {
            const int64_t off = hash_.head_offsets[size_t(h)], size = hash_.head_vocab_sizes[size_t(h)];
            if (size < 1 || off < 0 || off > table_rows - size)
                throw ModelFormatError("head " + std::to_string(h) + " rows [" + std::to_string(off) + ", +" +
                                       std::to_string(size) + ") do not fit the table's " +
                                       std::to_string(table_rows) + " rows");
        }
        shape_.ple_dim = heads * shape_.head_dim;
        table_ = std::make_unique<PleTable>(path, tab.offset, tab.type, table_rows, shape_.head_dim,
                                            int64_t(tab.row_bytes));

        const std::string blk = "blk." + std::to_string(layer) + ".";
        const int64_t C = shape_.channels(), K = shape_.conv_kernel;
        w_.key = wt.matrix(blk + "ple_key.weight", C, shape_.ple_dim);
        w_.value = wt.matrix(blk + "ple_value.weight", shape_.hidden, shape_.ple_dim);

        // Small vectors become f32 copies whatever their file type. The conv tensor's shape bounds
        // conv_kernel by the file size before anything is sized by it; the norms may be [hc * hidden] or
        // [hidden, hc] (llama.cpp accepts both).
        wt.tensor(blk + "ple_conv1d.weight", {K, C});
        vectors_.resize(size_t(C * (3 + K)));
        float* v = vectors_.data();
        wt.to_f32(blk + "ple_norm_key.weight", C, v);
        wt.to_f32(blk + "ple_norm_query.weight", C, v + C);
        wt.to_f32(blk + "ple_norm_conv.weight", C, v + 2 * C);
        wt.to_f32(blk + "ple_conv1d.weight", K * C, v + 3 * C);
        w_.norm_key = v;
        w_.norm_query = v + C;
        w_.norm_conv = v + 2 * C;
        w_.conv = v + 3 * C;
    });
}

PleState PleLayer::new_state() const {
    PleState s;
    s.context.assign(size_t(hash_.ngram_size - 1), hash_.eos_token_id);
    s.conv.assign(size_t(history() * shape_.channels()), 0.0f);
    return s;
}

// ---- forward ---------------------------------------------------------------------------------------

using nn::inv_rms;

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
    Backend& be = *backend_;
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
            const float sig = nn::sigmoid(g);
            for (int64_t d = 0; d < D; ++d) gated[s * D + d] = sig * value[size_t(t * D + d)];
            nn::rms_norm(gated + s * D, D, w_.norm_conv + s * D, shape_.eps, xs.data() + (hist + t) * C + s * D);
        }
    }
    // Depthwise causal conv, dilation = ngram_size: tap k reads (K-1-k)*dil tokens back.
    for (int64_t t = 0; t < ntok; ++t) {
        for (int64_t c = 0; c < C; ++c) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; ++k)
                acc += w_.conv[c * K + k] * xs[size_t((hist + t - (K - 1 - k) * dil) * C + c)];
            out[t * C + c] += nn::silu(acc);
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
