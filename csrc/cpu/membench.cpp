// Memory read bandwidth probe for benchmarks: the physical limit the matvec kernels are measured against.
#include "cpu/membench.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/thread_pool.h"

namespace regolith::cpu {

uint64_t read_all(const uint8_t* data, size_t nbytes) {
    std::atomic<uint64_t> total{0};
    const int64_t n_words = int64_t(nbytes / 8);
    default_pool()->parallel_for(n_words, 4096, [&](int64_t w0, int64_t w1) {
        // 8 independent XOR chains: the loop is bound by loads, not by a dependency chain.
        uint64_t acc[8] = {};
        int64_t w = w0;
        for (; w + 8 <= w1; w += 8) {
            for (int k = 0; k < 8; ++k) {
                uint64_t v;
                std::memcpy(&v, data + 8 * (w + k), 8);
                acc[k] ^= v;
            }
        }
        for (; w < w1; ++w) {
            uint64_t v;
            std::memcpy(&v, data + 8 * w, 8);
            acc[0] ^= v;
        }
        uint64_t x = 0;
        for (uint64_t a : acc) x ^= a;
        total.fetch_xor(x);
    });
    return total.load();
}

}  // namespace regolith::cpu
