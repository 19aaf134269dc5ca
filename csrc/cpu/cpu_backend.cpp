// The CPU backend: buffers in host memory (or, opaque, in an OpaqueMemory range), each op checked when
// recorded and run by its kernel (cpu/kernels.h) at once or, opaque, at the next flush.
#include "cpu/cpu_backend.h"

#include <sys/mman.h>

#include <array>
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
// Device memory of at least this many bytes gets pages of its own (mmap): page-aligned, so O_DIRECT can read
// into it, and given back to the system when freed. From the heap, glibc keeps a freed block once its mmap
// threshold has grown past the block's size (it grows at each free of a mapped block), so the workspace's
// chunks, freed as it consolidates, and a state's buffers, freed as they double, stayed in the process (about
// 2.7 MiB a 512-token chunk of the demo model, given back only by malloc_trim).
constexpr uint64_t kPagesFrom = uint64_t(1) << 16;

int64_t packed_row_bytes(const Tensor& t) {
    const TypeTraits* tt = type_traits(t.type);
    if (!tt) throw Error("tensor of unknown type id " + std::to_string(t.type));
    return type_row_bytes(*tt, t.cols);
}

std::string shape(const Tensor& t) { return "[" + std::to_string(t.rows) + "][" + std::to_string(t.cols) + "]"; }

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
        r.push_back({resolve(q.k), resolve(q.v), resolve(q.index_k), resolve(q.block_k), resolve(q.pos), q.n0,
                     q.t0, q.ntok, resolve(q.k_scale), resolve(q.v_scale), resolve(q.index_k_scale),
                     resolve(q.block_k_scale)});
    return r;
}
std::vector<KvSeqRows> rows_of(const std::vector<KvSeq>& s) {
    std::vector<KvSeqRows> r;
    for (const KvSeq& q : s)
        r.push_back({resolve(q.k), resolve(q.vt), q.n0, q.t0, q.ntok, resolve(q.v), resolve(q.k_scale),
                     resolve(q.v_scale)});
    return r;
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

namespace {

// ExpertSlots' expert matrices: expert e's record in its device slot or host row, each part at its offset
// (checked to lie inside the slot).
cpu::ExpertMatrix slot_experts(const ExpertSlots& sl) {
    const Rows device = resolve(sl.device), host = resolve(sl.host), where = resolve(sl.where),
               offsets = resolve(sl.offsets);
    return [=, parts = std::array<ExpertPart, 3>{sl.parts[0], sl.parts[1], sl.parts[2]}](int64_t e, int part) {
        const int32_t s = where.row<int32_t>(0)[e];
        if (s < -1 || s >= device.rows)
            throw Error("moe_experts: expert " + std::to_string(e) + " is in slot " + std::to_string(s) + " of " +
                        std::to_string(device.rows));
        const ExpertPart& p = parts[size_t(part)];
        const int64_t off = offsets.row<int32_t>(e)[part];
        if (off < 0 || off + (p.rows - 1) * p.row_bytes + type_row_bytes(*type_traits(p.type), p.cols) > host.cols)
            throw Error("moe_experts: expert " + std::to_string(e) + "'s part " + std::to_string(part) +
                        " does not fit its slot");
        const uint8_t* rec = s >= 0 ? device.row<uint8_t>(s) : host.row<uint8_t>(e);
        return cpu::WeightView{p.type, rec + off, p.rows, p.cols, p.row_bytes};
    };
}

}  // namespace

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
    if (opaque_ && use != MemoryUse::Mapped) {
        buf->data = memory_->alloc(bytes);
        buf->kind = CpuBuffer::Kind::Opaque;
    } else if (use != MemoryUse::Device || bytes >= kPagesFrom) {
        // the arena and mapped memory (host-addressable in opaque mode too; locked), and large device memory
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            throw std::system_error(errno, std::generic_category(), "cannot allocate " + std::to_string(bytes) + " bytes");
        buf->data = static_cast<uint8_t*>(p);
        buf->kind = use != MemoryUse::Device ? CpuBuffer::Kind::Mapped : CpuBuffer::Kind::Pages;
    } else {
        void* p = nullptr;
        if (::posix_memalign(&p, kHeapAlign, bytes) != 0)
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
        case CpuBuffer::Kind::Pages:
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
    if (!buffer) return nullptr;
    auto* b = static_cast<CpuBuffer*>(buffer);
    return opaque_ && b->kind != CpuBuffer::Kind::Mapped ? nullptr : b->data;
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

void CpuBackend::do_copy(const Tensor& src, const Tensor& dst) {
    resolve(src), resolve(dst);
    exec([=] {
        const Rows s = resolve(src), d = resolve(dst);
        const size_t row = size_t(packed_row_bytes(src));
        for (int64_t r = 0; r < s.rows; ++r) std::memmove(d.row<uint8_t>(r), s.row<uint8_t>(r), row);
    });
}

void CpuBackend::do_zero(const Tensor& dst) {
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

void CpuBackend::do_matmul(const regolith::MatmulJob* jobs, int64_t n_jobs) {
    for (int64_t i = 0; i < n_jobs; ++i) {
        const regolith::MatmulJob& j = jobs[i];
        resolve(j.w), resolve(j.x), resolve(j.y);
    }
    if (!opaque_) return run_matmul(jobs, n_jobs);
    enqueue([js = std::vector<regolith::MatmulJob>(jobs, jobs + n_jobs)] { run_matmul(js.data(), int64_t(js.size())); });
}

void CpuBackend::do_get_rows(const Tensor& table, const Tensor& ids, float scale, int64_t repeat, const Tensor& out) {
    resolve(table), resolve(ids), resolve(out);
    exec([=] { cpu::get_rows(resolve(table), resolve(ids), scale, repeat, resolve(out)); });
}

void CpuBackend::do_gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
    resolve(x), resolve(rows), resolve(out);
    exec([=] { cpu::gather_rows(resolve(x), resolve(rows), resolve(out)); });
}

void CpuBackend::do_top_k(const Tensor& x, int64_t k, const Tensor& ids, const Tensor& values) {
    resolve(x), resolve(ids), resolve(values);
    exec([=] { cpu::top_k(resolve(x), k, resolve(ids), resolve(values)); });
}

void CpuBackend::do_rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    resolve(x), resolve(w), resolve(y);
    exec([=] { cpu::rms_norm(resolve(x), resolve(w), eps, resolve(y)); });
}

void CpuBackend::do_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Unary act,
                                const Tensor& y) {
    resolve(x), resolve(z), resolve(w), resolve(y);
    exec([=] { cpu::rms_norm_gated(resolve(x), resolve(z), resolve(w), eps, act, resolve(y)); });
}

