#include "core/buffers.h"

#include <algorithm>
#include <string>

#include "core/errors.h"
#include "core/types.h"

namespace regolith {

namespace {

constexpr uint64_t kAlign = 256;                 // of every workspace tensor (GPU vector loads)
constexpr uint64_t kMinChunk = uint64_t(1) << 20;  // bytes
// A step that needed more (a long prefill) gives its memory back; smaller ones (decode) keep it for the next.
constexpr uint64_t kRetain = uint64_t(32) << 20;

uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace

uint64_t tensor_bytes(uint32_t type, int64_t rows, int64_t cols) {
    const TypeTraits* t = type_traits(type);
    if (!t || rows < 0 || cols < 0 || cols % t->block_elems != 0)
        throw Error("tensor of " + std::to_string(rows) + " x " + std::to_string(cols) + " elements of type id " +
                    std::to_string(type) + ": not a whole number of blocks per row");
    return uint64_t(rows) * uint64_t(type_row_bytes(*t, cols));
}

Buffer::Buffer(Backend& be, uint64_t bytes, MemoryUse use)
    : be_(&be), buf_(be.alloc(std::max<uint64_t>(bytes, 1), use)), bytes_(bytes) {}

Buffer Buffer::import(Backend& be, const void* data, uint64_t bytes) {
    Buffer b;
    b.be_ = &be;
    b.buf_ = be.import_host(data, bytes);
    b.bytes_ = bytes;
    return b;
}

Buffer::~Buffer() {
    if (buf_) be_->free(buf_);
}

Buffer::Buffer(Buffer&& o) noexcept : be_(o.be_), buf_(o.buf_), bytes_(o.bytes_) {
    o.buf_ = nullptr;
    o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
    if (this != &o) {
        if (buf_) be_->free(buf_);
        be_ = o.be_;
        buf_ = o.buf_;
        bytes_ = o.bytes_;
        o.buf_ = nullptr;
        o.bytes_ = 0;
    }
    return *this;
}

Tensor Buffer::tensor(uint32_t type, int64_t rows, int64_t cols, uint64_t offset) const {
    const uint64_t bytes = tensor_bytes(type, rows, cols);
    if (offset + bytes > bytes_)
        throw Error("tensor of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                    " exceeds its buffer of " + std::to_string(bytes_));
    Tensor t;
    t.buffer = buf_;
    t.offset = offset;
    t.type = type;
    t.rows = rows;
    t.cols = cols;
    t.row_bytes = rows > 0 ? int64_t(bytes / uint64_t(rows)) : int64_t(tensor_bytes(type, 1, cols));
    return t;
}

OwnedTensor::OwnedTensor(Backend& be, uint32_t type, int64_t rows, int64_t cols)
    : buffer(be, tensor_bytes(type, rows, cols)), t(buffer.tensor(type, rows, cols)) {}

OwnedTensor OwnedTensor::from_host(Backend& be, uint32_t type, int64_t rows, int64_t cols, const void* data) {
    OwnedTensor o(be, type, rows, cols);
    be.write(o.t, data);
    return o;
}

Tensor Workspace::alloc(uint32_t type, int64_t rows, int64_t cols) {
    const uint64_t bytes = round_up(std::max<uint64_t>(tensor_bytes(type, rows, cols), 1), kAlign);
    if (chunks_.empty() || used_ + bytes > chunks_[chunk_].bytes()) {
        if (!chunks_.empty() && chunk_ + 1 < chunks_.size() && chunks_[chunk_ + 1].bytes() >= bytes) {
            ++chunk_;
        } else {
            const uint64_t last = chunks_.empty() ? 0 : chunks_.back().bytes();
            const size_t at = chunks_.empty() ? 0 : chunk_ + 1;
            chunks_.insert(chunks_.begin() + std::ptrdiff_t(at), Buffer(*be_, std::max({bytes, kMinChunk, 2 * last})));
            chunk_ = at;
            uint64_t held = 0;
            for (const Buffer& c : chunks_) held += c.bytes();
            held_peak_ = std::max(held_peak_, held);
        }
        used_ = 0;
    }
    Tensor t = chunks_[chunk_].tensor(type, rows, cols, used_);
    used_ += bytes;
    uint64_t taken = used_;
    for (size_t i = 0; i < chunk_; ++i) taken += chunks_[i].bytes();
    peak_ = std::max(peak_, taken);
    return t;
}

void Workspace::reset() {
    if (peak_ > kRetain) {
        chunks_.clear();
    } else if (chunks_.size() > 1) {
        chunks_.clear();
        chunks_.push_back(Buffer(*be_, round_up(peak_, kMinChunk)));
        held_peak_ = std::max(held_peak_, chunks_.back().bytes());
    }
    chunk_ = 0;
    used_ = 0;
    peak_ = 0;
}

}  // namespace regolith
