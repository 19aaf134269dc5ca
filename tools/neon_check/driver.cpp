// Runs the CPU backend's matmul kernels on cases written by tools/neon_check/run.py, once per available ISA,
// and writes the outputs next to them. Built for arm64 and run under qemu to test the NEON kernels on x86.
//
// case file: uint32 type, int64 rows, cols, ntok, row_bytes; weights; float32 x[ntok][cols]
// output:    <case>.<isa>.out with float32 y[ntok][rows]
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cpu/isa.h"
#include "cpu/kernels.h"

int main(int argc, char** argv) {
    using namespace regolith;
    for (int i = 1; i < argc; ++i) {
        FILE* f = std::fopen(argv[i], "rb");
        if (!f) return 2;
        uint32_t type;
        int64_t dims[4];
        if (std::fread(&type, 4, 1, f) != 1 || std::fread(dims, 8, 4, f) != 4) return 2;
        const int64_t rows = dims[0], cols = dims[1], ntok = dims[2], row_bytes = dims[3];
        std::vector<uint8_t> w(size_t(rows * row_bytes));
        std::vector<float> x(size_t(ntok * cols)), y(size_t(ntok * rows));
        if (std::fread(w.data(), 1, w.size(), f) != w.size() || std::fread(x.data(), 4, x.size(), f) != x.size())
            return 2;
        std::fclose(f);
        for (cpu::Isa isa : cpu::available_isas()) {
            cpu::set_active_isa(isa);
            cpu::matmul(cpu::WeightView{type, w.data(), rows, cols, row_bytes}, x.data(), ntok, y.data());
            const std::string out = std::string(argv[i]) + "." + std::string(cpu::isa_name(isa)) + ".out";
            FILE* o = std::fopen(out.c_str(), "wb");
            if (!o || std::fwrite(y.data(), 4, y.size(), o) != y.size()) return 3;
            std::fclose(o);
        }
    }
    return 0;
}