void CpuBackend::do_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& y) {
    resolve(x), resolve(w), resolve(b), resolve(y);
    exec([=] { cpu::layer_norm(resolve(x), resolve(w), resolve(b), eps, resolve(y)); });
}

void CpuBackend::do_rope_table(const Tensor& pos, const Tensor& freq, const Tensor& axis, const Tensor& table) {
    resolve(pos), resolve(freq), resolve(axis), resolve(table);
    exec([=] { cpu::rope_table(resolve(pos), resolve(freq), resolve(axis), resolve(table)); });
}

void CpuBackend::do_rope(const Tensor& x, const Tensor& table, int64_t rows_per_pos) {
    resolve(x), resolve(table);
    exec([=] { cpu::rope(resolve(x), resolve(table), rows_per_pos); });
}

void CpuBackend::do_unary(const Tensor& x, Unary op, float p, const Tensor& y) {
    resolve(x), resolve(y);
    exec([=] { cpu::unary(resolve(x), op, p, resolve(y)); });
}

void CpuBackend::do_glu(const Tensor& gate, const Tensor& up, Glu act, const Tensor& y) {
    resolve(gate), resolve(up), resolve(y);
    exec([=] { cpu::glu(resolve(gate), resolve(up), act, resolve(y)); });
}

void CpuBackend::do_add(const Tensor& a, const Tensor& b, const Tensor& y) {
    resolve(a), resolve(b), resolve(y);
    exec([=] { cpu::add(resolve(a), resolve(b), resolve(y)); });
}

void CpuBackend::do_hc_mix(const Tensor& gate, const Tensor& xn, int64_t hc, const Tensor& mixed) {
    resolve(gate), resolve(xn), resolve(mixed);
    exec([=] { cpu::hc_mix(resolve(gate), resolve(xn), hc, resolve(mixed)); });
}

void CpuBackend::do_hc_write(const Tensor& out, const Tensor& w, int64_t hc, const Tensor& streams) {
    resolve(out), resolve(w), resolve(streams);
    exec([=] { cpu::hc_write(resolve(out), resolve(w), hc, resolve(streams)); });
}

