#include "metal/emu/threadgroup.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "metal/emu/fiber.h"

namespace regolith::metal_emu {

namespace {

// Stack of one emulated thread: kernels keep small arrays (a block's codes, a few 8x8 matrices) in it.
constexpr size_t kStackBytes = 64 * 1024;

// Runs threadgroups on one host thread: a fiber and a stack per emulated thread, grown on demand and kept.
class GroupRunner {
  public:
    void run(const char* kernel, const uint32_t tgpig[3], const uint32_t grid[3], uint32_t threads,
             uint32_t shmem_bytes, ThreadBody body, const void* ctx);

    Lane& lane() { return lanes_[current_]; }
    void yield() { Fiber::swap(*fibers_[current_], main_); }

  private:
    static void thread_main(void* self);
    [[noreturn]] void fail(const char* kernel, const std::string& what) const;

    Fiber main_;
    std::vector<std::unique_ptr<FiberStack>> stacks_;
    std::vector<std::unique_ptr<Fiber>> fibers_;
    std::vector<Lane> lanes_;
    std::vector<uint8_t> shmem_;
    uint32_t current_ = 0;
    // the threadgroup being run
    ThreadBody body_ = nullptr;
    const void* ctx_ = nullptr;
    ThreadIds ids_{};
};

thread_local GroupRunner* t_runner = nullptr;

std::atomic<bool>& reverse_flag() {
    static std::atomic<bool> reverse{[] {
        const char* env = std::getenv("REGOLITH_METAL_EMU_ORDER");
        return env && std::strcmp(env, "reverse") == 0;
    }()};
    return reverse;
}

void GroupRunner::thread_main(void* self) {
    auto* r = static_cast<GroupRunner*>(self);
    for (;;) {
        ThreadIds ids = r->ids_;
        const uint32_t i = r->current_;
        ids.tiitg = i;
        ids.sgitg = i / kSimdWidth;
        ids.tiisg = i % kSimdWidth;
        r->body_(r->ctx_, ids);
        r->lanes_[i].state = Lane::State::Done;
        // Back to the scheduler; the fiber is started afresh before it runs again.
        r->yield();
    }
}

void GroupRunner::fail(const char* kernel, const std::string& what) const {
    throw Error(std::string("metal emulator: kernel ") + kernel + " threadgroup (" +
                std::to_string(ids_.tgpig[0]) + ", " + std::to_string(ids_.tgpig[1]) + ", " +
                std::to_string(ids_.tgpig[2]) + "): " + what);
}

void GroupRunner::run(const char* kernel, const uint32_t tgpig[3], const uint32_t grid[3], uint32_t threads,
                      uint32_t shmem_bytes, ThreadBody body, const void* ctx) {
    while (stacks_.size() < threads) {
        stacks_.push_back(std::make_unique<FiberStack>(kStackBytes));
        fibers_.push_back(std::make_unique<Fiber>());
    }
    lanes_.assign(threads, Lane{});
    shmem_.assign(shmem_bytes, 0xff);
    body_ = body;
    ctx_ = ctx;
    ids_ = ThreadIds{
        {tgpig[0], tgpig[1], tgpig[2]}, 0, 0, 0, threads, {grid[0], grid[1], grid[2]}, shmem_.data()};
    for (uint32_t i = 0; i < threads; ++i) {
        lanes_[i].index = i;
        fibers_[i]->start(*stacks_[i], &GroupRunner::thread_main, this);
    }
    const bool reverse = reverse_order();
    const uint32_t n_simd = (threads + kSimdWidth - 1) / kSimdWidth;
    std::vector<Lane*> active;
    for (;;) {
        for (uint32_t k = 0; k < threads; ++k) {
            current_ = reverse ? threads - 1 - k : k;
            if (lanes_[current_].state == Lane::State::Ready) Fiber::swap(main_, *fibers_[current_]);
        }
        // Every thread now waits or has returned: evaluate the SIMD-group functions all active lanes reached.
        bool progress = false, done = true, all_at_barrier = true;
        for (uint32_t sg = 0; sg < n_simd; ++sg) {
            active.clear();
            bool at_simd = true;
            for (uint32_t i = sg * kSimdWidth; i < std::min(threads, (sg + 1) * kSimdWidth); ++i) {
                Lane& l = lanes_[i];
                if (l.state == Lane::State::Done) continue;
                done = false;
                at_simd = at_simd && l.state == Lane::State::Simd;
                all_at_barrier = all_at_barrier && l.state == Lane::State::Barrier;
                active.push_back(&l);
            }
            if (active.empty() || !at_simd) continue;
            for (const Lane* l : active)
                if (l->resolve != active[0]->resolve || l->site_file != active[0]->site_file ||
                    l->site_line != active[0]->site_line)
                    fail(kernel, "lanes of SIMD-group " + std::to_string(sg) +
                                     " wait at different SIMD-group functions (divergent control flow)");
            active[0]->resolve(active.data(), uint32_t(active.size()));
            for (Lane* l : active) l->state = Lane::State::Ready;
            progress = true;
        }
        if (done) return;
        if (progress) continue;
        if (!all_at_barrier) {
            std::string where;
            for (const Lane& l : lanes_)
                if (l.state == Lane::State::Simd) {
                    where = "thread " + std::to_string(l.index) +
                            " waits at a SIMD-group function while others of its "
                            "SIMD-group wait at a barrier";
                    break;
                }
            fail(kernel, where.empty() ? "deadlock" : where);
        }
        for (const Lane& l : lanes_)
            if (l.state == Lane::State::Done)
                fail(kernel, "thread " + std::to_string(l.index) +
                                 " returned while others wait at a threadgroup barrier");
        for (Lane& l : lanes_) l.state = Lane::State::Ready;
    }
}

GroupRunner& runner() {
    thread_local GroupRunner r;
    return r;
}

}  // namespace

void set_reverse_order(bool reverse) { reverse_flag().store(reverse); }
bool reverse_order() { return reverse_flag().load(); }

void run_grid(const char* kernel, const uint32_t grid[3], uint32_t threads, uint32_t shmem_bytes,
              ThreadBody body, const void* ctx) {
    if (threads == 0 || threads > kMaxThreadsPerGroup)
        throw Error(std::string("metal emulator: kernel ") + kernel + " dispatched with " +
                    std::to_string(threads) + " threads per threadgroup (1.." +
                    std::to_string(kMaxThreadsPerGroup) + ")");
    const int64_t n = int64_t(grid[0]) * grid[1] * grid[2];
    if (n == 0) return;
    default_pool()->parallel_for(n, 1, [&](int64_t b, int64_t e) {
        GroupRunner& r = runner();
        t_runner = &r;
        for (int64_t g = b; g < e; ++g) {
            const uint32_t pos[3] = {uint32_t(g % grid[0]), uint32_t(g / grid[0] % grid[1]),
                                     uint32_t(g / (int64_t(grid[0]) * grid[1]))};
            r.run(kernel, pos, grid, threads, shmem_bytes, body, ctx);
        }
    });
}

Lane& current_lane() { return t_runner->lane(); }

void wait_at_barrier() {
    current_lane().state = Lane::State::Barrier;
    t_runner->yield();
}

void wait_at_simd() {
    current_lane().state = Lane::State::Simd;
    t_runner->yield();
}

}  // namespace regolith::metal_emu
