// The Metal emulator's execution model: a dispatch's threadgroups run on the host's worker threads, one at a
// time per worker; the threads of a threadgroup run on fibers of that worker, each until it reaches a point
// where Metal makes threads wait for each other:
//   - threadgroup_barrier: every thread of the threadgroup must reach it; a thread that has returned while
//     others wait at a barrier is an error (Metal leaves it undefined);
//   - a SIMD-group function (simd_sum, simd_shuffle, ...): every thread of the 32-lane SIMD-group that has
//   not
//     returned must reach the same call (same function, same call site), which is then evaluated for all of
//     them at once, as the hardware does; lanes that returned are inactive.
// Anything else (a SIMD-group whose lanes wait at different calls, or at a barrier and a SIMD call) is a
// divergence the emulator reports as an error naming the kernel. Between those points threads run one after
// another, in increasing or (REGOLITH_METAL_EMU_ORDER=reverse) decreasing order, so a kernel that reads
// threadgroup memory another thread writes without a barrier between them gives different results in the
// two orders. Threadgroup memory starts filled with 0xFF bytes (NaN floats, -1 integers) in every
// threadgroup.
#pragma once

#include <cstdint>
#include <string>

namespace regolith::metal_emu {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kMaxThreadsPerGroup = 1024;

// What a kernel gets besides its buffers: MSL's position attributes for 1-D threadgroups.
struct ThreadIds {
    uint32_t tgpig[3];  // threadgroup_position_in_grid
    uint32_t tiitg;     // thread_index_in_threadgroup
    uint32_t sgitg;     // simdgroup_index_in_threadgroup
    uint32_t tiisg;     // thread_index_in_simdgroup
    uint32_t ntg;       // threads_per_threadgroup
    uint32_t tgpg[3];   // threadgroups_per_grid
    uint8_t* shmem;     // threadgroup(0) memory
};

// One emulated thread's part in a SIMD-group function: its input, the function (a resolver that computes
// every active lane's output from all their inputs), the call site, and its output.
struct Lane {
    enum class State : uint8_t { Ready, Barrier, Simd, Done };
    State state = State::Ready;
    uint32_t index = 0;  // thread_index_in_threadgroup
    void (*resolve)(Lane* const* lanes, uint32_t n) = nullptr;
    const char* site_file = nullptr;  // the call site in the kernel
    uint32_t site_line = 0;
    uint32_t arg = 0;  // the shuffle's lane, delta or mask
    alignas(16) unsigned char in[16];
    alignas(16) unsigned char out[16];
};

// The kernel as the emulator calls it: fn(ctx, ids) runs one thread.
using ThreadBody = void (*)(const void* ctx, const ThreadIds& ids);

// The order threads run in between waits: decreasing where `reverse` (default: REGOLITH_METAL_EMU_ORDER).
void set_reverse_order(bool reverse);
bool reverse_order();

// Runs every threadgroup of grid[0] x grid[1] x grid[2] with `threads` threads each and `shmem_bytes` of
// threadgroup memory, spread over the default thread pool; throws Error (naming `kernel`) on a divergence.
void run_grid(const char* kernel, const uint32_t grid[3], uint32_t threads, uint32_t shmem_bytes,
              ThreadBody body, const void* ctx);

// For the emulated Metal library (msl.h): the calling thread's lane, and waits at a barrier or at a
// SIMD-group function (the lane's resolve / site / arg / in set first); they return when the wait is over.
Lane& current_lane();
void wait_at_barrier();
void wait_at_simd();

}  // namespace regolith::metal_emu
