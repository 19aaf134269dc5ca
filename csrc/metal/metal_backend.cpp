// The Metal backend's memory, staging and submission; the ops are in the other files of this folder, one
// per op family, each dispatching the kernels of the metal/*.metal file of the same name.
#include "metal/metal_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/errors.h"
#include "core/types.h"

namespace regolith::metal {

namespace {

constexpr uint64_t kStagingChunk = 1u << 20;

uint64_t page_size() {
    static const uint64_t p = uint64_t(sysconf(_SC_PAGESIZE));
    return p;
}

int64_t packed_row_bytes(const Tensor& t) {
    const TypeTraits* tt = type_traits(t.type);
    if (!tt) throw Error("tensor of unknown type id " + std::to_string(t.type));
    return type_row_bytes(*tt, t.cols);
}

}  // namespace

MetalBackend::MetalBackend(std::unique_ptr<Device> device) : device_(std::move(device)) {}

MetalBackend::~MetalBackend() {
    device_->retire();
    std::lock_guard<std::mutex> lock(mu_);
    retire_locked(UINT64_MAX);
}

// ---- memory -------------------------------------------------------------------------------------------

BackendBuffer* MetalBackend::alloc(uint64_t bytes, MemoryUse use) {
    auto b = std::make_unique<MetalBuffer>();
    b->bytes = bytes;
    if (use == MemoryUse::Arena) {
        // Page-aligned memory of our own, wrapped without a copy, so the streamer reads into it and it can be
        // locked in RAM.
        const uint64_t n = std::max<uint64_t>(1, (bytes + page_size() - 1) / page_size()) * page_size();
        void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            throw std::system_error(errno, std::generic_category(),
                                    "cannot allocate " + std::to_string(bytes) + " bytes");
        b->device = device_->wrap(p, n);
        if (!b->device) {
            ::munmap(p, n);
            throw Error(std::string(device_->name()) + ": cannot wrap " + std::to_string(n) +
                        " bytes of arena memory");
        }
        b->mapping = p;
        b->mapping_bytes = n;
        device_->make_resident(b->device);
    } else {
        b->device = device_->new_buffer(bytes);
    }
    b->host = b->device->contents() + b->base;
    return b.release();
}

BackendBuffer* MetalBackend::import_host(const void* data, uint64_t bytes) {
    auto b = std::make_unique<MetalBuffer>();
    b->bytes = bytes;
    // The pages holding the data, wrapped without a copy (a mapped GGUF's tensors); a copy where the device
    // cannot wrap them.
    const auto at = reinterpret_cast<uintptr_t>(data);
    const uintptr_t start = at / page_size() * page_size();
    const uintptr_t end = (at + std::max<uint64_t>(bytes, 1) + page_size() - 1) / page_size() * page_size();
    b->device = device_->wrap(reinterpret_cast<void*>(start), end - start);
    if (b->device) {
        b->borrowed = true;
        b->base = at - start;
        device_->make_resident(b->device);
    } else {
        b->device = device_->new_buffer(bytes);
        std::memcpy(b->device->contents(), data, bytes);
    }
    b->host = b->device->contents() + b->base;
    return b.release();
}

void MetalBackend::release(MetalBuffer* b) {
    delete b->device;
    if (b->mapping) ::munmap(b->mapping, b->mapping_bytes);
    delete b;
}

void MetalBackend::free(BackendBuffer* buffer) {
    if (!buffer) return;
    auto* b = static_cast<MetalBuffer*>(buffer);
    std::unique_lock<std::mutex> lock(mu_);
    if (b->borrowed) {
        // The memory is the caller's (a mapped file, unmapped once this returns): the dispatches that read it
        // run to completion first.
        const uint64_t serial = last_commit_ = device_->commit();
        lock.unlock();
        device_->finish(serial);
        lock.lock();
        release(b);
        retire_locked(device_->completed());
        return;
    }
    // Dispatches encoded since the last commit, or committed and not yet complete, may still use it.
    retired_.push_back({b, last_commit_ + 1});
    retire_locked(device_->completed());
}

void MetalBackend::retire_locked(uint64_t completed) {
    auto done = [&](uint64_t serial) { return serial <= completed; };
    for (size_t i = 0; i < retired_.size();) {
        if (done(retired_[i].serial)) {
            release(retired_[i].buffer);
            retired_[i] = retired_.back();
            retired_.pop_back();
        } else {
            ++i;
        }
    }
    old_scratch_.erase(std::remove_if(old_scratch_.begin(), old_scratch_.end(),
                                      [&](const auto& s) { return done(s.second); }),
                       old_scratch_.end());
    for (Staging& s : staging_)
        if (s.serial && done(s.serial)) s.used = 0, s.serial = 0;
}

void* MetalBackend::host_address(BackendBuffer* buffer) {
    return buffer ? static_cast<MetalBuffer*>(buffer)->host : nullptr;
}

bool MetalBackend::lock(BackendBuffer* buffer, std::string* error) {
    auto* b = static_cast<MetalBuffer*>(buffer);
    if (!b->mapping) {
        if (error) *error = "only arena buffers are locked";
        return false;
    }
    if (::mlock(b->mapping, b->mapping_bytes) == 0) return true;
    if (error) *error = std::error_code(errno, std::generic_category()).message();
    return false;
}

View MetalBackend::view(const Tensor& t) const {
    if (!t) return {};
    const auto* b = static_cast<const MetalBuffer*>(t.buffer);
    const int64_t row = packed_row_bytes(t);
    if (t.rows < 0 || t.cols < 0 || (t.rows > 1 && t.row_bytes < row) ||
        (t.rows > 0 && t.offset + uint64_t((t.rows - 1) * t.row_bytes + row) > b->bytes))
        throw Error("tensor [" + std::to_string(t.rows) + "][" + std::to_string(t.cols) + "] at offset " +
                    std::to_string(t.offset) + " does not fit its buffer of " + std::to_string(b->bytes) +
                    " bytes");
    View v;
    v.arg = KernelArg{b->device, b->base + t.offset, nullptr, 0};
    v.shape = RgShape{t.rows, t.cols, t.row_bytes, t.type, 0};
    return v;
}

// ---- encoding and submission ---------------------------------------------------------------------------

void MetalBackend::launch(const char* kernel, uint32_t groups_x, uint32_t groups_y, uint32_t threads,
                          uint32_t shmem, std::initializer_list<KernelArg> args) {
    if (groups_x == 0 || groups_y == 0) return;
    Launch l;
    l.kernel = kernel;
    l.groups[0] = groups_x;
    l.groups[1] = groups_y;
    l.threads = threads;
    l.shmem = std::max<uint32_t>(16, (shmem + 15) / 16 * 16);  // Metal: a multiple of 16 bytes
    std::lock_guard<std::mutex> lock(mu_);
    device_->dispatch(l, args.begin(), int(args.size()));
}

KernelArg MetalBackend::scratch(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > scratch_bytes_) {
        // The old scratch may still be read by dispatches encoded before: kept until they complete.
        if (scratch_) old_scratch_.emplace_back(std::move(scratch_), last_commit_ + 1);
        scratch_bytes_ = std::max(bytes, 2 * scratch_bytes_);
        scratch_.reset(device_->new_buffer(scratch_bytes_));
    }
    return KernelArg{scratch_.get(), 0, nullptr, 0};
}

