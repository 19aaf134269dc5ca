// The backend: a complete compute engine behind one interface, and the only way the core reaches memory
// or kernels.
//
// The core (model graphs, arena, streamer, state, sessions, speculation) records ops on a Backend over
// Tensors (core/tensor.h: handles into backend buffers) and never includes a backend header. Ops run in the
// order they are recorded and may run asynchronously: their results are visible to the host only through
// read(), which waits for everything recorded before it. submit() hands what has been recorded to the device
// (a GPU backend's command buffer / stream); the core calls it where it must wait on the host anyway (expert
// misses, sampling). Host data reaches ops only through write(); ops take handles and plain values, never
// host pointers, so a backend may record an op and run it later.
//
// The CPU backend implements every op and is the reference other backends are compared against op by op
// (regolith.backends.check); "cpu-opaque" is the same CPU backend with memory the host cannot address
// outside backend calls and ops deferred until submit, which proves the core never depends on either.
//
// Multi-sequence steps: ops over rows (matmul, norms, elementwise, MoE) do not care which sequence a row
// belongs to; the ops that read or write a sequence's state (attention caches, Gated DeltaNet and PLE
// states, QSA keys) take a list of per-sequence entries, each with its state tensors and its token range in
// the step's rows. A step over several windows is therefore the same op stream with longer lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace regolith {

// What a buffer is for. Arena buffers hold streamed expert records: where the backend can, they are locked
// in RAM (mlock) and host-visible, so the streamer reads straight into them. Mapped buffers are host RAM that
// ops read in place (a discrete GPU over its bus: CUDA's mapped page-locked memory), for backends whose
// supports_expert_slots() is true; host_address() gives their memory.
enum class MemoryUse { Device, Arena, Mapped };

enum class Unary : uint8_t {
    Silu,            // x / (1 + e^-x)
    Sigmoid,         // 1 / (1 + e^-x)
    SiluDiv,         // silu(x / p)
    TwoSigmoidDiv,   // 2 sigmoid(x / p)
    GeluTanhExp,     // GELU, tanh form evaluated as 0.5 x (1 + tanh u) with e^(-2|u|) (the vision tower's)
    GeluErf,         // 0.5 x (1 + erf(x / sqrt 2))
    Softcap,         // p tanh(x / p)
    Scale,           // x p
};

enum class Glu : uint8_t {
    Silu,      // silu(g) * u
    GeluTanh,  // gelu_tanh(g) * u, as x sigmoid(2u) (the dense models' FFN)
    Sigmoid,   // sigmoid(g) * u (the output gate of Qwen3.5 / Qwen3-Next's full attention)
    // gpt-oss's clamped SwiGLU (alpha 1.702, limit 7, as its checkpoints and llama.cpp fix them):
    // (clamp(u, -7, 7) + 1) * (c * sigmoid(1.702 c)), c = min(g, 7)
    SwigluOai,
};

// y[t][r] = sum_c W[r][c] x[t][c], x: [ntok][cols] F32, y: [ntok][rows] F32 (both packed), ntok = x.rows.
// A batch of jobs is one dispatch: a MoE layer's routed experts are one batch of jobs, each an expert's
// matrix (a view of its arena slot or of the stacked resident tensor) times its rows of the packed
// activations.
// ntok 1..8 is the decode / speculative-verify path; larger ntok is prefill. y[t][r] depends on W row r and
// x[t] only (bit for bit, whatever ntok or the other jobs of a batch). For F32 / F16 / BF16 weights the sum
// over c is periodic in at most 16 lanes: appending zero columns in multiples of 16 leaves it unchanged bit
// for bit.
struct MatmulJob {
    Tensor w, x, y;
};

