// The CPU backend: buffers in host memory (or, opaque, in an OpaqueMemory range), each op checked when
// recorded and run by its kernel (cpu/kernels.h) at once or, opaque, at the next flush.
#include "cpu/cpu_backend.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "core/errors.h"
#include "core/types.h"

namespace regolith::cpu {

namespace {

constexpr uint64_t kHeapAlign = 64;
constexpr uint64_t kPageAlign = 4096;  // large buffers: page-aligned, so O_DIRECT can read into them

int64_t packed_row_bytes(const Tensor& t) {
    const TypeTraits* tt = type_traits(t.type);
    if (!tt) throw Error("tensor of unknown type id " + std::to_string(t.type));
    return type_row_bytes(*tt, t.cols);
}

[[noreturn]] void fail(const char* op, const std::string& what) { throw Error(std::string(op) + ": " + what); }

void need(bool ok, const char* op, const char* what) {
    if (!ok) fail(op, what);
}

std::string shape(const Tensor& t) { return "[" + std::to_string(t.rows) + "][" + std::to_string(t.cols) + "]"; }

void need_type(const Tensor& t, uint32_t type, const char* op, const char* name) {
    if (!t) fail(op, std::string(name) + " is missing");
    if (t.type != type) fail(op, std::string(name) + " has type id " + std::to_string(t.type) + ", expected " +
                                     std::to_string(type));
}

void need_f32(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
    for (const auto& [name, t] : ts) need_type(*t, RG_TYPE_F32, op, name);
}

void same_shape(const Tensor& a, const Tensor& b, const char* op) {
    if (a.rows != b.rows || a.cols != b.cols) fail(op, "shapes " + shape(a) + " and " + shape(b) + " differ");
}

std::vector<ConvSeqRows> rows_of(const std::vector<ConvSeq>& s) {
    std::vector<ConvSeqRows> r;
    for (const ConvSeq& q : s) r.push_back({resolve(q.state), resolve(q.after), q.t0, q.ntok});
    return r;
}
std::vector<GdnSeqRows> rows_of(const std::vector<GdnSeq>& s) {
    std::vector<GdnSeqRows> r;
    for (const GdnSeq& q : s) r.push_back({resolve(q.state), resolve(q.after), q.t0, q.ntok});
    return r;
}
std::vector<PleConvSeqRows> rows_of(const std::vector<PleConvSeq>& s) {
    std::vector<PleConvSeqRows> r;
    for (const PleConvSeq& q : s) r.push_back({resolve(q.state), q.t0, q.ntok});
    return r;
}
std::vector<QsaSeqRows> rows_of(const std::vector<QsaSeq>& s) {
    std::vector<QsaSeqRows> r;
    for (const QsaSeq& q : s)
        r.push_back({resolve(q.k), resolve(q.v), resolve(q.index_k), resolve(q.block_k), resolve(q.pos), q.n0, q.t0,
                     q.ntok});
    return r;
}
std::vector<KvSeqRows> rows_of(const std::vector<KvSeq>& s) {
    std::vector<KvSeqRows> r;
    for (const KvSeq& q : s) r.push_back({resolve(q.k), resolve(q.vt), q.n0, q.t0, q.ntok});
    return r;
}

// Each sequence's rows lie in the step's `rows` rows.
template <class S>
void check_seqs(const S* seqs, int64_t n, int64_t rows, const char* op) {
    for (int64_t i = 0; i < n; ++i)
        if (seqs[i].t0 < 0 || seqs[i].ntok < 0 || seqs[i].t0 + seqs[i].ntok > rows)
            fail(op, "a sequence's rows [" + std::to_string(seqs[i].t0) + ", +" + std::to_string(seqs[i].ntok) +
                         ") are outside the step's " + std::to_string(rows));
}

}  // namespace

Rows resolve(const Tensor& t) {
    if (!t) return {};
    const auto* b = static_cast<const CpuBuffer*>(t.buffer);
    const int64_t row = packed_row_bytes(t);
    if (t.rows < 0 || t.cols < 0 || (t.rows > 1 && t.row_bytes < row) ||
        (t.rows > 0 && t.offset + uint64_t((t.rows - 1) * t.row_bytes + row) > b->bytes))
        throw Error("tensor " + shape(t) + " at offset " + std::to_string(t.offset) + " (stride " +
                    std::to_string(t.row_bytes) + ") does not fit its buffer of " + std::to_string(b->bytes) +
                    " bytes");
    return {b->data + t.offset, t.type, t.rows, t.cols, t.row_bytes};
}

CpuBackend::CpuBackend(bool opaque) : opaque_(opaque) {
    if (opaque_) {
        memory_ = std::make_unique<OpaqueMemory>(PROT_NONE);
        weights_ = std::make_unique<OpaqueMemory>(PROT_READ);
    }
}

CpuBackend::~CpuBackend() = default;

// ---- memory -----------------------------------------------------------------------------------------

BackendBuffer* CpuBackend::alloc(uint64_t bytes, MemoryUse use) {
    auto buf = std::make_unique<CpuBuffer>();
    buf->bytes = bytes;
    if (opaque_) {
        buf->data = memory_->alloc(bytes);
        buf->kind = CpuBuffer::Kind::Opaque;
    } else if (use == MemoryUse::Arena) {
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            throw std::system_error(errno, std::generic_category(), "cannot allocate " + std::to_string(bytes) + " bytes");
        buf->data = static_cast<uint8_t*>(p);
        buf->kind = CpuBuffer::Kind::Mapped;
    } else {
        void* p = nullptr;
        const uint64_t align = bytes >= (uint64_t(1) << 16) ? kPageAlign : kHeapAlign;
        if (::posix_memalign(&p, align, bytes) != 0)
            throw std::system_error(ENOMEM, std::generic_category(), "cannot allocate " + std::to_string(bytes) + " bytes");
        buf->data = static_cast<uint8_t*>(p);
        buf->kind = CpuBuffer::Kind::Heap;
    }
    return buf.release();
}

BackendBuffer* CpuBackend::import_host(const void* data, uint64_t bytes) {
    if (!opaque_) {
        auto* buf = new CpuBuffer();
        buf->data = static_cast<uint8_t*>(const_cast<void*>(data));  // never written: weights are read-only
        buf->bytes = bytes;
        buf->kind = CpuBuffer::Kind::Wrapped;
        return buf;
    }
    auto* buf = new CpuBuffer();
    buf->data = weights_->alloc(bytes);
    buf->bytes = bytes;
    buf->kind = CpuBuffer::Kind::OpaqueWeights;
    weights_->fill(buf->data, data, bytes);
    return buf;
}

void CpuBackend::free(BackendBuffer* buffer) {
    if (!buffer) return;
    if (opaque_) {
        try {
            flush();  // queued ops may still name it
        } catch (...) {
            // freeing must not throw (destructors free): the next flush or read reports the failure
            std::lock_guard<std::mutex> lock(queue_mu_);
            if (!failed_) failed_ = std::current_exception();
        }
    }
    auto* b = static_cast<CpuBuffer*>(buffer);
    switch (b->kind) {
        case CpuBuffer::Kind::Heap:
            std::free(b->data);
            break;
        case CpuBuffer::Kind::Mapped:
            ::munmap(b->data, b->bytes);
            break;
        case CpuBuffer::Kind::Opaque:
            memory_->release(b->data, b->bytes);
            break;
        case CpuBuffer::Kind::OpaqueWeights:
            weights_->release(b->data, b->bytes);
            break;
        case CpuBuffer::Kind::Wrapped:
            break;
    }
    delete b;
}

void* CpuBackend::host_address(BackendBuffer* buffer) {
    return opaque_ || !buffer ? nullptr : static_cast<CpuBuffer*>(buffer)->data;
}

bool CpuBackend::lock(BackendBuffer* buffer, std::string* error) {
    auto* b = static_cast<CpuBuffer*>(buffer);
    if (b->kind != CpuBuffer::Kind::Mapped) {
        if (error) *error = opaque_ ? "cpu-opaque test memory is never locked" : "only arena buffers are locked";
        return false;
    }
    if (::mlock(b->data, b->bytes) == 0) return true;
    if (error) *error = std::error_code(errno, std::generic_category()).message();
    return false;
}

void CpuBackend::write(const Tensor& dst, const void* src) {
    resolve(dst);
    const int64_t row = packed_row_bytes(dst);
    const auto copy_in = [dst, row](const uint8_t* from) {
        const Rows d = resolve(dst);
        for (int64_t r = 0; r < d.rows; ++r) std::memcpy(d.row<uint8_t>(r), from + r * row, size_t(row));
    };
    if (!opaque_) return copy_in(static_cast<const uint8_t*>(src));
    // In stream order, like a GPU's asynchronous copy from host memory: the data is taken now, written when
    // the queue runs.
    const auto* bytes = static_cast<const uint8_t*>(src);
    enqueue([copy_in, data = std::vector<uint8_t>(bytes, bytes + dst.rows * row)] { copy_in(data.data()); });
}

void CpuBackend::read(const Tensor& src, void* dst) {
    const Rows s = resolve(src);
    const int64_t row = packed_row_bytes(src);
    const auto run = [&] {
        for (int64_t r = 0; r < s.rows; ++r)
            std::memcpy(static_cast<uint8_t*>(dst) + r * row, s.row<uint8_t>(r), size_t(row));
    };
    if (!opaque_) return run();
    flush(run);
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
    need(src.type == dst.type, "copy", "tensors of different types");
    same_shape(src, dst, "copy");
    resolve(src), resolve(dst);
    exec([=] {
        const Rows s = resolve(src), d = resolve(dst);
        const size_t row = size_t(packed_row_bytes(src));
        for (int64_t r = 0; r < s.rows; ++r) std::memmove(d.row<uint8_t>(r), s.row<uint8_t>(r), row);
    });
}

void CpuBackend::zero(const Tensor& dst) {
    resolve(dst);
    exec([=] {
        const Rows d = resolve(dst);
        const size_t row = size_t(packed_row_bytes(dst));
        for (int64_t r = 0; r < d.rows; ++r) std::memset(d.row<uint8_t>(r), 0, row);
    });
}

void CpuBackend::submit() {
    if (opaque_) flush();
}

void CpuBackend::enqueue(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push_back(std::move(fn));
}

void CpuBackend::flush(const std::function<void()>& then) {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (failed_) std::rethrow_exception(std::exchange(failed_, nullptr));
    if (queue_.empty() && !then) return;
    std::vector<std::function<void()>> ops;
    ops.swap(queue_);
    OpaqueMemory::Access access(*memory_);
    for (auto& op : ops) op();  // an op that throws drops the rest: the caller resets its window
    if (then) then();
}

// ---- ops --------------------------------------------------------------------------------------------

namespace {

void run_matmul(const regolith::MatmulJob* jobs, int64_t n_jobs) {
    thread_local std::vector<cpu::MatmulJob> raw;
    raw.clear();
    for (int64_t i = 0; i < n_jobs; ++i) {
        const regolith::MatmulJob& j = jobs[i];
        const Rows w = resolve(j.w);
        raw.push_back({{w.type, w.base, w.rows, w.cols, w.stride}, resolve(j.x).row(0), j.x.rows, resolve(j.y).row(0)});
    }
    cpu::matmul_batch(raw.data(), int64_t(raw.size()));
}

}  // namespace

void CpuBackend::matmul(const regolith::MatmulJob* jobs, int64_t n_jobs) {
    for (int64_t i = 0; i < n_jobs; ++i) {
        const regolith::MatmulJob& j = jobs[i];
        need_f32("matmul", {{"x", &j.x}, {"y", &j.y}});
        need(j.w.cols == j.x.cols, "matmul", "x must have as many columns as the weight");
        need(j.y.rows == j.x.rows && j.y.cols == j.w.rows, "matmul", "y must be [ntok][weight rows]");
        need(j.x.contiguous() && j.y.contiguous(), "matmul", "x and y must be packed");
        resolve(j.w), resolve(j.x), resolve(j.y);
    }
    if (!opaque_) return run_matmul(jobs, n_jobs);
    enqueue([js = std::vector<regolith::MatmulJob>(jobs, jobs + n_jobs)] { run_matmul(js.data(), int64_t(js.size())); });
}

void CpuBackend::get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat, const Tensor& out) {
    need_type(ids, RG_TYPE_I32, "get_rows", "ids");
    need_f32("get_rows", {{"out", &out}});
    need(out.rows == ids.rows * ids.cols && out.cols == repeat * table.cols, "get_rows", "out must be [ids][repeat * cols]");
    resolve(table), resolve(ids), resolve(out);
    exec([=] { cpu::get_rows(resolve(table), resolve(ids), scale, repeat, resolve(out)); });
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
    need_type(rows, RG_TYPE_I32, "gather_rows", "rows");
    need_f32("gather_rows", {{"x", &x}, {"out", &out}});
    need(rows.rows == 1 && out.rows == rows.cols && out.cols == x.cols, "gather_rows", "out must be [rows][x.cols]");
    resolve(x), resolve(rows), resolve(out);
    exec([=] { cpu::gather_rows(resolve(x), resolve(rows), resolve(out)); });
}

