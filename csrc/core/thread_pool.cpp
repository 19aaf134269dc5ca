#include "thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace regolith {

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < std::max(1, n_threads); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        std::pair<int64_t, int64_t> chunk;
        const std::function<void(int64_t, int64_t)>* job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            if (size_t(index) >= chunks_.size()) continue;
            chunk = chunks_[index];
            job = job_;
        }
        std::exception_ptr err;
        try {
            (*job)(chunk.first, chunk.second);
        } catch (...) {
            err = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mutex_);
        if (err && !error_) error_ = err;
        if (--pending_ == 0) done_.notify_one();
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
    std::vector<std::pair<int64_t, int64_t>> chunks;
    for (int64_t p = 0; p < parts; ++p) {
        const int64_t b = units * p / parts * grain, e = std::min(n, units * (p + 1) / parts * grain);
        chunks.emplace_back(b, e);
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        chunks_ = chunks;
        job_ = &fn;
        pending_ = int(parts) - 1;
        error_ = nullptr;
        ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
        fn(chunks[0].first, chunks[0].second);
    } catch (...) {
        mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    chunks_.clear();
    if (mine) std::rethrow_exception(mine);
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
std::unique_ptr<ThreadPool> g_pool;
int g_threads = 0;

}  // namespace

ThreadPool& default_pool() {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (!g_pool) {
        g_threads = detect_threads();
        g_pool = std::make_unique<ThreadPool>(g_threads);
    }
    return *g_pool;
}

void set_default_threads(int n_threads) {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    g_threads = n_threads > 0 ? n_threads : detect_threads();
    g_pool = std::make_unique<ThreadPool>(g_threads);
}

int default_threads() {
    default_pool();
    return g_threads;
}

}  // namespace regolith
