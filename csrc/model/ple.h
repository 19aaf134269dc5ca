// qwen4exp PLE ("per-layer embedding"): hashed n-gram embeddings injected into the hyper-connection
// streams of one decoder layer. Reference: transformers Qwen4ExpTextNGramEmbedding + Qwen4ExpTextPLELayer.
//
// Per token t (all f32):
//   rows[h]   = hashed n-gram of (t, t-1, ..., t-n+1) for each head h          (ple_ngram_rows)
//   emb       = concat_h table[rows[h]]                                        [ple_dim = n_heads * head_dim]
//   key       = norm_key(W_key emb)                                            [hc][hidden], grouped RMSNorm
//   value     = W_value emb                                                    [hidden]
//   query     = norm_query(x)                                                  [hc][hidden], x = the streams
//   g[s]      = <key[s], query[s]> / sqrt(hidden);  g = sign(g) sqrt(max(|g|, 1e-6))
//   gated[s]  = sigmoid(g[s]) * value                                          [hc][hidden]
//   out       = gated + silu(conv(norm_conv(gated)))   depthwise causal conv, kernel K, dilation n
// The decoder layer adds `out` to the streams.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/buffers.h"
#include "core/direct_file.h"
#include "core/thread_pool.h"
#include "model/weights.h"

namespace regolith {

class GgufSet;

// The n-gram hash constants (GGUF qwen4exp.ple.*).
struct PleHashParams {
    int64_t ngram_size = 0;                 // n >= 2: heads cover 2-grams .. n-grams
    int64_t heads_per_ngram = 0;            // heads per n-gram order
    int64_t eos_token_id = 0;               // resets the n-gram context
    std::vector<int64_t> multipliers;       // [ngram_size], odd
    std::vector<int64_t> head_offsets;      // [n_heads], first table row of each head
    std::vector<int64_t> head_vocab_sizes;  // [n_heads], rows of each head (> 0)
    int64_t n_heads() const { return (ngram_size - 1) * heads_per_ngram; }
};

// Table row ids of each head for ntok tokens. `context` holds the ngram_size-1 ids before tokens[0],
// oldest first (EOS where there is none). Pure: rows[t][h] for t < ntok, h < n_heads.
//   w[0] = tokens[t]; w[s] = the token s positions back, or EOS once an EOS has been passed walking back
//   (the token's own EOS does not cut its context);
//   mixed_k = (w[0]*m[0]) ^ ... ^ (w[k-1]*m[k-1])  in int64 with wrap-around, for order k = 2..n;
//   rows[t][h] = floor_mod(mixed_k, size[h]) + offset[h]  for the heads_per_ngram heads of order k.
void ple_ngram_rows(const PleHashParams& p, const int64_t* context, const int32_t* tokens, int64_t ntok,
                    int64_t* rows);

// Where the n-gram table's rows lie: back to back in a GGUF tensor, or in a packed ple.bin
// (docs/formats.md) where no row straddles a block and every block has a CRC32C.
struct PleTableSource {
    std::string path;
    uint64_t offset = 0;  // of row 0 (packed: of block 0)
    uint32_t type = 0;
    int64_t rows = 0, head_dim = 0, row_bytes = 0;
    int64_t rows_per_block = 0;      // packed: rows per block; 0: rows back to back
    uint64_t block_bytes = 0;        // packed: a multiple of 4096
    std::vector<uint32_t> block_crcs;  // packed: [blocks]

    uint64_t row_offset(int64_t row) const;
};

// Reads a packed ple.bin's header and block checksums, validated (ModelFormatError saying what is wrong).
PleTableSource ple_table_from_pack(const std::string& path);

struct PleReadOptions {
    bool direct = true;          // O_DIRECT (Linux) / F_NOCACHE (macOS)
    int64_t cache_bytes = 0;     // f32 rows kept in an LRU row cache (0: none)
    int io_threads = 4;          // rows of one call are read concurrently
};

struct PleTableStats {
    uint64_t rows_requested = 0, cache_hits = 0, rows_read = 0, bytes_read = 0;
};

// The n-gram table, read row by row from its file (never mapped, never read whole), through a small LRU
// cache of decoded rows with its own byte budget.
class PleTable {
  public:
    PleTable(PleTableSource source, const PleReadOptions& opt);
    ~PleTable();
    PleTable(const PleTable&) = delete;
    PleTable& operator=(const PleTable&) = delete;