// The per-sequence parts of stateful ops. t0 / ntok: the sequence's rows in the step's activations.
struct ConvSeq {  // causal depthwise conv (Gated DeltaNet): state [kernel-1][channels] in, updated in place
    Tensor state;
    Tensor after;  // optional [ntok][(kernel-1) * channels]: the state after each token (checkpoints)
    int64_t t0 = 0, ntok = 0;
};
struct GdnSeq {  // delta rule: state [n_v_heads][k_dim * v_dim], updated in place
    Tensor state;
    Tensor after;  // optional [ntok][n_v_heads * k_dim * v_dim]: the state after each token
    int64_t t0 = 0, ntok = 0;
};
struct PleConvSeq {  // dilated causal conv (PLE): state [history][channels], updated in place
    Tensor state;
    int64_t t0 = 0, ntok = 0;
};
// A QSA layer's keys of one sequence, tokens [0, n0 + ntok) (this step's already appended):
// k, v [cap * n_head_kv][head_dim] (normed, rotated keys), index_k [cap][index_head_dim] (raw),
// block_k [cap / ratio][index_head_dim] (pooled), pos [cap][3] I64 (M-RoPE positions).
// k, v, index_k and block_k are attention caches (F32, F16, Q8_0 or I8: see store_rows); an I8 cache has its
// per-row scales in the matching *_scale tensor [rows][1] F32, which is empty otherwise. The ops read a
// cache as its rows dequantized to f32 and compute on them as on an F32 cache.
struct QsaSeq {
    Tensor k, v, index_k, block_k, pos;
    int64_t n0 = 0, t0 = 0, ntok = 0;
    Tensor k_scale, v_scale, index_k_scale, block_k_scale;
};
// A dense attention cache of one sequence: k [n_head_kv * cap][head_dim], vt [n_head_kv * head_dim][cap]
// (values transposed), F16 or F32; positions [0, n0 + ntok) valid after kv_append. A Q8_0 or I8 cache (rows
// quantized along head_dim, as store_rows stores them) keeps its values as rows v [n_head_kv * cap][head_dim]
// instead (vt empty), and an I8 one its row scales in k_scale, v_scale [n_head_kv * cap][1] F32.
struct KvSeq {
    Tensor k, vt;
    int64_t n0 = 0, t0 = 0, ntok = 0;
    Tensor v, k_scale, v_scale;
};

