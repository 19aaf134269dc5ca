#include "model/ple.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/crc32c.h"
#include "core/dequant.h"
#include "core/errors.h"
#include "core/gguf_set.h"
#include "core/types.h"
#include "model/metadata.h"
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

namespace {

constexpr char kPleMagic[8] = {'R', 'G', 'P', 'L', 'E', 'T', 'A', 'B'};
constexpr uint32_t kPleVersion = 1;
constexpr size_t kPleHeader = 96;

template <class T>
T get_le(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

}  // namespace

uint64_t PleTableSource::row_offset(int64_t row) const {
    if (rows_per_block == 0) return offset + uint64_t(row) * uint64_t(row_bytes);
    return offset + uint64_t(row / rows_per_block) * block_bytes + uint64_t(row % rows_per_block) * uint64_t(row_bytes);
}

PleTableSource ple_table_from_pack(const std::string& path) {
    DirectFile f(path, O_RDONLY, false);
    const uint64_t size = f.size();
    auto bad = [&](const std::string& what) { return ModelFormatError(path + ": " + what); };
    uint8_t h[kPleHeader];
    if (size < kPleHeader || f.read_at(h, kPleHeader, 0) != kPleHeader) throw bad("too short for a PLE table file");
    if (std::memcmp(h, kPleMagic, 8) != 0) throw bad("not a regolith PLE table file (bad magic)");
    if (get_le<uint32_t>(h + 8) != kPleVersion)
        throw bad("PLE table version " + std::to_string(get_le<uint32_t>(h + 8)) + " (this regolith reads " +
                  std::to_string(kPleVersion) + ")");
    PleTableSource s;
    s.path = path;
    s.type = get_le<uint32_t>(h + 12);
    s.rows = int64_t(get_le<uint64_t>(h + 16));
    s.head_dim = int64_t(get_le<uint64_t>(h + 24));
    s.row_bytes = int64_t(get_le<uint64_t>(h + 32));
    s.rows_per_block = int64_t(get_le<uint64_t>(h + 40));
    s.block_bytes = get_le<uint64_t>(h + 48);
    const uint64_t n_blocks = get_le<uint64_t>(h + 56), crc_off = get_le<uint64_t>(h + 64);
    s.offset = get_le<uint64_t>(h + 72);
    const uint64_t file_bytes = get_le<uint64_t>(h + 80);
    const uint32_t head_crc = get_le<uint32_t>(h + 88);
    if (file_bytes != size)
        throw bad("is " + std::to_string(size) + " bytes, its header says " + std::to_string(file_bytes) +
                  " (truncated or appended to)");
    // The checksum first (once the table it covers is known to lie in the file), then the meaning.
    if (crc_off < kPleHeader || n_blocks > size / 4 || crc_off + 4 * n_blocks > size)
        throw bad("inconsistent header (checksum table)");
    s.block_crcs.resize(size_t(n_blocks));
    if (f.read_at(reinterpret_cast<uint8_t*>(s.block_crcs.data()), size_t(4 * n_blocks), crc_off) != 4 * n_blocks)
        throw bad("truncated checksum table");
    uint32_t crc = crc32c(0, h, 88);
    crc = crc32c(crc, s.block_crcs.data(), size_t(4 * n_blocks));
    if (crc != head_crc) throw bad("header checksum mismatch (the file is corrupt)");
    const TypeTraits* t = type_traits(s.type);
    if (!t || !t->supported) throw bad("unsupported row type id " + std::to_string(s.type));
    if (s.rows <= 0 || s.head_dim <= 0 || s.head_dim % t->block_elems != 0 ||
        s.row_bytes != type_row_bytes(*t, s.head_dim))
        throw bad("inconsistent row shape");
    if (s.block_bytes == 0 || s.block_bytes % kDirectAlign != 0 || s.rows_per_block <= 0 ||
        uint64_t(s.rows_per_block) * uint64_t(s.row_bytes) > s.block_bytes ||
        n_blocks != (uint64_t(s.rows) + uint64_t(s.rows_per_block) - 1) / uint64_t(s.rows_per_block))
        throw bad("inconsistent block geometry");
    if (crc_off + 4 * n_blocks > s.offset || s.offset % kDirectAlign != 0 || s.offset + n_blocks * s.block_bytes != size)
        throw bad("inconsistent header (data offset)");
    return s;
}

PleTable::PleTable(PleTableSource source, const PleReadOptions& opt) : src_(std::move(source)) {
    file_ = std::make_unique<DirectFile>(src_.path, O_RDONLY, opt.direct);
    pool_ = std::make_unique<ThreadPool>(std::max(1, opt.io_threads));
    capacity_ = opt.cache_bytes / (src_.head_dim * 4);
    cache_.resize(size_t(capacity_ * src_.head_dim));
    cache_row_.assign(size_t(capacity_), -1);
    lru_pos_.resize(size_t(capacity_));
    for (int64_t i = 0; i < capacity_; ++i) lru_pos_[size_t(i)] = lru_.insert(lru_.end(), i);
}

PleTable::~PleTable() = default;

bool PleTable::direct() const { return file_->direct(); }

void PleTable::read_row(int64_t row, float* dst) {
    if (row < 0 || row >= src_.rows)
        throw Error("PLE table: row " + std::to_string(row) + " out of range [0, " + std::to_string(src_.rows) + ")");
    // One aligned extent around the row: exactly its block in a packed table.
    const uint64_t at = src_.row_offset(row), start = align_down(at), end = align_up(at + uint64_t(src_.row_bytes));
    thread_local AlignedBuffer buf(0);
    if (buf.size < end - start) buf = AlignedBuffer(size_t(end - start));
    const size_t got = file_->read_at(buf.data.get(), size_t(end - start), start);
    if (got < at + uint64_t(src_.row_bytes) - start)
        throw IoError(EIO, src_.path, "reading PLE row " + std::to_string(row) + ": unexpected end of file");
    if (src_.rows_per_block > 0) {
        const uint64_t block = uint64_t(row / src_.rows_per_block);
        if (crc32c(0, buf.data.get(), size_t(src_.block_bytes)) != src_.block_crcs[size_t(block)])
            throw ModelFormatError(src_.path + ": PLE block " + std::to_string(block) +
                                   " fails its checksum (the file is corrupt)");
    }
    dequantize_row(src_.type, buf.data.get() + (at - start), dst, src_.head_dim);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.rows_read += 1;
    stats_.bytes_read += end - start;
}

void PleTable::read_rows(const int64_t* rows, int64_t n, float* dst) {
    const int64_t hd = src_.head_dim;
    std::vector<int64_t> miss;  // indices into rows
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.rows_requested += uint64_t(n);
        for (int64_t i = 0; i < n; ++i) {
            auto it = cached_.find(rows[i]);
            if (it == cached_.end()) {
                miss.push_back(i);
                continue;
            }
            ++stats_.cache_hits;
            std::copy_n(cache_.data() + it->second * hd, hd, dst + i * hd);
            lru_.splice(lru_.begin(), lru_, lru_pos_[size_t(it->second)]);
        }
    }
    if (miss.empty()) return;
    pool_->parallel_for(int64_t(miss.size()), 1, [&](int64_t a, int64_t b) {
        for (int64_t j = a; j < b; ++j) read_row(rows[miss[size_t(j)]], dst + miss[size_t(j)] * hd);
    });
    if (capacity_ == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i : miss) {
        if (cached_.count(rows[i])) continue;  // the same row twice in this call
        const int64_t e = lru_.back();
        if (cache_row_[size_t(e)] >= 0) cached_.erase(cache_row_[size_t(e)]);
        cache_row_[size_t(e)] = rows[i];
        cached_[rows[i]] = e;
        std::copy_n(dst + i * hd, hd, cache_.data() + e * hd);
        lru_.splice(lru_.begin(), lru_, lru_pos_[size_t(e)]);
    }
}