void CpuBackend::do_ssm_conv(const Tensor& x, const Tensor& w_t, const ConvSeq* seqs, int64_t n_seqs, const Tensor& out) {
    std::vector<ConvSeq> s(seqs, seqs + n_seqs);
    for (const ConvSeq& q : s) {
        resolve(q.state), resolve(q.after);
    }
    resolve(x), resolve(w_t), resolve(out);
    exec([=] { cpu::ssm_conv(resolve(x), resolve(w_t), rows_of(s), resolve(out)); });
}

void CpuBackend::do_gdn_prepare(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& a,
                             const Tensor& dt_bias, const GdnDims& d) {
    resolve(qkv), resolve(g), resolve(beta), resolve(a), resolve(dt_bias);
    exec([=] { cpu::gdn_prepare(resolve(qkv), resolve(g), resolve(beta), resolve(a), resolve(dt_bias), d); });
}

void CpuBackend::do_gdn_scan(const Tensor& qkv, const Tensor& g, const Tensor& beta, const GdnSeq* seqs, int64_t n_seqs,
                          const GdnDims& d, int64_t chunk, const Tensor& out) {
    std::vector<GdnSeq> s(seqs, seqs + n_seqs);
    for (const GdnSeq& q : s) {
        resolve(q.state), resolve(q.after);
    }
    resolve(qkv), resolve(g), resolve(beta), resolve(out);
    exec([=] { cpu::gdn_scan(resolve(qkv), resolve(g), resolve(beta), rows_of(s), d, chunk, resolve(out)); });
}

namespace {


}  // namespace

void CpuBackend::do_store_rows(const Tensor& x, const Tensor& dst, const Tensor& scale) {
    resolve(x), resolve(dst), resolve(scale);
    exec([=] { cpu::store_rows(resolve(x), resolve(dst), resolve(scale)); });
}

void CpuBackend::do_qsa_pool(const QsaSeq* seqs, int64_t n_seqs, const Tensor& norm, const Tensor& freq,
                          const Tensor& axis, const QsaDims& d) {
    std::vector<QsaSeq> s(seqs, seqs + n_seqs);
    resolve(norm), resolve(freq), resolve(axis);
    exec([=] { cpu::qsa_pool(rows_of(s), resolve(norm), resolve(freq), resolve(axis), d); });
}

void CpuBackend::do_qsa_select(const Tensor& iq, const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& sel,
                            const Tensor& n_sel) {
    std::vector<QsaSeq> s(seqs, seqs + n_seqs);
    resolve(iq), resolve(sel), resolve(n_sel);
    exec([=] { cpu::qsa_select(resolve(iq), rows_of(s), d, resolve(sel), resolve(n_sel)); });
}

void CpuBackend::do_qsa_attend(const Tensor& q, const Tensor& gate, const Tensor& sel, const Tensor& n_sel,
                            const QsaSeq* seqs, int64_t n_seqs, const QsaDims& d, const Tensor& out) {
    std::vector<QsaSeq> s(seqs, seqs + n_seqs);
    resolve(q), resolve(gate), resolve(sel), resolve(n_sel), resolve(out);
    exec([=] { cpu::qsa_attend(resolve(q), resolve(gate), resolve(sel), resolve(n_sel), rows_of(s), d, resolve(out)); });
}

void CpuBackend::do_kv_append(const Tensor& k, const Tensor& v, const KvSeq* seqs, int64_t n_seqs, int64_t n_head_kv) {
    std::vector<KvSeq> s(seqs, seqs + n_seqs);
    for (const KvSeq& q : s)
        resolve(q.k), resolve(q.vt), resolve(q.v), resolve(q.k_scale), resolve(q.v_scale);
    resolve(k), resolve(v);
    exec([=] { cpu::kv_append(resolve(k), resolve(v), rows_of(s), n_head_kv); });
}

void CpuBackend::do_attention(const Tensor& q, const KvSeq* seqs, int64_t n_seqs, const AttentionShape& sh,
                           const Tensor& out) {
    std::vector<KvSeq> s(seqs, seqs + n_seqs);
    for (const KvSeq& c : s)
        resolve(c.k), resolve(c.vt), resolve(c.v), resolve(c.k_scale), resolve(c.v_scale);
    resolve(q), resolve(out), resolve(sh.sinks);
    exec([=] { cpu::attention(resolve(q), rows_of(s), sh, resolve(sh.sinks), resolve(out)); });
}

void CpuBackend::do_moe_route(const Tensor& logits, const Tensor& resident, const MoeRouting& r, const Tensor& ids,
                           const Tensor& weights) {
    resolve(logits), resolve(resident), resolve(ids), resolve(weights);
    exec([=] { cpu::moe_route(resolve(logits), resolve(resident), r, resolve(ids), resolve(weights)); });
}