struct GdnDims {
    int64_t n_k_heads = 0, n_v_heads = 0, k_dim = 0, v_dim = 0;
    // Value heads grouped by key head (Qwen3-Next's order: v head h reads k head h / (n_v / n_k)); else tiled
    // (llama.cpp's reordered Qwen3.5 / qwen4exp files: v head h reads k head h % n_k).
    bool grouped = false;
    constexpr int64_t key_dim() const { return n_k_heads * k_dim; }
    constexpr int64_t value_dim() const { return n_v_heads * v_dim; }
    constexpr int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

struct QsaDims {
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
    int64_t index_n_head = 0, index_head_dim = 0;
    int64_t ratio = 0;  // tokens per indexer block
    int64_t topk = 0;   // blocks kept per query
    int64_t n_rot = 0;  // rotated leading dims of the indexer keys
    float eps = 0.0f;   // RMSNorm of the pooled block keys
};

struct AttentionShape {
    int64_t n_head = 0;
    int64_t n_head_kv = 0;  // divides n_head; query head h reads kv head h / (n_head / n_head_kv)
    int64_t head_dim = 0;   // key and value length
    int64_t window = 0;     // sliding window: a query at position p sees keys p-window+1..p; 0: all keys
    float scale = 1.0f;     // applied to q·k before the softmax
    // Attention sinks (gpt-oss): [1][n_head] F32, head h's logit sinks[h] joins each of its softmaxes (not
    // scaled) and its probability is dropped: p_j = e^(s_j) / (sum_i e^(s_i) + e^(sinks[h])). Empty: none.
    Tensor sinks;
};

// One of a routed expert's matrices as its record stores it: rows x cols of `type`, rows `row_bytes` apart.
struct ExpertPart {
    uint32_t type = 0;
    int64_t rows = 0, cols = 0, row_bytes = 0;
};

// A MoE layer's routed experts as records in slots (the expert arena's device-routed mode): expert e's record
// is in device slot where[e] when where[e] >= 0, else in host row e, and its part i (gate, up, down) starts
// offsets[e][i] bytes into the record's slot (records keep their offsets when copied between slots).
// device [n_slots][slot_bytes] and host [n_expert][slot_bytes] are I8 rows of the same slot_bytes: device is
// the backend's own memory (a cache of some records), host every record (MemoryUse::Mapped memory read in
// place, or a copy of it in the backend's memory).
// The op reads where and offsets when it runs and does not wait for uploads into device: the caller points an
// entry at a slot only once the upload that filled it has completed (Backend::wait_upload).
struct ExpertSlots {
    Tensor device, host;
    Tensor where;    // [1][n_expert] I32
    Tensor offsets;  // [n_expert][3] I32
    ExpertPart parts[3];  // gate [ff][hidden], up [ff][hidden], down [hidden][ff]
};

// A MoE layer's routed experts on the backend: llama.cpp's stacked tensors, expert e's matrices rows
// [e * ff, (e+1) * ff) of gate and up ([n_expert * ff][hidden]) and [e * hidden, (e+1) * hidden) of down
// ([n_expert * hidden][ff]); or, with `slots`, records in slots (gate / up / down then unused).
// `act` joins gate and up (Silu, or gpt-oss's SwigluOai); the optional biases (gpt-oss), always resident
// whatever holds the matrices, are added to expert e's products: row e of gate_bias, up_bias [n_expert][ff]
// before act, of down_bias [n_expert][hidden] before the routing weight.
struct ExpertSet {
    Tensor gate, up, down;
    int64_t n_expert = 0;
    const ExpertSlots* slots = nullptr;
    Glu act = Glu::Silu;
    Tensor gate_bias, up_bias, down_bias;
};

// The shared expert of a MoE layer, its gate and up products already computed (with the router's).
struct SharedExpert {
    Tensor gate, up;     // [ntok][ff_shared]; moe_experts may overwrite gate (with silu(gate) * up)
    Tensor down;         // the weight [hidden][ff_shared]
    Tensor gate_logit;   // [ntok][1]: its output is scaled by sigmoid of this
};

// Routing of a MoE layer: softmax over the router logits, the top `k` experts (ties to the lower id),
// weights renormalised when `norm_topk`. With a `resident` mask (MoCE), the top `protect` stay and the other
// k - protect are chosen by logit + `bonus` for resident experts.
struct MoeRouting {
    int64_t k = 0;
    bool norm_topk = true;
    float bonus = 0.0f;
    int64_t protect = 0;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char* name() const = 0;

    // ---- memory -------------------------------------------------------------------------------------
    // A new buffer of `bytes` bytes (contents undefined). Throws Error when the memory is not available.
    virtual BackendBuffer* alloc(uint64_t bytes, MemoryUse use = MemoryUse::Device) = 0;
    // A read-only buffer holding `bytes` bytes of host memory (weights from a mapped file): the CPU and Metal
    // wrap the memory, which must outlive the buffer; CUDA copies it. Freeing it returns once no op reads it.
    virtual BackendBuffer* import_host(const void* data, uint64_t bytes) = 0;
    virtual void free(BackendBuffer* buffer) = 0;
    // The buffer's memory as host memory, where it is host memory (CPU, unified memory); nullptr otherwise.
    // The core uses it only to read files straight into buffers (expert records, saved states) and must work
    // the same when it is null.
    virtual void* host_address(BackendBuffer* buffer) = 0;
    // Locks an Arena buffer in RAM; false (with the reason in *error) when the OS refuses.
    virtual bool lock(BackendBuffer* buffer, std::string* error) = 0;
    // Page-locks host memory that uploads copy from (the arena's host tier or staging), so the copies run at
    // the bus's speed rather than through the driver's bounce buffers; false where the backend has no use for
    // it or the OS refuses (the memory then works as it is). unpin_host(p) before the memory is freed.
    virtual bool pin_host(void* p, uint64_t bytes) { return false; }
    virtual void unpin_host(void* p) {}
    // Whether moe_experts takes ExpertSet::slots and alloc() takes MemoryUse::Mapped (the expert arena's
    // device-routed mode, where a discrete GPU reads the records it does not cache from host RAM in place).
    virtual bool supports_expert_slots() const { return false; }
    // A device's own memory (a discrete GPU's VRAM): its free and total bytes. False where the backend's
    // memory is the host's RAM (CPU, unified memory), which the memory plan counts as RAM.
    virtual bool device_memory(uint64_t* free_bytes, uint64_t* total_bytes) { return false; }
    // The device the ops run on, for reports ("NVIDIA H200", "Apple M4 Pro"); empty for the host's CPU.
    virtual std::string device_name() { return ""; }