KernelArg MetalBackend::stage(const void* src, uint64_t bytes) {
    // mu_ is held. The copy reading the staged bytes is in the command buffer being encoded, which completes
    // as serial last_commit_ + 1.
    Staging* s = staging_.empty() ? nullptr : &staging_.back();
    const uint64_t at = s ? (s->used + 15) / 16 * 16 : 0;
    if (!s || at + bytes > s->bytes) {
        auto free_chunk = std::find_if(staging_.begin(), staging_.end(),
                                       [&](const Staging& c) { return c.serial == 0 && c.bytes >= bytes; });
        if (free_chunk != staging_.end()) {
            std::iter_swap(free_chunk, staging_.end() - 1);
        } else {
            const uint64_t n = std::max(bytes, kStagingChunk);
            staging_.push_back(Staging{std::unique_ptr<DeviceBuffer>(device_->new_buffer(n)), n, 0, 0});
        }
        s = &staging_.back();
    }
    const uint64_t off = (s->used + 15) / 16 * 16;
    std::memcpy(s->buffer->contents() + off, src, bytes);
    s->used = off + bytes;
    s->serial = last_commit_ + 1;
    return KernelArg{s->buffer.get(), off, nullptr, 0};
}

void MetalBackend::copy_rows(const KernelArg& src, int64_t src_stride, const View& dst, int64_t row) {
    // mu_ is held.
    const RgCopyArgs a{dst.shape.rows, row, src_stride, dst.shape.stride};
    const bool words = row % 4 == 0 && src.offset % 4 == 0 && dst.arg.offset % 4 == 0 &&
                       src_stride % 4 == 0 && dst.shape.stride % 4 == 0;
    const int64_t units = words ? row / 4 : row;
    Launch l;
    l.kernel = words ? "rg_copy_rows_u32" : "rg_copy_rows_u8";
    l.threads = simd_threads(units);
    l.groups[0] = uint32_t(std::min<int64_t>((units + l.threads - 1) / l.threads, 64));
    l.groups[1] = uint32_t(dst.shape.rows);
    l.shmem = 16;
    const KernelArg args[3] = {bytes(a), src, dst.arg};
    device_->dispatch(l, args, 3);
}