void CpuBackend::do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertSet& experts,
                             const SharedExpert* shared, const Tensor& y) {
    const int64_t ne = experts.n_expert;
    std::optional<SharedExpert> sh;
    if (shared) {
        sh = *shared;
        resolve(sh->gate), resolve(sh->up), resolve(sh->down), resolve(sh->gate_logit);
    }
    std::optional<ExpertSlots> slots;  // copied: the op may run after the caller's ExpertSlots is gone
    if (experts.slots) {
        slots = *experts.slots;
        resolve(slots->device), resolve(slots->host), resolve(slots->where), resolve(slots->offsets);
    } else {
        resolve(experts.gate), resolve(experts.up), resolve(experts.down);
    }
    resolve(experts.gate_bias), resolve(experts.up_bias), resolve(experts.down_bias);
    resolve(x), resolve(ids), resolve(weights), resolve(y);
    exec([=] {
        const Rows ids_rows = resolve(ids);
        for (int64_t i = 0; i < ids_rows.rows * ids_rows.cols; ++i) {
            const int32_t e = ids_rows.row<int32_t>(i / ids_rows.cols)[i % ids_rows.cols];
            if (e < 0 || e >= ne) throw Error("moe_experts: expert id " + std::to_string(e) + " out of range");
        }
        SharedExpertRows sr;
        if (sh) sr = {resolve(sh->gate), resolve(sh->up), resolve(sh->down), resolve(sh->gate_logit)};
        const cpu::ExpertMatrix expert = slots ? slot_experts(*slots)
                                               : cpu::stacked_experts(resolve(experts.gate), resolve(experts.up),
                                                                      resolve(experts.down), ne);
        const cpu::ExpertAct act{experts.act, resolve(experts.gate_bias), resolve(experts.up_bias),
                                 resolve(experts.down_bias)};
        cpu::moe_experts(resolve(x), ids_rows, resolve(weights), expert, ne, act, sh ? &sr : nullptr, resolve(y));
    });
}

void CpuBackend::do_moe_combine(const Tensor& ys, const Tensor& pairs, const Tensor& weights, const Tensor& shared,
                             const Tensor& shared_gate, const Tensor& y) {
    resolve(ys), resolve(pairs), resolve(weights), resolve(shared), resolve(shared_gate), resolve(y);
    exec([=] {
        cpu::moe_combine(resolve(ys), resolve(pairs), resolve(weights), resolve(shared), resolve(shared_gate), resolve(y));
    });
}

void CpuBackend::do_ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& norm_key,
                          const Tensor& norm_query, const Tensor& norm_conv, int64_t hc, float eps, const Tensor& gated,
                          const Tensor& normed) {
    for (const Tensor* t : {&key, &query, &value, &norm_key, &norm_query, &norm_conv, &gated, &normed}) resolve(*t);
    exec([=] {
        cpu::ple_gate(resolve(key), resolve(query), resolve(value), resolve(norm_key), resolve(norm_query),
                      resolve(norm_conv), hc, eps, resolve(gated), resolve(normed));
    });
}

void CpuBackend::do_ple_conv(const Tensor& normed, const Tensor& w, int64_t dilation, const PleConvSeq* seqs,
                          int64_t n_seqs, const Tensor& out) {
    std::vector<PleConvSeq> s(seqs, seqs + n_seqs);
    for (const PleConvSeq& q : s) {
        resolve(q.state);
    }
    resolve(normed), resolve(w), resolve(out);
    exec([=] { cpu::ple_conv(resolve(normed), resolve(w), dilation, rows_of(s), resolve(out)); });
}

void CpuBackend::do_add_interpolated(const Tensor& table, const Tensor& idx, const Tensor& w, const Tensor& x) {
    resolve(table), resolve(idx), resolve(w), resolve(x);
    exec([=] { cpu::add_interpolated(resolve(table), resolve(idx), resolve(w), resolve(x)); });
}

void CpuBackend::do_vision_qkv(const Tensor& qkv, const Tensor& table, int64_t n_head, const Tensor& q, const Tensor& k,
                            const Tensor& vt) {
    resolve(qkv), resolve(table), resolve(q), resolve(k), resolve(vt);
    exec([=] { cpu::vision_qkv(resolve(qkv), resolve(table), n_head, resolve(q), resolve(k), resolve(vt)); });
}

void CpuBackend::do_softmax_scaled(const Tensor& x, float scale) {
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