    // Host <-> backend copies of a tensor's rows; the host side is packed (rows of the type's row bytes).
    // write() is recorded like an op (ops recorded before it see the old contents, ops after it the new) and
    // takes the host data before it returns; it may be called from any thread. read() waits for every op
    // recorded before it.
    virtual void write(const Tensor& dst, const void* src) = 0;
    // A write from any thread that may run beside the ops being recorded (the expert arena's I/O threads
    // filling slots): ordered after every op recorded before the last submit() and before every op recorded
    // after it returns that uses dst, and before every read(); ops recorded since the last submit() must not
    // use dst. The copy may read src after upload returns (a DMA from page-locked memory, which waits for
    // those ops): the caller leaves src unchanged until wait_upload(ticket) has returned, ticket being what
    // upload returned. By default write() (src taken before it returns, ticket 0); the CUDA backend copies
    // on a stream of its own.
    virtual uint64_t upload(const Tensor& dst, const void* src) {
        write(dst, src);
        return 0;
    }
    // Waits until the upload that returned `ticket` has read its source (at once for ticket 0).
    virtual void wait_upload(uint64_t ticket) {}
    virtual void read(const Tensor& src, void* dst) = 0;
    void copy(const Tensor& src, const Tensor& dst);  // same type and shape
    void zero(const Tensor& dst);
    virtual void submit() = 0;
    // Waits until every op recorded so far has run (a GPU: submits and waits). The core calls it before it
    // reads or writes host-addressable buffer memory (host_address) in place, outside ops.
    virtual void synchronize() {}
    // Where ops may still run after submit() returns while their memory is host-addressable (Metal's unified
    // memory): the number of the last submit(), and a wait until the ops it submitted have run. The expert
    // arena waits so before it reads a record into a slot whose last readers were submitted by then. Any
    // thread. Elsewhere 0 and no wait.
    virtual uint64_t submitted() { return 0; }
    virtual void wait_submitted(uint64_t n) {}

    // ---- products -----------------------------------------------------------------------------------
    void matmul(const MatmulJob* jobs, int64_t n_jobs);
    void matmul(const Tensor& w, const Tensor& x, const Tensor& y) {
        const MatmulJob job{w, x, y};
        matmul(&job, 1);
    }