void CpuBackend::top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) {
    need_f32("top_k", {{"x", &x}});
    need(k >= 1 && k <= x.cols, "top_k", "k must be in 1..columns");
    if (ids) need(ids.type == RG_TYPE_I32 && ids.rows == x.rows && ids.cols == k, "top_k", "ids must be I32 [rows][k]");
    if (values) need(values.type == RG_TYPE_F32 && values.rows == x.rows && values.cols == k, "top_k", "values must be [rows][k]");
    resolve(x), resolve(ids), resolve(values);
    exec([=] { cpu::top_k(resolve(x), k, resolve(ids), resolve(values)); });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    need_f32("rms_norm", {{"x", &x}, {"y", &y}});
    same_shape(x, y, "rms_norm");
    if (w) need(w.type == RG_TYPE_F32 && w.cols == x.cols && w.rows >= 1, "rms_norm", "w must be [groups][cols] F32");
    resolve(x), resolve(w), resolve(y);
    exec([=] { cpu::rms_norm(resolve(x), resolve(w), eps, resolve(y)); });
}

void CpuBackend::rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act,
                                const Tensor& y) {
    need_f32("rms_norm_gated", {{"x", &x}, {"z", &z}, {"w", &w}, {"y", &y}});
    same_shape(x, y, "rms_norm_gated");
    same_shape(x, z, "rms_norm_gated");
    need(act == Unary::Sigmoid || act == Unary::Silu, "rms_norm_gated", "the gate is sigmoid or silu");
    resolve(x), resolve(z), resolve(w), resolve(y);
    exec([=] { cpu::rms_norm_gated(resolve(x), resolve(z), resolve(w), eps, act, resolve(y)); });
}

void CpuBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y) {
    need_f32("layer_norm", {{"x", &x}, {"w", &w}, {"b", &b}, {"y", &y}});
    same_shape(x, y, "layer_norm");
    resolve(x), resolve(w), resolve(b), resolve(y);
    exec([=] { cpu::layer_norm(resolve(x), resolve(w), resolve(b), eps, resolve(y)); });
}

void CpuBackend::rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis, const Tensor& table) {
    need_type(pos, RG_TYPE_I64, "rope_table", "pos");
    need_type(axis, RG_TYPE_I32, "rope_table", "axis");
    need_f32("rope_table", {{"freq", &freq}, {"table", &table}});
    need(pos.cols == 3 && table.rows == pos.rows && table.cols == 2 * freq.cols && axis.cols == freq.cols,
         "rope_table", "pos [n][3], freq / axis [1][half], table [n][2 * half]");
    resolve(pos), resolve(freq), resolve(axis), resolve(table);
    exec([=] { cpu::rope_table(resolve(pos), resolve(freq), resolve(axis), resolve(table)); });
}

void CpuBackend::rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) {
    need_f32("rope", {{"x", &x}, {"table", &table}});
    need(rows_per_pos >= 1 && table.rows * rows_per_pos >= x.rows && table.cols <= x.cols, "rope",
         "the table needs a row per rows_per_pos rows of x and at most x.cols columns");
    resolve(x), resolve(table);
    exec([=] { cpu::rope(resolve(x), resolve(table), rows_per_pos); });
}

