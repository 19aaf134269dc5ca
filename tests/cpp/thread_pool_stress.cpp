// Stress test of regolith::ThreadPool: rounds with fewer chunks than threads alternate with full rounds,
// and a pool is replaced while loops run on it. Every index must be visited exactly once per round.
// Built and run by tests/test_thread_pool.py (with ThreadSanitizer where available).
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

int main() {
    using namespace regolith;
    long bad = 0;
    {
        ThreadPool pool(8);
        for (int it = 0; it < 4000; ++it) {
            const int64_t n = (it % 3 == 0) ? 8 : (it % 3 == 1 ? 2 : 3);
            std::vector<std::atomic<int>> hits(8);
            pool.parallel_for(n, 1, [&](int64_t a, int64_t b) {
                for (int64_t i = a; i < b; ++i) hits[size_t(i)]++;
            });
            for (int64_t i = 0; i < n; ++i) bad += hits[size_t(i)].load() != 1;
        }
    }
    // Replace the default pool while another thread uses it.
    std::atomic<bool> done{false};
    std::thread user([&] {
        for (int it = 0; it < 2000; ++it) {
            std::atomic<int> sum{0};
            default_pool()->parallel_for(16, 1, [&](int64_t a, int64_t b) { sum += int(b - a); });
            bad += sum.load() != 16;
        }
        done = true;
    });
    for (int k = 0; !done; ++k) set_default_threads(1 + k % 4);
    user.join();
    std::printf("bad=%ld\n", bad);
    return bad == 0 ? 0 : 1;
}
