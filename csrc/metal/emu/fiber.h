// Fibers for the Metal emulator: each emulated GPU thread of a threadgroup runs on a stack of its own, and
// control passes between them only where a kernel waits for the others (barriers, SIMD-group operations).
//
// A switch saves the callee-saved registers on the current stack and loads the other stack: x86-64 and
// arm64 have a few instructions of assembly (tens of nanoseconds a switch); other hosts use ucontext
// (about 0.6 us a round trip, two system calls for the signal mask).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace regolith::metal_emu {

// A stack of `bytes` usable bytes with an inaccessible guard page below it, so an overflow faults.
class FiberStack {
  public:
    explicit FiberStack(size_t bytes);
    ~FiberStack();
    FiberStack(const FiberStack&) = delete;
    FiberStack& operator=(const FiberStack&) = delete;

    uint8_t* top() const { return base_ + size_; }
    uint8_t* bottom() const { return base_ + guard_; }
    size_t size() const { return size_ - guard_; }

  private:
    uint8_t* base_ = nullptr;
    size_t size_ = 0, guard_ = 0;
};

// A context to switch to: the OS thread's own (made by the constructor) or a fiber's (start()).
class Fiber {
  public:
    Fiber();
    ~Fiber();
    Fiber(const Fiber&) = delete;
    Fiber& operator=(const Fiber&) = delete;

    // Makes this context run fn(arg) on `stack` when next switched to. fn must never return: it ends by
    // switching away for the last time.
    void start(FiberStack& stack, void (*fn)(void*), void* arg);
    // Saves the running context into `from` and runs `to`.
    static void swap(Fiber& from, Fiber& to);

    struct Impl;

  private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace regolith::metal_emu