void CpuBackend::unary(const Tensor& x, Unary op, float p, const Tensor& y) {
    need_f32("unary", {{"x", &x}, {"y", &y}});
    same_shape(x, y, "unary");
    resolve(x), resolve(y);
    exec([=] { cpu::unary(resolve(x), op, p, resolve(y)); });
}

void CpuBackend::glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) {
    need_f32("glu", {{"gate", &gate}, {"up", &up}, {"y", &y}});
    same_shape(gate, up, "glu");
    same_shape(gate, y, "glu");
    resolve(gate), resolve(up), resolve(y);
    exec([=] { cpu::glu(resolve(gate), resolve(up), act, resolve(y)); });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
    need_f32("add", {{"a", &a}, {"b", &b}, {"y", &y}});
    same_shape(a, y, "add");
    need(b.cols == a.cols && (b.rows == a.rows || b.rows == 1), "add", "b must be a's shape or one row");
    resolve(a), resolve(b), resolve(y);
    exec([=] { cpu::add(resolve(a), resolve(b), resolve(y)); });
}

void CpuBackend::hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) {
    need_f32("hc_mix", {{"gate", &gate}, {"xn", &xn}, {"mixed", &mixed}});
    same_shape(gate, xn, "hc_mix");
    need(mixed.rows == gate.rows && mixed.cols * hc == gate.cols, "hc_mix", "mixed must be [ntok][hidden]");
    resolve(gate), resolve(xn), resolve(mixed);
    exec([=] { cpu::hc_mix(resolve(gate), resolve(xn), hc, resolve(mixed)); });
}

