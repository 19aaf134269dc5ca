// The conformance suite's internals (core/backend_check.h is its interface): the per-op tolerances, a case's
// inputs and outputs on one backend (Run), and the functions that add each op family's cases.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/buffers.h"
#include "core/dequant.h"
#include "core/errors.h"
#include "core/half.h"
#include "core/types.h"

namespace regolith::check {


// Tolerances (NMSE), each the rounding a valid implementation of the op may differ by from the CPU's:
// data movement and integer results (ids, block selections, routing) must match exactly.
inline constexpr double kExact = 0.0;
// One transcendental per element (exp, tanh, erf, cos / sin): a few ulp, NMSE ~ 1e-13.
inline constexpr double kElementwise = 1e-10;
// Sums of up to a few thousand terms in another order: relative error ~ sqrt(n) eps, NMSE ~ n eps^2 < 1e-10.
inline constexpr double kReduction = 1e-9;
// Products with float weights (F32 / F16 / BF16): dot products over up to 512 terms summed in another order.
inline constexpr double kFloatMatmul = 1e-7;
// Products with quantized weights: a backend may quantize the activations otherwise (8 bits per 32 or per
// 256 elements, f16 weights and activations on tensor cores, or not at all), a relative error up to ~1/254
// per term; ggml's bound for mul_mat.
inline constexpr double kQuantMatmul = 5e-4;
// Chains of the above: attention (softmax over rounded scores), the 70-token delta-rule scan.
inline constexpr double kComposite = 1e-6;
// A reduction's result stored in an attention cache (F16, Q8_0, I8): a value that lands on a rounding
// boundary may round either way, one code step (1/127 of its row's largest, or an f16 ulp) in a row of 16.
inline constexpr double kCacheRounding = 1e-4;

// fp16 scale fields of each block type (byte offsets), for random blocks with moderate scales.
inline std::vector<int> fp16_fields(uint32_t type) {
    switch (type) {
        case RG_TYPE_Q4_0: case RG_TYPE_Q5_0: case RG_TYPE_Q8_0: case RG_TYPE_IQ2_XXS: case RG_TYPE_IQ2_XS:
        case RG_TYPE_IQ2_S: case RG_TYPE_IQ3_XXS: case RG_TYPE_IQ3_S: case RG_TYPE_IQ1_S: case RG_TYPE_IQ4_NL:
        case RG_TYPE_IQ4_XS: case RG_TYPE_Q1_0: case RG_TYPE_Q2_0:
            return {0};
        case RG_TYPE_Q4_1: case RG_TYPE_Q5_1: case RG_TYPE_Q4_K: case RG_TYPE_Q5_K:
            return {0, 2};
        case RG_TYPE_Q2_K:
            return {80, 82};
        case RG_TYPE_Q3_K:
            return {108};
        case RG_TYPE_Q6_K:
            return {208};
        case RG_TYPE_TQ1_0:
            return {52};
        case RG_TYPE_TQ2_0:
            return {64};
        default:
            return {};
    }
}

inline std::string type_name(uint32_t type) { return std::string(type_traits(type)->name); }

class Run {
public:
    Run(Backend& be, uint64_t seed) : be_(be), ws_(be), rng_(seed) {}

    Backend& be() { return be_; }
    std::mt19937_64& rng() { return rng_; }
    int64_t uniform_int(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }

    std::vector<float> floats(int64_t n, float lo = -1.0f, float hi = 1.0f) {
        std::uniform_real_distribution<float> d(lo, hi);
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = d(rng_);
        return v;
    }
    Tensor f32(int64_t rows, int64_t cols, float lo = -1.0f, float hi = 1.0f) {
        return put(RG_TYPE_F32, rows, cols, floats(rows * cols, lo, hi).data());
    }
    Tensor put(uint32_t type, int64_t rows, int64_t cols, const void* data) {
        const Tensor t = ws_.alloc(type, rows, cols);
        be_.write(t, data);
        return t;
    }
    template <class T>
    Tensor ints(uint32_t type, int64_t rows, int64_t cols, const std::vector<T>& v) {
        return put(type, rows, cols, v.data());
    }
    Tensor zeros(uint32_t type, int64_t rows, int64_t cols) {
        const Tensor t = ws_.alloc(type, rows, cols);
        be_.zero(t);
        return t;
    }
    // rows x cols of `type`: F32 / F16 / BF16 from random floats, quantized types random blocks with
    // finite, moderate scales (2^-8 .. 1, either sign); blocks that still decode to non-finite or huge values
    // are zeroed.
    Tensor weights(uint32_t type, int64_t rows, int64_t cols) {
        return put(type, rows, cols, weight_bytes(type, rows, cols).data());
    }
    // weights()' bytes, in host memory.
    std::vector<uint8_t> weight_bytes(uint32_t type, int64_t rows, int64_t cols) {
        const TypeTraits* t = type_traits(type);
        if (cols % t->block_elems != 0)
            throw Error(type_name(type) + " rows of " + std::to_string(cols) + " elements are not whole blocks");
        const int64_t row = type_row_bytes(*t, cols), nb = rows * cols / t->block_elems;
        std::vector<uint8_t> bytes(static_cast<size_t>(rows * row));
        if (type == RG_TYPE_F32 || type == RG_TYPE_F16 || type == RG_TYPE_BF16) {
            const std::vector<float> v = floats(rows * cols);
            for (int64_t i = 0; i < rows * cols; ++i) {
                if (type == RG_TYPE_F32) std::memcpy(&bytes[size_t(4 * i)], &v[size_t(i)], 4);
                const uint16_t h = type == RG_TYPE_F16 ? fp32_to_fp16(v[size_t(i)]) : uint16_t(f32_bits(v[size_t(i)]) >> 16);
                if (type != RG_TYPE_F32) std::memcpy(&bytes[size_t(2 * i)], &h, 2);
            }
            return bytes;
        }
        for (uint8_t& b : bytes) b = uint8_t(rng_() & 0xff);
        std::uniform_real_distribution<float> mag(-8.0f, 0.0f);
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* blk = &bytes[size_t(b * t->block_bytes)];
            const float scale = std::exp2(mag(rng_)) * (rng_() & 1 ? 1.0f : -1.0f);
            const uint16_t h = fp32_to_fp16(scale);
            for (int off : fp16_fields(type)) std::memcpy(blk + off, &h, 2);
            if (type == RG_TYPE_Q8_K) std::memcpy(blk, &scale, 4);
            if (type == RG_TYPE_MXFP4) blk[0] = uint8_t(uniform_int(118, 130));  // E8M0: 2^-9 .. 2^3
            if (type == RG_TYPE_NVFP4)
                for (int j = 0; j < 4; ++j) blk[j] = uint8_t(uniform_int(0x20, 0x40));  // UE4M3 ~2^-4 .. 2^1
        }
        std::vector<float> decoded(static_cast<size_t>(t->block_elems));
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* blk = &bytes[size_t(b * t->block_bytes)];
            dequantize_row(type, blk, decoded.data(), t->block_elems);
            if (std::any_of(decoded.begin(), decoded.end(), [](float v) { return !std::isfinite(v) || std::fabs(v) > 1e4f; }))
                std::memset(blk, 0, size_t(t->block_bytes));
        }
        return bytes;
    }
    // rows x cols of I8 bytes in MemoryUse::Mapped memory (host RAM the backend reads in place), kept for the
    // case's lifetime.
    Tensor mapped(int64_t rows, int64_t cols, const std::vector<uint8_t>& bytes) {
        mapped_.emplace_back(be_, uint64_t(rows * cols), MemoryUse::Mapped);
        auto* host = static_cast<uint8_t*>(be_.host_address(mapped_.back().get()));
        if (!host) throw Error(std::string(be_.name()) + ": mapped memory without a host address");
        std::memcpy(host, bytes.data(), bytes.size());
        return mapped_.back().tensor(RG_TYPE_I8, rows, cols);
    }

    // Records t as an output of the case (read back once the case has run).
    void out(const Tensor& t) { outs_.push_back(t); }

    struct Result {
        std::vector<std::vector<double>> floats;
        std::vector<std::vector<int64_t>> ints;
    };
    Result results() {
        Result r;
        for (const Tensor& t : outs_) {
            const size_t n = size_t(t.rows * t.cols);
            if (t.type == RG_TYPE_Q8_0 || t.type == RG_TYPE_I8) {  // a cache: its values (I8: its codes)
                const TypeTraits& tt = *type_traits(t.type);
                const size_t row = size_t(type_row_bytes(tt, t.cols));
                std::vector<uint8_t> bytes(row * size_t(t.rows));
                be_.read(t, bytes.data());
                std::vector<float> w(n);
                for (int64_t i = 0; i < t.rows; ++i) {
                    const uint8_t* src = &bytes[size_t(i) * row];
                    float* dst = &w[size_t(i * t.cols)];
                    if (t.type == RG_TYPE_I8)
                        for (int64_t j = 0; j < t.cols; ++j) dst[j] = float(int8_t(src[j]));
                    else
                        dequantize_row(t.type, src, dst, t.cols);
                }
                r.floats.emplace_back(w.begin(), w.end());
                continue;
            }
            if (t.type == RG_TYPE_I32 || t.type == RG_TYPE_I64) {
                std::vector<int64_t> v(n);
                if (t.type == RG_TYPE_I32) {
                    std::vector<int32_t> w(n);
                    be_.read(t, w.data());
                    std::copy(w.begin(), w.end(), v.begin());
                } else {
                    be_.read(t, v.data());
                }
                r.ints.push_back(std::move(v));
                continue;
            }
            std::vector<double> v(n);
            if (t.type == RG_TYPE_F16) {
                std::vector<uint16_t> w(n);
                be_.read(t, w.data());
                for (size_t i = 0; i < n; ++i) v[i] = fp16_to_fp32(w[i]);
            } else {
                std::vector<float> w(n);
                be_.read(t, w.data());
                for (size_t i = 0; i < n; ++i) v[i] = w[i];
            }
            r.floats.push_back(std::move(v));
        }
        return r;
    }

