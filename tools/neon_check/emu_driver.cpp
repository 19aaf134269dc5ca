// The Metal emulator on arm64 (its fibers switch stacks in assembly per architecture): the self-test kernels
// (csrc/metal/emu/selftest_kernels.cpp) in both thread orders, checked here. Built and run under qemu by
// run.py --emulator; prints "emulator: N passed, M failed".
#include <cmath>
#include <cstdio>
#include <vector>

#include "metal/emu/kernel_registry.h"

namespace {

using regolith::metal_emu::find_kernel;

int failed = 0, passed = 0;

void expect(bool ok, const char* what, bool reverse) {
    (ok ? passed : failed) += 1;
    if (!ok) std::printf("FAIL %s (%s order)\n", what, reverse ? "reverse" : "forward");
}

void run(const char* name, std::vector<void*> bufs, uint32_t groups, uint32_t threads, uint32_t shmem) {
    const uint32_t grid[3] = {groups, 1, 1};
    find_kernel(name)->run(name, reinterpret_cast<uint8_t* const*>(bufs.data()), grid, threads, shmem);
}

}  // namespace

int main() {
    for (bool reverse : {false, true}) {
        regolith::metal_emu::set_reverse_order(reverse);
        std::vector<float> x(96), out(6 * 96);
        for (int i = 0; i < 96; ++i) x[size_t(i)] = float((i * 37) % 23 - 11);
        run("rg_emu_test_simd", {x.data(), out.data()}, 1, 96, 0);
        bool sums = true, prefix = true, xors = true;
        for (int g = 0; g < 3; ++g) {
            float s = 0;
            for (int l = 0; l < 32; ++l) {
                prefix = prefix && out[size_t(2 * 96 + 32 * g + l)] == s;
                s += x[size_t(32 * g + l)];
                xors = xors && out[size_t(3 * 96 + 32 * g + l)] == x[size_t(32 * g + (l ^ 5))];
            }
            for (int l = 0; l < 32; ++l) sums = sums && out[size_t(32 * g + l)] == s;
        }
        expect(sums, "simd_sum", reverse);
        expect(prefix, "simd_prefix_exclusive_sum", reverse);
        expect(xors, "simd_shuffle_xor", reverse);

        std::vector<float> y(64), z(64);
        for (int i = 0; i < 64; ++i) y[size_t(i)] = float(i);
        uint32_t sync = 1;
        run("rg_emu_test_exchange", {y.data(), z.data(), &sync}, 1, 64, 256);
        bool exchange = true;
        for (int i = 0; i < 64; ++i) exchange = exchange && z[size_t(i)] == y[size_t((i + 1) % 64)];
        expect(exchange, "threadgroup_barrier", reverse);

        std::vector<float> a(64), bt(64), c(64), want(64);
        for (int i = 0; i < 64; ++i) a[size_t(i)] = float(i % 5), bt[size_t(i)] = float(i % 3), c[size_t(i)] = 1.0f;
        for (int i = 0; i < 8; ++i)
            for (int j = 0; j < 8; ++j) {
                float s = 1.0f;
                for (int k = 0; k < 8; ++k) s += a[size_t(8 * i + k)] * bt[size_t(8 * j + k)];
                want[size_t(8 * i + j)] = s;
            }
        run("rg_emu_test_matrix", {a.data(), bt.data(), c.data()}, 1, 32, 0);
        expect(c == want, "simdgroup_multiply_accumulate", reverse);
    }
    std::printf("emulator: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
