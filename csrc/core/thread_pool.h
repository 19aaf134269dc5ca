// A small persistent thread pool for data-parallel loops over rows.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace regolith {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return int(workers_.size()) + 1; }

    // Runs fn(begin, end) over [0, n) split into at most size() contiguous chunks whose boundaries are
    // multiples of `grain`; the calling thread takes a chunk too. Returns when all chunks are done; the
    // first exception thrown by a chunk is rethrown here. Calls from several threads are serialised; fn must
    // not call parallel_for on the same pool.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop(int index);

    std::vector<std::thread> workers_;
    std::mutex call_mutex_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    std::vector<std::pair<int64_t, int64_t>> chunks_;
    uint64_t generation_ = 0;
    int pending_ = 0;
    std::exception_ptr error_;
    bool stop_ = false;
};

// The process-wide pool used by the CPU kernels. Threads default to the number of cores the process may
// run on (REGOLITH_THREADS overrides); set_default_threads() replaces the pool.
ThreadPool& default_pool();
void set_default_threads(int n_threads);
int default_threads();

}  // namespace regolith