void CpuBackend::hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) {
    need_f32("hc_write", {{"out", &out}, {"w", &w}, {"streams", &streams}});
    need(streams.rows == out.rows && streams.cols == hc * out.cols && w.rows == out.rows && w.cols == hc, "hc_write",
         "streams [ntok][hc * hidden], out [ntok][hidden], w [ntok][hc]");
    resolve(out), resolve(w), resolve(streams);
    exec([=] { cpu::hc_write(resolve(out), resolve(w), hc, resolve(streams)); });
}

void CpuBackend::ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs, const Tensor& out) {
    need_f32("ssm_conv", {{"x", &x}, {"w_t", &w_t}, {"out", &out}});
    same_shape(x, out, "ssm_conv");
    need(w_t.cols == x.cols, "ssm_conv", "w_t must be [kernel][channels]");
    check_seqs(seqs, n_seqs, x.rows, "ssm_conv");
    std::vector<ConvSeq> s(seqs, seqs + n_seqs);
    for (const ConvSeq& q : s) {
        if (w_t.rows > 1) need(q.state.rows == w_t.rows - 1 && q.state.cols == x.cols, "ssm_conv", "a state is not [kernel-1][channels]");
        if (q.after) need(q.after.rows >= q.ntok && q.after.cols == (w_t.rows - 1) * x.cols, "ssm_conv", "after must be [ntok][(kernel-1) * channels]");
        resolve(q.state), resolve(q.after);
    }
    resolve(x), resolve(w_t), resolve(out);
    exec([=] { cpu::ssm_conv(resolve(x), resolve(w_t), rows_of(s), resolve(out)); });
}

void CpuBackend::gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a,
                             const Tensor& dt_bias, const GdnDims& d) {
    need_f32("gdn_prepare", {{"qkv", &qkv}, {"g", &g}, {"beta", &beta}, {"a", &a}, {"dt_bias", &dt_bias}});
    need(qkv.cols == d.conv_dim() && g.cols == d.n_v_heads && beta.cols == d.n_v_heads && g.rows == qkv.rows &&
             beta.rows == qkv.rows && a.cols == d.n_v_heads && dt_bias.cols == d.n_v_heads,
         "gdn_prepare", "qkv [ntok][conv_dim], g / beta [ntok][n_v_heads], a / dt_bias [1][n_v_heads]");
    resolve(qkv), resolve(g), resolve(beta), resolve(a), resolve(dt_bias);
    exec([=] { cpu::gdn_prepare(resolve(qkv), resolve(g), resolve(beta), resolve(a), resolve(dt_bias), d); });
}

void CpuBackend::gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs, int64_t n_seqs,
                          const GdnDims& d, int64_t chunk, const Tensor& out) {
    need_f32("gdn_scan", {{"qkv", &qkv}, {"g", &g}, {"beta", &beta}, {"out", &out}});
    need(out.rows == qkv.rows && out.cols == d.value_dim() && qkv.cols == d.conv_dim() && d.n_k_heads > 0 &&
             d.n_v_heads % d.n_k_heads == 0 && chunk > 0,
         "gdn_scan", "qkv [ntok][conv_dim], out [ntok][value_dim]");
    check_seqs(seqs, n_seqs, qkv.rows, "gdn_scan");
    const int64_t state = d.n_v_heads * d.k_dim * d.v_dim;
    std::vector<GdnSeq> s(seqs, seqs + n_seqs);
    for (const GdnSeq& q : s) {
        need(q.state.type == RG_TYPE_F32 && q.state.rows * q.state.cols == state && q.state.contiguous(), "gdn_scan",
             "a state is not n_v_heads * k_dim * v_dim packed floats");
        if (q.after) need(q.after.rows >= q.ntok && q.after.cols == state, "gdn_scan", "after must be [ntok][state]");
        resolve(q.state), resolve(q.after);
    }
    resolve(qkv), resolve(g), resolve(beta), resolve(out);
    exec([=] { cpu::gdn_scan(resolve(qkv), resolve(g), resolve(beta), rows_of(s), d, chunk, resolve(out)); });
}

