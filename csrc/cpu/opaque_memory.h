// The memory of the "cpu-opaque" backend: a reserved address range whose pages are inaccessible outside
// backend calls (`closed`: PROT_NONE, or PROT_READ for the weights' copies, which the core holds no address
// of and which are large: toggling them would make every call slow), so a host access from the core faults.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

namespace regolith::cpu {

class OpaqueMemory {
public:
    explicit OpaqueMemory(int closed);
    ~OpaqueMemory();
    OpaqueMemory(const OpaqueMemory&) = delete;
    OpaqueMemory& operator=(const OpaqueMemory&) = delete;

    // A page-aligned block of at least `bytes` bytes (contents undefined); throws Error when the range is full.
    uint8_t* alloc(uint64_t bytes);
    void release(uint8_t* p, uint64_t bytes);

    // Copies n bytes into the block at p (from alloc), opening only its pages while it does.
    void fill(uint8_t* p, const void* src, uint64_t n);
    // Opens the pages to this process while backend code runs (nested and concurrent calls counted).
    void open();
    void close();
    struct Access {
        explicit Access(OpaqueMemory& m) : m_(m) { m_.open(); }
        ~Access() { m_.close(); }
        OpaqueMemory& m_;
    };

private:
    void protect(int prot);

    int closed_;
    uint8_t* base_ = nullptr;
    uint64_t reserved_ = 0;
    uint64_t high_ = 0;                   // bytes of the range handed out so far (a page multiple)
    std::map<uint64_t, uint64_t> free_;   // offset -> bytes of free blocks below high_, coalesced
    std::mutex mu_;
    int open_ = 0;
};

}  // namespace regolith::cpu