PleTableStats PleTable::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

void PleTable::reset_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = PleTableStats{};
}

// ---- loading ---------------------------------------------------------------------------------------

PleLayer::PleLayer(const ModelWeights& wt, int64_t layer, const PleReadOptions& read,
                   const PleTableSource* packed) {
    const GgufSet& file = wt.file();
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

        // The table is read row by row (from the file holding it or the packed file); any supported type decodes whole
        // rows (the GGUF parser checks a row is a whole number of blocks).
        PleTableSource source;
        if (packed) {
            source = *packed;
        } else {
            const std::string table_name = "per_layer_token_embd.weight";
            const GgufTensor* t = file.find_tensor(table_name);
            if (t && t->n_dims != 2)
                throw ModelFormatError("tensor '" + table_name + "' must be 2-D, is " + std::to_string(t->n_dims) +
                                       "-D");
            const int64_t hd = t ? int64_t(t->ne[0]) : 0, n_rows = t ? int64_t(t->ne[1]) : 0;
            const GgufTensor& tab = wt.tensor(table_name, {hd, n_rows});  // present, decodable
            source.path = file.path(tab);
            source.offset = tab.offset;
            source.type = tab.type;
            source.rows = n_rows;
            source.head_dim = hd;
            source.row_bytes = int64_t(tab.row_bytes);
        }
        shape_.head_dim = source.head_dim;
        const int64_t table_rows = source.rows;
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
        table_ = std::make_unique<PleTable>(std::move(source), read);

        const std::string blk = "blk." + std::to_string(layer) + ".";
        const int64_t C = shape_.channels(), K = shape_.conv_kernel;
        w_.key = wt.matrix(blk + "ple_key.weight", C, shape_.ple_dim);
        w_.value = wt.matrix(blk + "ple_value.weight", shape_.hidden, shape_.ple_dim);

        // Small vectors become f32 copies whatever their file type. The conv tensor's shape bounds
        // conv_kernel by the file size before anything is sized by it; the norms may be [hc * hidden] or
        // [hidden, hc] (llama.cpp accepts both).
        wt.tensor(blk + "ple_conv1d.weight", {K, C});
        std::vector<float> v(size_t(C * (3 + K)));
        wt.to_f32(blk + "ple_norm_key.weight", C, v.data());
        wt.to_f32(blk + "ple_norm_query.weight", C, v.data() + C);
        wt.to_f32(blk + "ple_norm_conv.weight", C, v.data() + 2 * C);
        wt.to_f32(blk + "ple_conv1d.weight", K * C, v.data() + 3 * C);
        WeightStore& store = wt.store();
        w_.norm_key = store.upload(RG_TYPE_F32, 1, C, v.data());
        w_.norm_query = store.upload(RG_TYPE_F32, 1, C, v.data() + C);
        w_.norm_conv = store.upload(RG_TYPE_F32, 1, C, v.data() + 2 * C);
        w_.conv = store.upload(RG_TYPE_F32, C, K, v.data() + 3 * C);
    });
}