namespace {

void check_qsa(const QsaSeq* seqs, int64_t n, const QsaDims& d, const char* op) {
    for (int64_t i = 0; i < n; ++i) {
        const QsaSeq& q = seqs[i];
        const int64_t n1 = q.n0 + q.ntok;
        need(q.k.rows >= n1 * d.n_head_kv && q.v.rows >= n1 * d.n_head_kv && q.index_k.rows >= n1 &&
                 q.pos.rows >= n1 && q.block_k.rows >= n1 / d.ratio && q.k.cols == d.head_dim &&
                 q.index_k.cols == d.index_head_dim && q.block_k.cols == d.index_head_dim && q.pos.cols == 3,
             op, "a sequence's key tensors are too small for its tokens");
        resolve(q.k), resolve(q.v), resolve(q.index_k), resolve(q.block_k), resolve(q.pos);
    }
}

}  // namespace

void CpuBackend::qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq,
                          const Tensor& axis, const QsaDims& d) {
    need_f32("qsa_pool", {{"norm", &norm}, {"freq", &freq}});
    need_type(axis, RG_TYPE_I32, "qsa_pool", "axis");
    need(d.ratio > 0 && 2 * freq.cols == d.n_rot && d.n_rot <= d.index_head_dim, "qsa_pool", "bad dims");
    check_qsa(seqs, n_seqs, d, "qsa_pool");
    std::vector<QsaSeq> s(seqs, seqs + n_seqs);
    resolve(norm), resolve(freq), resolve(axis);
    exec([=] { cpu::qsa_pool(rows_of(s), resolve(norm), resolve(freq), resolve(axis), d); });
}

void CpuBackend::qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& sel,
                            const Tensor& n_sel) {
    need_f32("qsa_select", {{"iq", &iq}});
    need_type(sel, RG_TYPE_I32, "qsa_select", "sel");
    need_type(n_sel, RG_TYPE_I32, "qsa_select", "n_sel");
    need(iq.cols == d.index_n_head * d.index_head_dim && sel.rows == iq.rows && sel.cols == std::max<int64_t>(d.topk, 1) &&
             n_sel.rows == 1 && n_sel.cols == iq.rows,
         "qsa_select", "iq [ntok][IH * ID], sel [ntok][max(topk, 1)], n_sel [1][ntok]");
    check_seqs(seqs, n_seqs, iq.rows, "qsa_select");
    check_qsa(seqs, n_seqs, d, "qsa_select");
    std::vector<QsaSeq> s(seqs, seqs + n_seqs);
    resolve(iq), resolve(sel), resolve(n_sel);
    exec([=] { cpu::qsa_select(resolve(iq), rows_of(s), d, resolve(sel), resolve(n_sel)); });
}

void CpuBackend::qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel,
                            const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& out) {
    need_f32("qsa_attend", {{"q", &q}, {"gate", &gate}, {"out", &out}});
    same_shape(q, gate, "qsa_attend");
    same_shape(q, out, "qsa_attend");
    need(q.cols == d.head_dim && d.n_head % d.n_head_kv == 0, "qsa_attend", "q rows are heads of head_dim");
    check_seqs(seqs, n_seqs, q.rows / d.n_head, "qsa_attend");
    check_qsa(seqs, n_seqs, d, "qsa_attend");
    std::vector<QsaSeq> s(seqs, seqs + n_seqs);
    resolve(q), resolve(gate), resolve(sel), resolve(n_sel), resolve(out);
    exec([=] { cpu::qsa_attend(resolve(q), resolve(gate), resolve(sel), resolve(n_sel), rows_of(s), d, resolve(out)); });
}

void CpuBackend::kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs, int64_t n_head_kv) {
    need_f32("kv_append", {{"k", &k}, {"v", &v}});
    same_shape(k, v, "kv_append");
    check_seqs(seqs, n_seqs, k.rows, "kv_append");
    std::vector<KvSeq> s(seqs, seqs + n_seqs);
    for (const KvSeq& q : s) {
        need(q.k.type == q.vt.type && (q.k.type == RG_TYPE_F16 || q.k.type == RG_TYPE_F32) && q.k.contiguous(),
             "kv_append", "caches are packed F16 or F32");
        need(q.k.cols * n_head_kv == k.cols && q.k.rows == q.vt.cols * n_head_kv && q.n0 + q.ntok <= q.vt.cols,
             "kv_append", "the cache cannot hold the sequence's tokens");
        resolve(q.k), resolve(q.vt);
    }
    resolve(k), resolve(v);
    exec([=] { cpu::kv_append(resolve(k), resolve(v), rows_of(s), n_head_kv); });
}