    // ---- rows ---------------------------------------------------------------------------------------
    // out[i] = dequantized table row ids[i] (I32) times scale, written `repeat` times side by side:
    // out [n][repeat * table.cols].
    void get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat, const Tensor& out);
    // out[i] = x[rows[i]] (rows I32 [1][m]).
    void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out);
    // ids [rows][k] I32: the k largest columns of each row of x, largest first (ties to the lower id);
    // values [rows][k] F32 (either may be empty).
    void top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values);

    // ---- norms --------------------------------------------------------------------------------------
    // y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w[r % w.rows] (no scale without w): the sum of squares in
    // double, its mean rounded to float, then one rounding (transformers' float32 RMSNorm).
    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y);
    // Gated DeltaNet's output norm per row: y = w * (x * inv) * act(z), inv = 1 / sqrt(x.x / n + eps) in float.
    void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act,
                                const Tensor& y);
    // torch LayerNorm per row: mean and variance in double, the rest in float.
    void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y);

    // ---- rotary embeddings ---------------------------------------------------------------------------
    // table[i] = (cos a_j, sin a_j) for pairs j < freq.cols, a_j = float(pos[i][axis[j]]) * freq[j];
    // pos [n][3] I64, freq [1][half] F32, axis [1][half] I32, table [n][2 * half] F32 (all cos, then all sin).
    void rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis, const Tensor& table);
    // Rotates, in place, the leading 2 * half dims of x's rows (NEOX pairs j, j + half) by table row
    // r / rows_per_pos: (a, b) -> (a cos - b sin, b cos + a sin).
    void rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos);

    // ---- elementwise --------------------------------------------------------------------------------
    void unary(const Tensor& x, Unary op, float p, const Tensor& y);
    void glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y);
    // y = a + b, b either of a's shape or one row added to every row.
    void add(const Tensor& a, const Tensor& b, const Tensor& y);

    // ---- hyper-connections --------------------------------------------------------------------------
    // mixed[t][i] = (sum_s sigmoid(gate[t][s][i]) * xn[t][s][i]) / hc; gate, xn [ntok][hc * hidden].
    void hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed);
    // streams[t][s][:] += w[t][s] * out[t][:]; streams [ntok][hc * hidden], w [ntok][hc].
    void hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams);

    // ---- Gated DeltaNet -----------------------------------------------------------------------------
    // out[t][c] = silu(sum_i w_t[i][c] * ext[t + i][c]), ext = the sequence's state rows then its x rows;
    // x, out [ntok][channels], w_t [kernel][channels]. The state keeps the last kernel-1 inputs.
    void ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs,
                          const Tensor& out);
    // In place: q and k (the first 2 * key_dim channels of qkv [ntok][conv_dim]) L2-normalised per head
    // (q also by k_dim^-1/2); g [ntok][n_v] <- a * softplus(g + dt_bias); beta <- sigmoid(beta).
    void gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a,
                             const Tensor& dt_bias, const GdnDims& d);
    // The delta rule per value head (v head h reads k head h % n_k_heads, or h / (n_v / n_k) when d.grouped):
    // one token at a time for single
    // tokens and with per-token states, else in chunks of `chunk` tokens. out [ntok][value_dim].
    void gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs,
                          int64_t n_seqs, const GdnDims& d, int64_t chunk, const Tensor& out);

    // ---- attention caches ----------------------------------------------------------------------------
    // Whether the QSA ops take caches of this type (store_rows stores it, qsa_* read it): F32 everywhere;
    // F16, Q8_0 and I8 where the backend has their kernels. The model refuses a cache type at load where
    // this is false.
    virtual bool supports_cache(uint32_t type) const { return type == RG_TYPE_F32; }
    // dst[r] = x[r] stored in dst's cache type, x [n][cols] F32:
    //   F32  copied;
    //   F16  rounded to nearest even (inf beyond the range);
    //   Q8_0 ggml's blocks of 32 (quant.h block_q8_0): d = max|x| / 127, q = round(x * (1 / d)) (halves
    //        away from zero; 0 where d is 0), d stored as f16: byte for byte gguf-py's quantizer;
    //   I8   the seed's int8 with a per-row scale: s = max|x[r]| / 127 in scale[r] (F32 [n][1]),
    //        q = round(x * (1 / s)) as Q8_0 does, read back as q * s.
    // `scale` is given for I8 only.
    void store_rows(const Tensor& x, const Tensor& dst, const Tensor& scale);

    // ---- QSA sparse attention -----------------------------------------------------------------------
    // Pooled keys of the blocks this step completes: block_k[b] = rope(rms_norm(mean of index_k rows of
    // block b) * norm, at pos[b * ratio]) with the rope pairs' freq / axis, stored as store_rows stores it.
    void qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq,
                          const Tensor& axis, const QsaDims& d);
    // sel [ntok][topk] I32: per query the top min(topk, complete blocks) blocks by sum_h relu(iq_h . bk) /
    // sqrt(index_head_dim) (ties: lower block), in increasing order; n_sel [1][ntok] I32.
    void qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d,
                            const Tensor& sel, const Tensor& n_sel);
    // out[t][h] = sigmoid(gate[t][h]) * softmax attention of q[t][h] over the selected blocks' tokens and
    // the tail; q, gate, out as rows ntok * n_head of head_dim.
    void qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel,
                            const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& out);

    // ---- dense attention ----------------------------------------------------------------------------
    // Appends keys and values k, v [ntok][n_head_kv * head_dim] at positions n0.. of each sequence's cache
    // (rounded to f16 for an F16 cache, stored as store_rows stores them for Q8_0 / I8).
    void kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs,
                           int64_t n_head_kv);
    // Causal GQA attention of q [ntok][n_head * head_dim] at positions n0.. over each sequence's cache. A
    // Q8_0 / I8 cache is read as its rows dequantized to f32 and computes as an F32 cache holding them does.
    void attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& s,
                           const Tensor& out);

    // ---- mixture of experts -------------------------------------------------------------------------
    // ids [ntok][k] I32 and weights [ntok][k] from router logits [ntok][n_expert]; resident: I8 [1][n_expert]
    // (MoCE) or empty.
    void moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids,
                           const Tensor& weights);
    // The routed experts of a layer without a host round trip: y[t] = sum over j of weights[t][j] *
    // down_e(act(gate_e x_t, up_e x_t)), e = ids[t][j] (I32 [ntok][k]), summed in expert-id order (each
    // product plus its bias where ExpertSet has them), plus
    // sigmoid(gate_logit[t]) * down_s(silu(gate[t]) * up[t]) for the shared expert when given. The backend
    // groups the tokens by expert itself; each product is the matmul contract's, so the result is the same
    // bits wherever an expert's matrices lie (stacked tensors, or any slot of ExpertSet::slots).
    void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& experts,
                             const SharedExpert* shared, const Tensor& y);
    // y[t] = sum of weights[p] * ys[i] over the rows i whose pairs[i] = p names token t (p = t * k + j), in
    // row order, plus sigmoid(shared_gate[t]) * shared[t] when `shared` is given. ys [rows][hidden], pairs
    // [1][rows] I32, weights [ntok][k].
    void moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared,
                             const Tensor& shared_gate, const Tensor& y);

    // ---- PLE ----------------------------------------------------------------------------------------
    // Per token and stream s: g = <norm_key(key), norm_query(query)> / sqrt(hidden) (double sum), signed
    // square root, gated = sigmoid(g) * value; normed = rms_norm(gated) * norm_conv.
    // key, query, gated, normed [ntok][hc * hidden], value [ntok][hidden], norms [1][hc * hidden].
    void ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key,
                          const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps,
                          const Tensor& gated, const Tensor& normed);
    // out[t][c] += silu(sum_k w[c][k] * ext[hist + t - (K-1-k) * dilation][c]), ext = state rows then the
    // sequence's normed rows; w [channels][K]. The state keeps the last hist = (K-1) * dilation inputs.
    void ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs,
                          int64_t n_seqs, const Tensor& out);

    // ---- vision tower -------------------------------------------------------------------------------
    // x[r] += sum_j w[r][j] * table[idx[r][j]] over 4 taps (bilinear resampling); idx I32, w F32 [n][4].
    void add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w, const Tensor& x);
    // qkv [n][3 * n_head * head_dim] -> q, k rotated by table [n][head_dim] (pairs j, j + head_dim/2) into
    // [n_head * n][stride] rows zero-padded to q.cols, and vt [n_head * head_dim][n] (values transposed).
    void vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q,
                            const Tensor& k, const Tensor& vt);
    // In place per row: softmax(scale * x) (max in 8 lanes, e^x by exp_nonpos, the sum in double lanes).
    void softmax_scaled(const Tensor& x, float scale);

