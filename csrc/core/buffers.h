// Backend memory owned by the core: Buffer (one backend buffer, freed with it) and Workspace (a step's
// scratch tensors, handed out from a few buffers and given back in stack order).
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"

namespace regolith {

class Buffer {
public:
    Buffer() = default;
    Buffer(Backend& be, uint64_t bytes, MemoryUse use = MemoryUse::Device);
    // Host memory as a read-only buffer (Backend::import_host): `data` must outlive the buffer.
    static Buffer import(Backend& be, const void* data, uint64_t bytes);
    ~Buffer();
    Buffer(Buffer&& o) noexcept;
    Buffer& operator=(Buffer&& o) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    BackendBuffer* get() const { return buf_; }
    uint64_t bytes() const { return bytes_; }
    Backend* backend() const { return be_; }
    explicit operator bool() const { return buf_ != nullptr; }
    // rows x cols of `type` at `offset`, rows packed (row_bytes = the type's bytes per row).
    Tensor tensor(uint32_t type, int64_t rows, int64_t cols, uint64_t offset = 0) const;

private:
    Backend* be_ = nullptr;
    BackendBuffer* buf_ = nullptr;
    uint64_t bytes_ = 0;
};

// A tensor with a buffer of its own (weights converted at load, window states).
struct OwnedTensor {
    Buffer buffer;
    Tensor t;

    OwnedTensor() = default;
    OwnedTensor(Backend& be, uint32_t type, int64_t rows, int64_t cols);
    // rows x cols of F32 (or I32 / I8 / I64: `type`) from host memory, copied into a new buffer.
    static OwnedTensor from_host(Backend& be, uint32_t type, int64_t rows, int64_t cols, const void* data);
};

// Scratch memory of a step. Tensors come from the top of a stack of buffers; a Scope gives back everything
// taken after it was opened (a layer's intermediates), reset() everything. Memory is reused only by ops
// recorded later, which run after the earlier ones, so no wait is needed. When a step needed more than the
// first buffer, reset() replaces the buffers by one large enough for the whole step, or, past 32 MiB (a long
// prefill), frees them.
class Workspace {
public:
    explicit Workspace(Backend& be) : be_(&be) {}

    Backend& backend() const { return *be_; }
    Tensor alloc(uint32_t type, int64_t rows, int64_t cols);
    Tensor f32(int64_t rows, int64_t cols) { return alloc(RG_TYPE_F32, rows, cols); }
    Tensor i32(int64_t rows, int64_t cols) { return alloc(RG_TYPE_I32, rows, cols); }
    void reset();
    // The most bytes of backend memory its chunks have held at once since construction.
    uint64_t held_peak() const { return held_peak_; }

    class Scope {
    public:
        explicit Scope(Workspace& ws) : ws_(ws), chunk_(ws.chunk_), used_(ws.used_) {}
        ~Scope() { ws_.chunk_ = chunk_, ws_.used_ = used_; }
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;

    private:
        Workspace& ws_;
        size_t chunk_;
        uint64_t used_;
    };

private:
    Backend* be_;
    std::vector<Buffer> chunks_;
    size_t chunk_ = 0;   // the chunk being filled
    uint64_t used_ = 0;  // bytes used in it
    uint64_t peak_ = 0;  // bytes taken in all chunks at once, most this step
    uint64_t held_peak_ = 0;
};

// Bytes of rows x cols elements of `type`, rows packed.
uint64_t tensor_bytes(uint32_t type, int64_t rows, int64_t cols);

}  // namespace regolith
