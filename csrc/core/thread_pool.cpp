#include "thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

namespace regolith {
namespace {

// How long a thread spins before it sleeps: long enough to bridge the gap between two consecutive
// matrix products of one decode step, short enough not to burn a core when idle.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// Spins until pred() holds or kSpin has passed; returns pred().
template <class Pred>
bool spin_until(Pred pred) {
    const auto deadline = std::chrono::steady_clock::now() + kSpin;
    for (int i = 0;; ++i) {
        if (pred()) return true;
        cpu_relax();
        if ((i & 255) == 255 && std::chrono::steady_clock::now() > deadline) return pred();
    }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < std::max(1, n_threads); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunk(int index) {
    try {
        (*job_)(chunks_[size_t(index)].first, chunks_[size_t(index)].second);
    } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
    }
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        const auto fresh = [&] { return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; };
        if (!spin_until(fresh)) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, fresh);
        }
        if (stop_.load()) return;
        seen = generation_.load(std::memory_order_acquire);
        // Every worker reports every round, also when the round has fewer chunks than threads: the caller
        // waits for all of them, so no worker can still be reading this round's chunks when the next begins.
        if (size_t(index) < chunks_.size()) run_chunk(index);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            std::lock_guard<std::mutex> lock(mutex_);
            done_.notify_one();
        }
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    std::lock_guard<std::mutex> caller(call_mutex_);
    grain = std::max<int64_t>(1, grain);
    const int64_t units = (n + grain - 1) / grain;
    const int64_t parts = std::min<int64_t>(units, size());
    if (parts <= 1) {
        fn(0, n);
        return;
    }
    chunks_.clear();
    for (int64_t p = 0; p < parts; ++p)
        chunks_.emplace_back(units * p / parts * grain, std::min(n, units * (p + 1) / parts * grain));
    job_ = &fn;
    error_ = nullptr;
    pending_.store(int(workers_.size()), std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lock(mutex_);  // no lost wake-up for a worker about to sleep
        generation_.fetch_add(1, std::memory_order_acq_rel);
    }
    wake_.notify_all();
    run_chunk(0);
    const auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(finished)) {
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, finished);
    }
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
}

namespace {

int detect_threads() {
    if (const char* env = std::getenv("REGOLITH_THREADS")) {
        const int n = std::atoi(env);
        if (n > 0) return n;
    }
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
    return std::max(1u, std::thread::hardware_concurrency());
}

std::mutex g_pool_mutex;
std::shared_ptr<ThreadPool> g_pool;
int g_threads = 0;

}  // namespace

std::shared_ptr<ThreadPool> default_pool() {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (!g_pool) {
        g_threads = detect_threads();
        g_pool = std::make_shared<ThreadPool>(g_threads);
    }
    return g_pool;
}

void set_default_threads(int n_threads) {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    g_threads = n_threads > 0 ? n_threads : detect_threads();
    g_pool = std::make_shared<ThreadPool>(g_threads);
}

int default_threads() {
    default_pool();
    return g_threads;
}

}  // namespace regolith