protected:
    // What each backend implements; the public ops above check their arguments (core/backend.cpp), then call these.
    virtual void do_matmul(const MatmulJob* jobs, int64_t n_jobs) = 0;
    virtual void do_get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat, const Tensor& out) = 0;
    virtual void do_gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) = 0;
    virtual void do_top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) = 0;
    virtual void do_rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) = 0;
    virtual void do_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act, const Tensor& y) = 0;
    virtual void do_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y) = 0;
    virtual void do_rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis, const Tensor& table) = 0;
    virtual void do_rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) = 0;
    virtual void do_unary(const Tensor& x, Unary op, float p, const Tensor& y) = 0;
    virtual void do_glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) = 0;
    virtual void do_add(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
    virtual void do_hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) = 0;
    virtual void do_hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) = 0;
    virtual void do_ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs, const Tensor& out) = 0;
    virtual void do_gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& dt_bias, const GdnDims& d) = 0;
    virtual void do_gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs, int64_t n_seqs, const GdnDims& d, int64_t chunk, const Tensor& out) = 0;
    // Types other than F32, for a backend whose supports_cache() says it has them.
    virtual void do_store_rows(const Tensor& x, const Tensor& dst, const Tensor& scale);
    virtual void do_qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq, const Tensor& axis, const QsaDims& d) = 0;
    virtual void do_qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& sel, const Tensor& n_sel) = 0;
    virtual void do_qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& out) = 0;
    virtual void do_kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs, int64_t n_head_kv) = 0;
    virtual void do_attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& s, const Tensor& out) = 0;
    virtual void do_moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids, const Tensor& weights) = 0;
    virtual void do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& experts, const SharedExpert* shared, const Tensor& y) = 0;
    virtual void do_moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared, const Tensor& shared_gate, const Tensor& y) = 0;
    virtual void do_ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key, const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps, const Tensor& gated, const Tensor& normed) = 0;
    virtual void do_ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs, int64_t n_seqs, const Tensor& out) = 0;
    virtual void do_add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w, const Tensor& x) = 0;
    virtual void do_vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q, const Tensor& k, const Tensor& vt) = 0;
    virtual void do_softmax_scaled(const Tensor& x, float scale) = 0;
    virtual void do_copy(const Tensor& src, const Tensor& dst) = 0;
    virtual void do_zero(const Tensor& dst) = 0;
};