void CpuBackend::attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& sh,
                           const Tensor& out) {
    need_f32("attention", {{"q", &q}, {"out", &out}});
    same_shape(q, out, "attention");
    need(q.cols == sh.n_head * sh.head_dim && sh.n_head % sh.n_head_kv == 0, "attention", "q must be [ntok][n_head * head_dim]");
    check_seqs(seqs, n_seqs, q.rows, "attention");
    std::vector<KvSeq> s(seqs, seqs + n_seqs);
    for (const KvSeq& c : s) {
        need(c.k.cols == sh.head_dim && c.k.rows % sh.n_head_kv == 0 && c.vt.cols % 16 == 0, "attention",
             "caches are [n_head_kv * cap][head_dim] with cap a multiple of 16");
        resolve(c.k), resolve(c.vt);
    }
    resolve(q), resolve(out);
    exec([=] { cpu::attention(resolve(q), rows_of(s), sh, resolve(out)); });
}

void CpuBackend::moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids,
                           const Tensor& weights) {
    need_f32("moe_route", {{"logits", &logits}, {"weights", &weights}});
    need_type(ids, RG_TYPE_I32, "moe_route", "ids");
    need(r.k >= 1 && r.k <= logits.cols && ids.rows == logits.rows && ids.cols == r.k && weights.rows == logits.rows &&
             weights.cols == r.k,
         "moe_route", "ids / weights must be [ntok][k]");
    if (resident) need(resident.type == RG_TYPE_I8 && resident.cols == logits.cols, "moe_route", "resident must be I8 [1][n_expert]");
    resolve(logits), resolve(resident), resolve(ids), resolve(weights);
    exec([=] { cpu::moe_route(resolve(logits), resolve(resident), r, resolve(ids), resolve(weights)); });
}

void CpuBackend::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& experts,
                             const SharedExpert* shared, const Tensor& y) {
    need_f32("moe_experts", {{"x", &x}, {"weights", &weights}, {"y", &y}});
    need_type(ids, RG_TYPE_I32, "moe_experts", "ids");
    same_shape(x, y, "moe_experts");
    const int64_t ne = experts.n_expert;
    need(ne > 0 && experts.gate.rows % ne == 0 && experts.up.rows == experts.gate.rows && experts.down.rows == ne * x.cols &&
             experts.gate.cols == x.cols && experts.down.cols == experts.gate.rows / ne,
         "moe_experts", "the stacked experts must be [n_expert * ff][hidden] twice and [n_expert * hidden][ff]");
    need(ids.rows == x.rows && weights.rows == x.rows && weights.cols == ids.cols, "moe_experts",
         "ids and weights must be [ntok][k]");
    std::optional<SharedExpert> sh;
    if (shared) {
        need_f32("moe_experts", {{"shared gate", &shared->gate}, {"shared up", &shared->up}, {"shared gate logit", &shared->gate_logit}});
        need(shared->gate.contiguous() && shared->gate.rows == x.rows && shared->down.rows == x.cols &&
                 shared->down.cols == shared->gate.cols,
             "moe_experts", "the shared expert's products must be packed [ntok][ff_shared], its down [hidden][ff_shared]");
        sh = *shared;
        resolve(sh->gate), resolve(sh->up), resolve(sh->down), resolve(sh->gate_logit);
    }
    resolve(x), resolve(ids), resolve(weights), resolve(experts.gate), resolve(experts.up), resolve(experts.down), resolve(y);
    exec([=] {
        const Rows ids_rows = resolve(ids);
        for (int64_t i = 0; i < ids_rows.rows * ids_rows.cols; ++i) {
            const int32_t e = ids_rows.row<int32_t>(i / ids_rows.cols)[i % ids_rows.cols];
            if (e < 0 || e >= ne) throw Error("moe_experts: expert id " + std::to_string(e) + " out of range");
        }
        SharedExpertRows sr;
        if (sh) sr = {resolve(sh->gate), resolve(sh->up), resolve(sh->down), resolve(sh->gate_logit)};
        cpu::moe_experts(resolve(x), ids_rows, resolve(weights), resolve(experts.gate), resolve(experts.up),
                         resolve(experts.down), ne, sh ? &sr : nullptr, resolve(y));
    });
}

void CpuBackend::moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared,
                             const Tensor& shared_gate, const Tensor& y) {
    need_f32("moe_combine", {{"ys", &ys}, {"weights", &weights}, {"y", &y}});
    need_type(pairs, RG_TYPE_I32, "moe_combine", "pairs");
    need(pairs.rows == 1 && pairs.cols == ys.rows && ys.cols == y.cols && weights.rows == y.rows, "moe_combine",
         "ys [rows][hidden], pairs [1][rows], weights [ntok][k], y [ntok][hidden]");
    if (shared) need(shared.rows == y.rows && shared.cols == y.cols && shared_gate.rows == y.rows, "moe_combine", "shared must be [ntok][hidden]");
    resolve(ys), resolve(pairs), resolve(weights), resolve(shared), resolve(shared_gate), resolve(y);
    exec([=] {
        cpu::moe_combine(resolve(ys), resolve(pairs), resolve(weights), resolve(shared), resolve(shared_gate), resolve(y));
    });
}

