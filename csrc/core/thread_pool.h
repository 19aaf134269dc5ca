// A small persistent thread pool for data-parallel loops over rows.
//
// Decode runs thousands of small parallel loops per token (one per weight matrix), so hand-off latency
// matters: workers spin briefly on an atomic generation counter before sleeping on a condition variable,
// and the caller spins briefly before sleeping while it waits for the last chunk.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
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
    // multiples of `grain`; the calling thread takes the first chunk. Returns when all chunks are done; the
    // first exception thrown by a chunk is rethrown here. Calls from several threads are serialised; fn must
    // not call parallel_for on the same pool.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop(int index);
    void run_chunk(int index);

    std::vector<std::thread> workers_;
    std::mutex call_mutex_;  // serialises callers
    std::mutex mutex_;       // guards sleeping and the error slot
    std::condition_variable wake_;
    std::condition_variable done_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    std::vector<std::pair<int64_t, int64_t>> chunks_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::exception_ptr error_;
    std::atomic<bool> stop_{false};
};

// The process-wide pool used by the CPU kernels. Threads default to the number of cores the process may
// run on (REGOLITH_THREADS overrides); set_default_threads() replaces the pool. Callers keep the returned
// pointer for the duration of their call (`default_pool()->parallel_for(...)` does), so a replaced pool
// lives until its last loop has finished.
std::shared_ptr<ThreadPool> default_pool();
void set_default_threads(int n_threads);
int default_threads();

}  // namespace regolith