// The CPU backend (the reference), and the same kernels over memory the host cannot address outside backend
// calls, with ops deferred until submit ("cpu-opaque", for proving the core never touches device memory).
Backend& cpu_backend();
Backend& cpu_opaque_backend();
// The CUDA backend on device 0, or null when this build or this machine has none (csrc/cuda/).
Backend* cuda_backend();
// The Metal backend on the system's default GPU, or null where there is none (not an Apple platform, no GPU)
// (csrc/metal/).
Backend* metal_backend();
// The Metal backend's kernels and host code with the GPU emulated on the host ("metal-emu": threadgroups and
// SIMD-groups run as fibers): slow, for verifying the Metal backend where there is no Apple GPU. Null only in
// a build without the Metal sources.
Backend* metal_emu_backend();

// Exact products, a process-wide verification mode every backend honours: quantized weights are dequantized to
// f32 and multiplied with f32 activations the way the backend multiplies an F32 copy of them (slower; for
// verifying quantized models against a float reference). Off by default; REGOLITH_EXACT_ACTIVATIONS=1 turns
// it on at start-up.
void set_exact_activations(bool on);
bool exact_activations();

// A cache type's name as the command line spells it ("f32", "f16", "q8_0", "i8"), "unknown" for other types.
const char* cache_type_name(uint32_t type);

// A backend by name ("cpu", "cpu-opaque", "cuda", "metal", "metal-emu"; "" = the default: $REGOLITH_BACKEND or
// "cpu"). Throws Error naming the backends this build and machine have.
Backend& backend_by_name(const std::string& name);
std::vector<std::string> backend_names();

}  // namespace regolith
