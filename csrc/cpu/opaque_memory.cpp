#include "cpu/opaque_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#include "core/errors.h"

namespace regolith::cpu {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kReserve = uint64_t(1) << 36;  // 64 GiB of address space, no memory until touched

uint64_t pages(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

}  // namespace

OpaqueMemory::OpaqueMemory(int closed) : closed_(closed) {
    for (uint64_t size = kReserve; size >= (uint64_t(1) << 30) && !base_; size /= 2) {
        void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) base_ = static_cast<uint8_t*>(p), reserved_ = size;
    }
    if (!base_) throw Error(std::string("cpu-opaque: cannot reserve address space: ") + std::strerror(errno));
}

OpaqueMemory::~OpaqueMemory() { ::munmap(base_, reserved_); }

void OpaqueMemory::protect(int prot) {
    if (high_ > 0 && ::mprotect(base_, high_, prot) != 0)
        throw Error(std::string("cpu-opaque: mprotect failed: ") + std::strerror(errno));
}

uint8_t* OpaqueMemory::alloc(uint64_t bytes) {
    const uint64_t n = pages(bytes == 0 ? 1 : bytes);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second < n) continue;
        const uint64_t at = it->first, left = it->second - n;
        free_.erase(it);
        if (left > 0) free_[at + n] = left;
        return base_ + at;
    }
    if (high_ + n > reserved_)
        throw Error("cpu-opaque: out of reserved address space (" + std::to_string(reserved_ >> 20) + " MiB)");
    const uint64_t at = high_;
    high_ += n;
    if (::mprotect(base_ + at, n, open_ > 0 ? PROT_READ | PROT_WRITE : closed_) != 0)
        throw Error(std::string("cpu-opaque: mprotect failed: ") + std::strerror(errno));
    return base_ + at;
}

void OpaqueMemory::release(uint8_t* p, uint64_t bytes) {
    const uint64_t n = pages(bytes == 0 ? 1 : bytes), at = uint64_t(p - base_);
    std::lock_guard<std::mutex> lock(mu_);
    ::madvise(p, n, MADV_DONTNEED);  // give the pages back; a later block reads zeros
    auto next = free_.lower_bound(at);
    uint64_t start = at, size = n;
    if (next != free_.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == at) start = prev->first, size += prev->second, free_.erase(prev);
    }
    if (next != free_.end() && next->first == at + n) size += next->second, free_.erase(next);
    if (start + size == high_) {
        // the top of the range: hand it back, so that protecting the range stays cheap
        ::mprotect(base_ + start, size, PROT_NONE);
        high_ = start;
        return;
    }
    free_[start] = size;
}

void OpaqueMemory::fill(uint8_t* p, const void* src, uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t len = pages(n == 0 ? 1 : n);
    if (::mprotect(p, len, PROT_READ | PROT_WRITE) != 0)
        throw Error(std::string("cpu-opaque: mprotect failed: ") + std::strerror(errno));
    std::memcpy(p, src, n);
    if (open_ == 0) ::mprotect(p, len, closed_);
}

void OpaqueMemory::open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_++ == 0) protect(PROT_READ | PROT_WRITE);
}

void OpaqueMemory::close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--open_ == 0) protect(closed_);
}

}  // namespace regolith::cpu