void CpuBackend::ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key,
                          const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps, const Tensor& gated,
                          const Tensor& normed) {
    need_f32("ple_gate", {{"key", &key}, {"query", &query}, {"value", &value}, {"norm_key", &norm_key},
                          {"norm_query", &norm_query}, {"norm_conv", &norm_conv}, {"gated", &gated}, {"normed", &normed}});
    same_shape(key, query, "ple_gate");
    same_shape(key, gated, "ple_gate");
    same_shape(key, normed, "ple_gate");
    need(value.rows == key.rows && value.cols * hc == key.cols && norm_key.cols == key.cols, "ple_gate",
         "value [ntok][hidden], key [ntok][hc * hidden]");
    for (const Tensor* t : {&key, &query, &value, &norm_key, &norm_query, &norm_conv, &gated, &normed}) resolve(*t);
    exec([=] {
        cpu::ple_gate(resolve(key), resolve(query), resolve(value), resolve(norm_key), resolve(norm_query),
                      resolve(norm_conv), hc, eps, resolve(gated), resolve(normed));
    });
}

void CpuBackend::ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs,
                          int64_t n_seqs, const Tensor& out) {
    need_f32("ple_conv", {{"normed", &normed}, {"w", &w}, {"out", &out}});
    same_shape(normed, out, "ple_conv");
    check_seqs(seqs, n_seqs, normed.rows, "ple_conv");
    const int64_t hist = (w.cols - 1) * dilation;
    need(w.rows == normed.cols && w.cols >= 1 && w.contiguous(), "ple_conv", "w must be [channels][kernel], packed");
    std::vector<PleConvSeq> s(seqs, seqs + n_seqs);
    for (const PleConvSeq& q : s) {
        if (hist > 0) need(q.state.rows == hist && q.state.cols == normed.cols, "ple_conv", "a state is not [history][channels]");
        resolve(q.state);
    }
    resolve(normed), resolve(w), resolve(out);
    exec([=] { cpu::ple_conv(resolve(normed), resolve(w), dilation, rows_of(s), resolve(out)); });
}

void CpuBackend::add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w, const Tensor& x) {
    need_f32("add_interpolated", {{"table", &table}, {"w", &w}, {"x", &x}});
    need_type(idx, RG_TYPE_I32, "add_interpolated", "idx");
    need(idx.rows == x.rows && idx.cols == 4 && w.rows == x.rows && w.cols == 4 && table.cols == x.cols,
         "add_interpolated", "idx / w [n][4], table [rows][x.cols]");
    resolve(table), resolve(idx), resolve(w), resolve(x);
    exec([=] { cpu::add_interpolated(resolve(table), resolve(idx), resolve(w), resolve(x)); });
}

void CpuBackend::vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q, const Tensor& k,
                            const Tensor& vt) {
    need_f32("vision_qkv", {{"qkv", &qkv}, {"table", &table}, {"q", &q}, {"k", &k}, {"vt", &vt}});
    const int64_t n = qkv.rows, hd = qkv.cols / 3 / n_head;
    need(qkv.cols == 3 * n_head * hd && table.rows == n && table.cols == hd && q.rows == n_head * n && q.cols >= hd &&
             k.rows == q.rows && k.cols == q.cols && vt.rows == n_head * hd && vt.cols == n,
         "vision_qkv", "qkv [n][3 * heads * hd], table [n][hd], q / k [heads * n][>= hd], vt [heads * hd][n]");
    resolve(qkv), resolve(table), resolve(q), resolve(k), resolve(vt);
    exec([=] { cpu::vision_qkv(resolve(qkv), resolve(table), n_head, resolve(q), resolve(k), resolve(vt)); });
}

void CpuBackend::softmax_scaled(const Tensor& x, float scale) {
    need_f32("softmax_scaled", {{"x", &x}});
    resolve(x);
    exec([=] { cpu::softmax_scaled(resolve(x), scale); });
}

}  // namespace regolith::cpu

namespace regolith {

Backend& cpu_backend() {
    static cpu::CpuBackend backend(false);
    return backend;
}

Backend& cpu_opaque_backend() {
    static cpu::CpuBackend backend(true);
    return backend;
}

}  // namespace regolith