    // dst[n][head_dim] = rows[0..n) as f32: cached rows from the cache, the others read concurrently (a
    // prefill chunk's rows all at once). Throws IoError on a failed read, ModelFormatError on a checksum.
    void read_rows(const int64_t* rows, int64_t n, float* dst);

    int64_t rows() const { return src_.rows; }
    int64_t head_dim() const { return src_.head_dim; }
    uint64_t cache_bytes() const { return uint64_t(capacity_) * uint64_t(src_.head_dim) * 4; }
    bool direct() const;
    PleTableStats stats() const;
    void reset_stats();
    // Back-compat counters for the layer-level bindings.
    uint64_t rows_read() const { return stats().rows_read; }
    uint64_t bytes_read() const { return stats().bytes_read; }

  private:
    void read_row(int64_t row, float* dst);

    PleTableSource src_;
    std::unique_ptr<DirectFile> file_;
    std::unique_ptr<ThreadPool> pool_;
    int64_t capacity_ = 0;  // cached rows
    mutable std::mutex mu_;
    std::vector<float> cache_;                  // [capacity][head_dim]
    std::vector<int64_t> cache_row_;            // [capacity] the row held, -1 none
    std::list<int64_t> lru_;                    // cache entries, most recent first
    std::vector<std::list<int64_t>::iterator> lru_pos_;
    std::unordered_map<int64_t, int64_t> cached_;  // row -> entry
    PleTableStats stats_;
};

struct PleShape {
    int64_t hidden = 0;    // per stream
    int64_t hc = 0;        // hyper-connection streams
    int64_t ple_dim = 0;   // n_heads * head_dim
    int64_t head_dim = 0;  // table row length
    int64_t conv_kernel = 0;
    float eps = 1e-6f;  // RMSNorm epsilon
    int64_t channels() const { return hc * hidden; }
};

struct PleWeights {
    Tensor key;         // [hc*hidden rows][ple_dim cols]
    Tensor value;       // [hidden rows][ple_dim cols]
    Tensor norm_key;    // [1][hc*hidden], gamma with the +1 already applied (GGUF)
    Tensor norm_query;  // [1][hc*hidden]
    Tensor norm_conv;   // [1][hc*hidden]
    Tensor conv;        // [hc*hidden][conv_kernel], tap k reads (K-1-k)*dilation tokens back
};

// Decoding state of one sequence: the n-gram context (token ids, on the host: the table rows to read are
// decided there) and the conv history (on the backend).
struct PleState {
    std::vector<int64_t> context;  // [ngram_size-1] previous token ids, oldest first
    OwnedTensor conv;              // [(K-1)*dilation][channels] previous conv inputs, oldest first

    // A copy of `other`'s state (this one's storage is reused when it has the same shape).
    void assign(Backend& be, const PleState& other);
};

// One sequence's rows in a PLE forward over several: its token ids, its state, its rows [t0, t0 + ntok).
struct PleSeq {
    const int32_t* token_ids = nullptr;
    PleState* state = nullptr;
    int64_t t0 = 0, ntok = 0;
};

class PleLayer {
  public:
    // Loads layer `layer` of a qwen4exp GGUF; the table is read from `packed` when given (a packed model's
    // ple.bin), else from per_layer_token_embd.weight in whichever of the model's files holds it. Throws
    // ModelFormatError naming what is missing or wrong.
    PleLayer(const ModelWeights& w, int64_t layer, const PleReadOptions& read = {},
             const PleTableSource* packed = nullptr);

    PleState new_state(Backend& be) const;

    // out[ntok][hc*hidden] = the PLE addend for tokens continuing `state`; hidden: [ntok][hc*hidden], the
    // streams entering the layer. Advances the state, so any split into calls gives the same output.
    void forward(Workspace& ws, const int32_t* token_ids, const Tensor& hidden, PleState& state, const Tensor& out);
    // The same over the rows of several sequences (hidden, out: [rows][hc*hidden]), each with its own state.
    void forward(Workspace& ws, const std::vector<PleSeq>& seqs, const Tensor& hidden, const Tensor& out);

    const PleShape& shape() const { return shape_; }
    const PleHashParams& hash() const { return hash_; }
    PleTable& table() const { return *table_; }
    int64_t rows_per_token() const { return hash_.n_heads(); }

  private:
    int64_t dilation() const { return hash_.ngram_size; }
    int64_t history() const { return (shape_.conv_kernel - 1) * dilation(); }

    PleShape shape_;
    PleHashParams hash_;
    PleWeights w_{};
    std::unique_ptr<PleTable> table_;
};

}  // namespace regolith