private:
    Backend& be_;
    Workspace ws_;
    std::mt19937_64 rng_;
    std::vector<Tensor> outs_;
    std::vector<Buffer> mapped_;
};

struct Case {
    std::string op, shape;
    double tolerance;
    std::function<void(Run&)> run;
    uint32_t cache = RG_TYPE_F32;  // the attention cache type the case stores or reads
    bool expert_slots = false;     // it needs Backend::supports_expert_slots()
};

// Each op family's cases, appended to cs (backend_check.cpp; the attention caches, QSA and dense attention in
// backend_check_attention.cpp).
void add_memory_cases(std::vector<Case>& cs);
void add_matmul_cases(std::vector<Case>& cs);
void add_row_cases(std::vector<Case>& cs);
void add_norm_cases(std::vector<Case>& cs);
void add_rope_cases(std::vector<Case>& cs);
void add_elementwise_cases(std::vector<Case>& cs);
void add_gdn_cases(std::vector<Case>& cs);
void add_qsa_cases(std::vector<Case>& cs);
void add_cache_cases(std::vector<Case>& cs);
void add_attention_cases(std::vector<Case>& cs);
void add_moe_cases(std::vector<Case>& cs);
void add_ple_cases(std::vector<Case>& cs);
void add_vision_cases(std::vector<Case>& cs);

// Every case of the suite, in a fixed order (a case's seed is its index).
std::vector<Case> all_cases();

}  // namespace regolith::check