void PleState::assign(Backend& be, const PleState& other) {
    context = other.context;
    if (!conv.buffer || conv.t.rows != other.conv.t.rows || conv.t.cols != other.conv.t.cols)
        conv = OwnedTensor(be, RG_TYPE_F32, other.conv.t.rows, other.conv.t.cols);
    be.copy(other.conv.t, conv.t);
}

PleState PleLayer::new_state(Backend& be) const {
    PleState s;
    s.context.assign(size_t(hash_.ngram_size - 1), hash_.eos_token_id);
    s.conv = OwnedTensor(be, RG_TYPE_F32, history(), shape_.channels());
    be.zero(s.conv.t);
    return s;
}

// ---- forward ---------------------------------------------------------------------------------------

void PleLayer::forward(Workspace& ws, const int32_t* token_ids, const Tensor& hidden, PleState& state,
                       const Tensor& out) {
    forward(ws, {PleSeq{token_ids, &state, 0, hidden.rows}}, hidden, out);
}

void PleLayer::forward(Workspace& ws, const std::vector<PleSeq>& seqs, const Tensor& hidden, const Tensor& out) {
    const int64_t ntok = hidden.rows;
    if (ntok <= 0) return;
    const int64_t H = hash_.n_heads(), P = shape_.ple_dim, D = shape_.hidden, C = shape_.channels();
    for (const PleSeq& q : seqs)
        if (int64_t(q.state->context.size()) != hash_.ngram_size - 1 || q.state->conv.t.rows != history() ||
            q.state->conv.t.cols != C)
            throw Error("PleLayer::forward: the state belongs to another layer");
    Backend& be = ws.backend();
    Workspace::Scope scope(ws);

    std::vector<int64_t> rows(size_t(ntok * H));  // [ntok][H]
    for (const PleSeq& q : seqs)
        ple_ngram_rows(hash_, q.state->context.data(), q.token_ids, q.ntok, rows.data() + q.t0 * H);
    std::vector<float> emb(size_t(ntok * P));  // [ntok][H * hd], read from the table on the host
    table_->read_rows(rows.data(), ntok * H, emb.data());
    const Tensor e = ws.f32(ntok, P);
    be.write(e, emb.data());

    const Tensor key = ws.f32(ntok, C), value = ws.f32(ntok, D);  // [ntok][hc*D], [ntok][D]
    be.matmul(w_.key, e, key);
    be.matmul(w_.value, e, value);
    // out = the gated values; normed = their RMSNorm, the conv input (its history is the state)
    const Tensor normed = ws.f32(ntok, C);
    be.ple_gate(key, hidden, value, w_.norm_key, w_.norm_query, w_.norm_conv, shape_.hc, shape_.eps, out, normed);
    std::vector<PleConvSeq> conv;
    for (const PleSeq& q : seqs) conv.push_back({q.state->conv.t, q.t0, q.ntok});
    be.ple_conv(normed, w_.conv, dilation(), conv.data(), int64_t(conv.size()), out);

    // Advance each n-gram context: the last ngram_size-1 token ids.
    const int64_t nctx = hash_.ngram_size - 1;
    for (const PleSeq& q : seqs) {
        std::vector<int64_t> ctx(q.state->context);
        for (int64_t t = 0; t < q.ntok; ++t) ctx.push_back(q.token_ids[t]);
        std::copy(ctx.end() - nctx, ctx.end(), q.state->context.begin());
    }
}

}  // namespace regolith