void MetalBackend::write(const Tensor& dst, const void* src) {
    const View d = view(dst);
    const int64_t row = packed_row_bytes(dst);
    if (dst.rows == 0 || row == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const KernelArg s = stage(src, uint64_t(dst.rows * row));
    copy_rows(s, row, d, row);
}

void MetalBackend::read(const Tensor& src, void* dst) {
    const View v = view(src);
    const int64_t row = packed_row_bytes(src);
    synchronize();
    const uint8_t* from = static_cast<const MetalBuffer*>(src.buffer)->host + src.offset;
    for (int64_t r = 0; r < src.rows; ++r)
        std::memcpy(static_cast<uint8_t*>(dst) + r * row, from + r * v.shape.stride, size_t(row));
}

void MetalBackend::do_copy(const Tensor& src, const Tensor& dst) {
    const View s = view(src), d = view(dst);
    if (src.rows == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    copy_rows(s.arg, s.shape.stride, d, packed_row_bytes(src));
}

void MetalBackend::do_zero(const Tensor& dst) {
    const View d = view(dst);
    if (dst.rows == 0) return;
    const int64_t row = packed_row_bytes(dst);
    const RgCopyArgs a{dst.rows, row, 0, d.shape.stride};
    launch("rg_zero_rows", uint32_t(std::min<int64_t>((row + 255) / 256, 64)), uint32_t(dst.rows), 256, 0,
           {bytes(a), d.arg});
}

void MetalBackend::submit() {
    std::lock_guard<std::mutex> lock(mu_);
    last_commit_ = device_->commit();
    retire_locked(device_->completed());
}

void MetalBackend::synchronize() {
    uint64_t serial = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        serial = last_commit_ = device_->commit();
    }
    device_->wait(serial);
    std::lock_guard<std::mutex> lock(mu_);
    retire_locked(device_->completed());
}

uint64_t MetalBackend::submitted() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_commit_;
}

void MetalBackend::wait_submitted(uint64_t n) { device_->wait(n); }

}  // namespace regolith::metal
