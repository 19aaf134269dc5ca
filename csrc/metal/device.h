// What the Metal backend needs from a Metal device: shared-storage buffers, kernels looked up by name,
// dispatches encoded into a command buffer, commits and waits. Two implementations: the Apple GPU
// (csrc/metal/apple_device.mm, Objective-C++, built only on Apple platforms) and the emulator
// (csrc/metal/emu/emu_device.cpp), which runs the same kernels (metal/*.metal compiled as C++) on the host.
// Everything above this interface (MetalBackend: buffers, staging, views, every op's dispatch) is the same
// code on both, so the emulator tests it in CI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace regolith::metal {

// A device's buffer (an MTLBuffer, or host memory on the emulator). Its contents are host memory: shared
// storage on Apple silicon's unified memory.
class DeviceBuffer {
  public:
    virtual ~DeviceBuffer() = default;
    virtual uint8_t* contents() = 0;
};

// One kernel argument: a buffer binding (setBuffer:offset:) or constant bytes (setBytes:, at most 4 KiB).
// Argument i is bound at index i ([[buffer(i)]]).
struct KernelArg {
    DeviceBuffer* buffer = nullptr;
    uint64_t offset = 0;
    const void* bytes = nullptr;
    uint32_t size = 0;
};

// A dispatch: groups[0] x groups[1] x groups[2] threadgroups of `threads` threads (1-D) with `shmem` bytes
// of threadgroup memory at [[threadgroup(0)]].
struct Launch {
    const char* kernel = nullptr;
    uint32_t groups[3] = {1, 1, 1};
    uint32_t threads = 32;
    uint32_t shmem = 0;
};

class Device {
  public:
    virtual ~Device() = default;
    virtual const char* name() const = 0;
    // The GPU's name for reports ("Apple M4 Pro"; the emulator says it is one).
    virtual std::string description() const = 0;
    // A new buffer of `bytes` bytes (contents undefined); throws Error when the device has no memory for it.
    virtual DeviceBuffer* new_buffer(uint64_t bytes) = 0;
    // A buffer over host memory, without a copy (newBufferWithBytesNoCopy): p and bytes are page-aligned and
    // the memory outlives the buffer. Null where the device cannot wrap that memory (the caller copies).
    virtual DeviceBuffer* wrap(void* p, uint64_t bytes) = 0;
    // Keeps a large buffer (the expert arena, the weights) resident (residency sets where the OS has them).
    virtual void make_resident(DeviceBuffer* b) {}

    // The most threads a threadgroup of `kernel` may have.
    virtual uint32_t max_threads(const char* kernel) = 0;
    // Encodes a dispatch into the current command buffer. Not thread-safe: the backend serialises callers.
    virtual void dispatch(const Launch& l, const KernelArg* args, int n_args) = 0;
    // Commits the current command buffer, if it holds any dispatch, and returns the serial that completes
    // with it (the last serial committed when it is empty). Serials start at 1 and complete in order.
    virtual uint64_t commit() = 0;
    // Waits until the command buffers up to `serial` have completed; rethrows a command buffer's error as an
    // Error. May be called from any thread.
    virtual void wait(uint64_t serial) = 0;
    // Waits as wait() does but leaves a command buffer's error for the next wait (for callers that cannot
    // throw: freeing a buffer, the device going away).
    virtual void finish(uint64_t serial) = 0;
    virtual uint64_t completed() = 0;
    // Before the device goes away (the backend's destructor): afterwards no command buffer reads or writes
    // memory. The GPU finishes what it was given; the emulator drops what has not started (nobody can read
    // its results any more, and at process exit the threads it would run on may be gone).
    virtual void retire() = 0;
};

// The system's default Metal device, or null (not an Apple platform, or no GPU): apple_device.mm /
// no_apple_device.cpp. `why` says why not when it returns null.
std::unique_ptr<Device> apple_device(std::string* why);
// The emulator (always available).
std::unique_ptr<Device> emulated_device();

}  // namespace regolith::metal
