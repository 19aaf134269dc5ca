#include "core/backend_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <tuple>

#include "core/buffers.h"
#include "core/dequant.h"
#include "core/errors.h"
#include "core/half.h"
#include "core/quantize.h"
#include "core/types.h"

namespace regolith {

namespace {

// Tolerances (NMSE), each the rounding a valid implementation of the op may differ by from the CPU's:
// data movement and integer results (ids, block selections, routing) must match exactly.
constexpr double kExact = 0.0;
// One transcendental per element (exp, tanh, erf, cos / sin): a few ulp, NMSE ~ 1e-13.
constexpr double kElementwise = 1e-10;
// Sums of up to a few thousand terms in another order: relative error ~ sqrt(n) eps, NMSE ~ n eps^2 < 1e-10.
constexpr double kReduction = 1e-9;
// Products with float weights (F32 / F16 / BF16): dot products over up to 512 terms summed in another order.
constexpr double kFloatMatmul = 1e-7;
// Products with quantized weights: a backend may quantize the activations otherwise (8 bits per 32 or per
// 256 elements, f16 weights and activations on tensor cores, or not at all), a relative error up to ~1/254
// per term; ggml's bound for mul_mat.
constexpr double kQuantMatmul = 5e-4;
// Chains of the above: attention (softmax over rounded scores), the 70-token delta-rule scan.
constexpr double kComposite = 1e-6;
// A reduction's result stored in an attention cache (F16, Q8_0, I8): a value that lands on a rounding
// boundary may round either way, one code step (1/127 of its row's largest, or an f16 ulp) in a row of 16.
constexpr double kCacheRounding = 1e-4;

// fp16 scale fields of each block type (byte offsets), for random blocks with moderate scales.
std::vector<int> fp16_fields(uint32_t type) {
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

std::string type_name(uint32_t type) { return std::string(type_traits(type)->name); }

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
            return put(type, rows, cols, bytes.data());
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
        return put(type, rows, cols, bytes.data());
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
};

struct Case {
    std::string op, shape;
    double tolerance;
    std::function<void(Run&)> run;
    uint32_t cache = RG_TYPE_F32;  // the attention cache type the case stores or reads
};

void add_matmul_cases(std::vector<Case>& cs) {
    for (uint32_t type = 0; type < RG_TYPE_COUNT; ++type) {
        const TypeTraits* t = type_traits(type);
        if (!t || !t->supported) continue;
        const bool fl = type == RG_TYPE_F32 || type == RG_TYPE_F16 || type == RG_TYPE_BF16;
        for (int64_t ntok : {1, 3, 8, 9, 48})
            for (int64_t rows : {16, 37}) {
                const int64_t cols = rows == 16 ? 256 : 512;
                cs.push_back({"matmul", type_name(type) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                                            " ntok " + std::to_string(ntok),
                              fl ? kFloatMatmul : kQuantMatmul, [=](Run& r) {
                                  const Tensor w = r.weights(type, rows, cols), x = r.f32(ntok, cols);
                                  const Tensor y = r.zeros(RG_TYPE_F32, ntok, rows);
                                  r.be().matmul(w, x, y);
                                  r.out(y);
                              }});
            }
    }
    // The matmul contract: y[t][r] depends on W row r and x[t] only. 48 tokens at once against one at a time
    // and 5 at a time, per type; the output is all + 2^40 (all - parts): the product itself where the two
    // agree bit for bit, and off by orders of magnitude where they differ by one ulp.
    for (uint32_t type = 0; type < RG_TYPE_COUNT; ++type) {
        const TypeTraits* t = type_traits(type);
        if (!t || !t->supported) continue;
        const bool fl = type == RG_TYPE_F32 || type == RG_TYPE_F16 || type == RG_TYPE_BF16;
        cs.push_back({"matmul", type_name(type) + " 37x512: 48 tokens at once = 1 and 5 at a time, bit for bit",
                      fl ? kFloatMatmul : kQuantMatmul, [=](Run& r) {
                          const Tensor w = r.weights(type, 37, 512), x = r.f32(48, 512);
                          const Tensor all = r.zeros(RG_TYPE_F32, 48, 37), parts = r.zeros(RG_TYPE_F32, 48, 37);
                          r.be().matmul(w, x, all);
                          for (int64_t t0 = 0; t0 < 48;) {
                              const int64_t n = t0 < 24 ? 1 : std::min<int64_t>(5, 48 - t0);
                              r.be().matmul(w, x.row_range(t0, n), parts.row_range(t0, n));
                              t0 += n;
                          }
                          r.be().unary(parts, Unary::Scale, -1.0f, parts);
                          r.be().add(all, parts, parts);
                          r.be().unary(parts, Unary::Scale, std::ldexp(1.0f, 40), parts);
                          r.be().add(all, parts, all);
                          r.out(all);
                      }});
    }
    // a MoE layer's batch: experts of different types over row ranges of the packed activations
    // Float weights of any row length (the models' small projections: hyper-connection mixes, gates)
    for (uint32_t type : {RG_TYPE_F32, RG_TYPE_F16, RG_TYPE_BF16})
        for (int64_t cols : {8, 20, 100})
            for (int64_t ntok : {1, 9})
                cs.push_back({"matmul", type_name(type) + " 11x" + std::to_string(cols) + " ntok " + std::to_string(ntok),
                              kFloatMatmul, [=](Run& r) {
                                  const Tensor w = r.weights(type, 11, cols), x = r.f32(ntok, cols);
                                  const Tensor y = r.zeros(RG_TYPE_F32, ntok, 11);
                                  r.be().matmul(w, x, y);
                                  r.out(y);
                              }});
    cs.push_back({"matmul", "batch of 6 experts (Q4_K, Q8_0, IQ2_XS) over packed rows", kQuantMatmul, [](Run& r) {
                      const uint32_t types[3] = {RG_TYPE_Q4_K, RG_TYPE_Q8_0, RG_TYPE_IQ2_XS};
                      const int64_t counts[6] = {1, 4, 2, 9, 1, 3};
                      const Tensor xs = r.f32(20, 256), g = r.zeros(RG_TYPE_F32, 20, 48), u = r.zeros(RG_TYPE_F32, 20, 48);
                      std::vector<MatmulJob> jobs;
                      int64_t o = 0;
                      for (int e = 0; e < 6; ++e) {
                          jobs.push_back({r.weights(types[e % 3], 48, 256), xs.row_range(o, counts[e]), g.row_range(o, counts[e])});
                          jobs.push_back({r.weights(types[e % 3], 48, 256), xs.row_range(o, counts[e]), u.row_range(o, counts[e])});
                          o += counts[e];
                      }
                      r.be().matmul(jobs.data(), int64_t(jobs.size()));
                      r.out(g);
                      r.out(u);
                  }});
}

void add_memory_cases(std::vector<Case>& cs) {
    cs.push_back({"copy", "strided views, zero, write", kExact, [](Run& r) {
                      const Tensor a = r.f32(7, 33), b = r.zeros(RG_TYPE_F32, 7, 40);
                      r.be().copy(a.col_range(3, 20), b.col_range(10, 20));
                      r.be().zero(b.row_range(2, 3).col_range(12, 5));
                      const std::vector<float> host = r.floats(5);
                      r.be().write(b.row_range(6, 1).col_range(0, 5), host.data());
                      r.out(b);
                  }});
}

void add_row_cases(std::vector<Case>& cs) {
    // every weight type, so each backend's dequantizer is compared with the CPU's bit for bit
    for (uint32_t type = 0; type < RG_TYPE_COUNT; ++type) {
        const TypeTraits* t = type_traits(type);
        if (!t || !t->supported) continue;
        for (int64_t repeat : {1, 3})
            cs.push_back({"get_rows", type_name(type) + " repeat " + std::to_string(repeat), kExact, [=](Run& r) {
                              const Tensor table = r.weights(type, 50, 256);
                              std::vector<int32_t> ids(9);
                              for (int32_t& i : ids) i = int32_t(r.uniform_int(0, 49));
                              const Tensor out = r.zeros(RG_TYPE_F32, 9, 256 * repeat);
                              r.be().get_rows(table, r.ints(RG_TYPE_I32, 9, 1, ids), repeat == 1 ? 1.0f : 2.5f, repeat, out);
                              r.out(out);
                          }});
    }
    cs.push_back({"gather_rows", "13 of 7 rows", kExact, [](Run& r) {
                      const Tensor x = r.f32(7, 40), out = r.zeros(RG_TYPE_F32, 13, 40);
                      std::vector<int32_t> rows(13);
                      for (int32_t& i : rows) i = int32_t(r.uniform_int(0, 6));
                      r.be().gather_rows(x, r.ints(RG_TYPE_I32, 1, 13, rows), out);
                      r.out(out);
                  }});
    for (int64_t k : {1, 5})
        cs.push_back({"top_k", "k " + std::to_string(k) + " of 300", kExact, [=](Run& r) {
                          const Tensor x = r.f32(4, 300), ids = r.zeros(RG_TYPE_I32, 4, k), v = r.zeros(RG_TYPE_F32, 4, k);
                          r.be().top_k(x, k, ids, v);
                          r.out(ids);
                          r.out(v);
                      }});
}

void add_norm_cases(std::vector<Case>& cs) {
    for (int64_t groups : {0, 1, 3})
        for (int64_t cols : {64, 1000})
            cs.push_back({"rms_norm", std::to_string(cols) + " cols, " + std::to_string(groups) + " weight rows, strided",
                          kReduction, [=](Run& r) {
                              const Tensor wide = r.f32(6, cols + 8, -3.0f, 3.0f), y = r.zeros(RG_TYPE_F32, 6, cols);
                              const Tensor w = groups ? r.f32(groups, cols, 0.5f, 1.5f) : Tensor{};
                              r.be().rms_norm(wide.col_range(8, cols), w, 1e-6f, y);
                              r.out(y);
                          }});
    for (Unary act : {Unary::Sigmoid, Unary::Silu})
        cs.push_back({"rms_norm_gated", act == Unary::Sigmoid ? "sigmoid gate" : "silu gate", kReduction, [=](Run& r) {
                          const Tensor x = r.f32(12, 16), z = r.f32(12, 16, -4.0f, 4.0f), w = r.f32(1, 16);
                          const Tensor y = r.zeros(RG_TYPE_F32, 12, 16);
                          r.be().rms_norm_gated(x, z, w, 1e-6f, act, y);
                          r.out(y);
                      }});
    cs.push_back({"layer_norm", "300 cols", kReduction, [](Run& r) {
                      const Tensor x = r.f32(9, 300, -2.0f, 5.0f), w = r.f32(1, 300), b = r.f32(1, 300);
                      const Tensor y = r.zeros(RG_TYPE_F32, 9, 300);
                      r.be().layer_norm(x, w, b, 1e-6f, y);
                      r.out(y);
                  }});
}

void add_rope_cases(std::vector<Case>& cs) {
    for (int64_t half : {4, 32})
        cs.push_back({"rope", "M-RoPE table, " + std::to_string(2 * half) + " of 64 dims, 4 heads per position",
                      kElementwise, [=](Run& r) {
                          std::vector<int64_t> pos(5 * 3);
                          for (int64_t& p : pos) p = r.uniform_int(0, 5000);
                          std::vector<float> freq(static_cast<size_t>(half));
                          std::vector<int32_t> axis(static_cast<size_t>(half));
                          for (int64_t i = 0; i < half; ++i) {
                              freq[size_t(i)] = 1.0f / std::pow(10000.0f, float(2 * i) / float(2 * half));
                              axis[size_t(i)] = int32_t(i % 3);
                          }
                          const Tensor table = r.zeros(RG_TYPE_F32, 5, 2 * half);
                          r.be().rope_table(r.ints(RG_TYPE_I64, 5, 3, pos), r.put(RG_TYPE_F32, 1, half, freq.data()),
                                            r.ints(RG_TYPE_I32, 1, half, axis), table);
                          const Tensor x = r.f32(20, 64);
                          r.be().rope(x, table, 4);
                          r.out(table);
                          r.out(x);
                      }});
}

void add_elementwise_cases(std::vector<Case>& cs) {
    const std::pair<Unary, const char*> ops[] = {
        {Unary::Silu, "silu"},           {Unary::Sigmoid, "sigmoid"},   {Unary::SiluDiv, "silu_div"},
        {Unary::TwoSigmoidDiv, "2sigmoid_div"}, {Unary::GeluTanhExp, "gelu_tanh_exp"}, {Unary::GeluErf, "gelu_erf"},
        {Unary::Softcap, "softcap"},     {Unary::Scale, "scale"}};
    for (const auto& [op, name] : ops)
        cs.push_back({"unary", name, kElementwise, [op = op](Run& r) {
                          const Tensor x = r.f32(5, 77, -30.0f, 30.0f), y = r.zeros(RG_TYPE_F32, 5, 77);
                          r.be().unary(x, op, 3.0f, y);
                          r.out(y);
                      }});
    for (Glu act : {Glu::Silu, Glu::GeluTanh})
        cs.push_back({"glu", act == Glu::Silu ? "silu" : "gelu_tanh", kElementwise, [=](Run& r) {
                          const Tensor g = r.f32(6, 50, -8.0f, 8.0f), u = r.f32(6, 50), y = r.zeros(RG_TYPE_F32, 6, 50);
                          r.be().glu(g, u, act, y);
                          r.out(y);
                      }});
    for (bool broadcast : {false, true})
        cs.push_back({"add", broadcast ? "one row broadcast" : "same shape", kExact, [=](Run& r) {
                          const Tensor a = r.f32(6, 50), b = r.f32(broadcast ? 1 : 6, 50), y = r.zeros(RG_TYPE_F32, 6, 50);
                          r.be().add(a, b, y);
                          r.out(y);
                      }});
    for (int64_t hc : {3, 4}) {
        cs.push_back({"hc_mix", std::to_string(hc) + " streams of 40", kReduction, [=](Run& r) {
                          const Tensor g = r.f32(5, hc * 40, -4.0f, 4.0f), xn = r.f32(5, hc * 40);
                          const Tensor m = r.zeros(RG_TYPE_F32, 5, 40);
                          r.be().hc_mix(g, xn, hc, m);
                          r.out(m);
                      }});
        cs.push_back({"hc_write", std::to_string(hc) + " streams of 40", kElementwise, [=](Run& r) {
                          const Tensor out = r.f32(5, 40), w = r.f32(5, hc, 0.0f, 2.0f), s = r.f32(5, hc * 40);
                          r.be().hc_write(out, w, hc, s);
                          r.out(s);
                      }});
    }
}

constexpr GdnDims kGdn{2, 4, 16, 16};

void add_gdn_cases(std::vector<Case>& cs) {
    for (int64_t K : {1, 4})
        cs.push_back({"ssm_conv", "kernel " + std::to_string(K) + ", 2 sequences, per-token states", kReduction,
                      [=](Run& r) {
                          const int64_t cd = kGdn.conv_dim(), hist = K - 1;
                          const Tensor x = r.f32(6, cd), wt = r.f32(K, cd), out = r.zeros(RG_TYPE_F32, 6, cd);
                          const Tensor s0 = r.f32(hist, cd), s1 = r.f32(hist, cd);
                          const Tensor after = r.zeros(RG_TYPE_F32, 5, hist * cd);
                          const ConvSeq seqs[] = {{s0, after, 0, 5}, {s1, Tensor{}, 5, 1}};
                          r.be().ssm_conv(x, wt, seqs, 2, out);
                          r.out(out), r.out(s0), r.out(s1), r.out(after);
                      }});
    cs.push_back({"gdn_prepare", "2 k heads, 4 v heads of 16", kElementwise, [](Run& r) {
                      const Tensor qkv = r.f32(7, kGdn.conv_dim()), g = r.f32(7, 4, -3.0f, 3.0f), beta = r.f32(7, 4, -3.0f, 3.0f);
                      const Tensor a = r.f32(1, 4, -2.0f, -0.1f), dt = r.f32(1, 4);
                      r.be().gdn_prepare(qkv, g, beta, a, dt, kGdn);
                      r.out(qkv), r.out(g), r.out(beta);
                  }});
    const auto scan = [](Run& r, int64_t ntok, bool after, int64_t n_seqs) {
        const int64_t S = kGdn.n_v_heads * kGdn.k_dim * kGdn.v_dim, rows = ntok * n_seqs;
        const Tensor qkv = r.f32(rows, kGdn.conv_dim(), -0.3f, 0.3f), g = r.f32(rows, 4, -0.5f, 0.0f);
        const Tensor beta = r.f32(rows, 4, 0.0f, 1.0f), out = r.zeros(RG_TYPE_F32, rows, kGdn.value_dim());
        std::vector<GdnSeq> seqs;
        for (int64_t s = 0; s < n_seqs; ++s) {
            const Tensor st = r.f32(1, S, -0.5f, 0.5f);
            const Tensor aft = after ? r.zeros(RG_TYPE_F32, ntok, S) : Tensor{};
            seqs.push_back({st, aft, s * ntok, ntok});
            r.out(st);
            if (after) r.out(aft);
        }
        r.be().gdn_scan(qkv, g, beta, seqs.data(), n_seqs, kGdn, 64, out);
        r.out(out);
    };
    cs.push_back({"gdn_scan", "1 token (recurrent step)", kReduction, [=](Run& r) { scan(r, 1, false, 1); }});
    cs.push_back({"gdn_scan", "70 tokens (chunks of 64)", kComposite, [=](Run& r) { scan(r, 70, false, 1); }});
    cs.push_back({"gdn_scan", "5 tokens with per-token states", kReduction, [=](Run& r) { scan(r, 5, true, 1); }});
    cs.push_back({"gdn_scan", "2 sequences of 9 tokens", kComposite, [=](Run& r) { scan(r, 9, false, 2); }});
}

constexpr QsaDims kQsa{4, 2, 16, 3, 16, 4, 2, 8, 1e-6f};

// A QSA sequence with random keys for its first n0 + ntok tokens (the step's already appended).
QsaSeq qsa_seq(Run& r, int64_t n0, int64_t t0, int64_t ntok) {
    const int64_t cap = 48;
    std::vector<int64_t> pos(static_cast<size_t>(cap * 3));
    for (int64_t i = 0; i < cap; ++i) pos[size_t(3 * i)] = i, pos[size_t(3 * i + 1)] = i / 3, pos[size_t(3 * i + 2)] = i % 5;
    return {r.f32(cap * kQsa.n_head_kv, kQsa.head_dim), r.f32(cap * kQsa.n_head_kv, kQsa.head_dim),
            r.f32(cap, kQsa.index_head_dim), r.f32(cap / kQsa.ratio, kQsa.index_head_dim),
            r.ints(RG_TYPE_I64, cap, 3, pos), n0, t0, ntok};
}

// rows x cols of random floats stored as an attention cache of `type` on the host (quantize.h's quantizers,
// the ones the CPU's store_rows runs), with its I8 scales [rows][1] (else empty).
std::pair<Tensor, Tensor> cache_rows(Run& r, uint32_t type, int64_t rows, int64_t cols) {
    const std::vector<float> x = r.floats(rows * cols);
    if (type == RG_TYPE_F32) return {r.put(type, rows, cols, x.data()), Tensor{}};
    if (type == RG_TYPE_I8) {
        std::vector<int8_t> q(x.size());
        std::vector<float> s(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i)
            s[size_t(i)] = quantize_i8_row(&x[size_t(i * cols)], &q[size_t(i * cols)], cols);
        return {r.put(type, rows, cols, q.data()), r.put(RG_TYPE_F32, rows, 1, s.data())};
    }
    const size_t row = quantized_row_bytes(type, cols);
    std::vector<uint8_t> bytes(row * size_t(rows));
    for (int64_t i = 0; i < rows; ++i)
        quantize_row(type, &x[size_t(i * cols)], &bytes[size_t(i) * row], cols);
    return {r.put(type, rows, cols, bytes.data()), Tensor{}};
}

// qsa_seq with its four caches of `type` (head dims of 32: whole Q8_0 blocks).
constexpr QsaDims kQsaCache{4, 2, 32, 3, 32, 4, 2, 8, 1e-6f};
QsaSeq qsa_cache_seq(Run& r, uint32_t type, int64_t n0, int64_t t0, int64_t ntok) {
    const QsaDims& d = kQsaCache;
    const int64_t cap = 48;
    std::vector<int64_t> pos(static_cast<size_t>(cap * 3));
    for (int64_t i = 0; i < cap; ++i)
        pos[size_t(3 * i)] = i, pos[size_t(3 * i + 1)] = i / 3, pos[size_t(3 * i + 2)] = i % 5;
    QsaSeq s;
    std::tie(s.k, s.k_scale) = cache_rows(r, type, cap * d.n_head_kv, d.head_dim);
    std::tie(s.v, s.v_scale) = cache_rows(r, type, cap * d.n_head_kv, d.head_dim);
    std::tie(s.index_k, s.index_k_scale) = cache_rows(r, type, cap, d.index_head_dim);
    std::tie(s.block_k, s.block_k_scale) = cache_rows(r, type, cap / d.ratio, d.index_head_dim);
    s.pos = r.ints(RG_TYPE_I64, cap, 3, pos);
    s.n0 = n0, s.t0 = t0, s.ntok = ntok;
    return s;
}

void add_cache_cases(std::vector<Case>& cs) {
    for (uint32_t type : {RG_TYPE_F32, RG_TYPE_F16, RG_TYPE_Q8_0, RG_TYPE_I8}) {
        const std::string name = cache_type_name(type);
        cs.push_back({"store_rows", name + ", 37 rows of 64, magnitudes 2^-20 .. 2^10, a zero row", kExact,
                      [=](Run& r) {
                          std::vector<float> x = r.floats(37 * 64);
                          for (int64_t i = 0; i < 37; ++i)
                              for (int64_t j = 0; j < 64; ++j)
                                  x[size_t(i * 64 + j)] *= std::exp2(float(i % 31 - 20));
                          std::fill_n(x.begin() + 5 * 64, 64, 0.0f);
                          const Tensor dst = r.zeros(type, 37, 64);
                          const Tensor scale = type == RG_TYPE_I8 ? r.zeros(RG_TYPE_F32, 37, 1) : Tensor{};
                          r.be().store_rows(r.put(RG_TYPE_F32, 37, 64, x.data()), dst, scale);
                          r.out(dst);
                          if (scale) r.out(scale);
                      },
                      type});
        if (type == RG_TYPE_F32) continue;  // the F32 QSA cases are below
        const auto tables = [](Run& r) {
            const int64_t half = kQsaCache.n_rot / 2;
            std::vector<float> freq(static_cast<size_t>(half));
            std::vector<int32_t> axis(static_cast<size_t>(half));
            for (int64_t i = 0; i < half; ++i)
                freq[size_t(i)] = 1.0f / std::pow(1e4f, float(2 * i) / float(kQsaCache.n_rot)),
                axis[size_t(i)] = int32_t(i % 3);
            return std::make_pair(r.put(RG_TYPE_F32, 1, half, freq.data()),
                                  r.ints(RG_TYPE_I32, 1, half, axis));
        };
        cs.push_back({"qsa_pool", name + " caches, 2 sequences completing blocks", kCacheRounding,
                      [=](Run& r) {
                          const QsaSeq seqs[] = {qsa_cache_seq(r, type, 37, 0, 5),
                                                 qsa_cache_seq(r, type, 2, 5, 9)};
                          const auto [freq, axis] = tables(r);
                          r.be().qsa_pool(seqs, 2, r.f32(1, kQsaCache.index_head_dim), freq, axis, kQsaCache);
                          for (const QsaSeq& s : seqs) {
                              r.out(s.block_k);
                              if (s.block_k_scale) r.out(s.block_k_scale);
                          }
                      },
                      type});
        cs.push_back({"qsa_select", name + " caches, 2 sequences, top 2 of up to 10 blocks", kExact,
                      [=](Run& r) {
                          const QsaSeq seqs[] = {qsa_cache_seq(r, type, 37, 0, 5),
                                                 qsa_cache_seq(r, type, 2, 5, 3)};
                          const Tensor iq = r.f32(8, kQsaCache.index_n_head * kQsaCache.index_head_dim);
                          const Tensor sel = r.zeros(RG_TYPE_I32, 8, kQsaCache.topk),
                                       n_sel = r.zeros(RG_TYPE_I32, 1, 8);
                          r.be().qsa_select(iq, seqs, 2, kQsaCache, sel, n_sel);
                          r.out(sel), r.out(n_sel);
                      },
                      type});
        cs.push_back(
            {"qsa_attend", name + " caches, 2 sequences, selected blocks and tails", kComposite,
             [=](Run& r) {
                 const QsaDims& d = kQsaCache;
                 const QsaSeq seqs[] = {qsa_cache_seq(r, type, 37, 0, 5), qsa_cache_seq(r, type, 2, 5, 3)};
                 std::vector<int32_t> sel(static_cast<size_t>(8 * d.topk)), n_sel(8);
                 for (int64_t t = 0; t < 8; ++t) {
                     const QsaSeq& s = t < 5 ? seqs[0] : seqs[1];
                     const int64_t nb = (s.n0 + (t - s.t0) + 1) / d.ratio, k = std::min(d.topk, nb);
                     n_sel[size_t(t)] = int32_t(k);
                     if (k >= 1) sel[size_t(t * d.topk)] = int32_t(k == 2 ? 0 : nb - 1);
                     if (k == 2) sel[size_t(t * d.topk + 1)] = int32_t(nb - 1);
                 }
                 const int64_t rows = 8 * d.n_head;
                 const Tensor q = r.f32(rows, d.head_dim), gate = r.f32(rows, d.head_dim, -3.0f, 3.0f);
                 const Tensor out = r.zeros(RG_TYPE_F32, rows, d.head_dim);
                 r.be().qsa_attend(q, gate, r.ints(RG_TYPE_I32, 8, d.topk, sel),
                                   r.ints(RG_TYPE_I32, 1, 8, n_sel), seqs, 2, d, out);
                 r.out(out);
             },
             type});
    }
}

void add_qsa_cases(std::vector<Case>& cs) {
    const auto tables = [](Run& r) {
        const int64_t half = kQsa.n_rot / 2;
        std::vector<float> freq(static_cast<size_t>(half));
        std::vector<int32_t> axis(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i) freq[size_t(i)] = 1.0f / std::pow(1e4f, float(2 * i) / float(kQsa.n_rot)), axis[size_t(i)] = int32_t(i % 3);
        return std::make_pair(r.put(RG_TYPE_F32, 1, half, freq.data()), r.ints(RG_TYPE_I32, 1, half, axis));
    };
    cs.push_back({"qsa_pool", "2 sequences completing blocks", kReduction, [=](Run& r) {
                      const QsaSeq seqs[] = {qsa_seq(r, 37, 0, 5), qsa_seq(r, 2, 5, 9)};
                      const auto [freq, axis] = tables(r);
                      r.be().qsa_pool(seqs, 2, r.f32(1, kQsa.index_head_dim), freq, axis, kQsa);
                      r.out(seqs[0].block_k), r.out(seqs[1].block_k);
                  }});
    cs.push_back({"qsa_select", "2 sequences, top 2 of up to 10 blocks", kExact, [](Run& r) {
                      const QsaSeq seqs[] = {qsa_seq(r, 37, 0, 5), qsa_seq(r, 2, 5, 3)};
                      const Tensor iq = r.f32(8, kQsa.index_n_head * kQsa.index_head_dim);
                      const Tensor sel = r.zeros(RG_TYPE_I32, 8, kQsa.topk), n_sel = r.zeros(RG_TYPE_I32, 1, 8);
                      r.be().qsa_select(iq, seqs, 2, kQsa, sel, n_sel);
                      r.out(sel), r.out(n_sel);
                  }});
    // Many blocks (more than a GPU threadgroup takes at once) in runs of 3 with the same pooled key, so the
    // top 40 must break ties the CPU's way (the lower block) at the cut and inside the selection.
    cs.push_back({"qsa_select", "598 blocks in runs of 3 equal keys, top 40, ties", kExact, [](Run& r) {
                      constexpr QsaDims d{2, 1, 16, 2, 12, 2, 40, 4, 1e-6f};
                      const int64_t cap = 1200, n0 = 1196, ntok = 3, nb = cap / d.ratio;
                      const std::vector<float> distinct = r.floats((nb / 3 + 1) * d.index_head_dim);
                      std::vector<float> keys(static_cast<size_t>(nb * d.index_head_dim));
                      for (int64_t b = 0; b < nb; ++b)
                          std::copy_n(&distinct[size_t(b / 3 * d.index_head_dim)], d.index_head_dim,
                                      &keys[size_t(b * d.index_head_dim)]);
                      const QsaSeq seq{r.f32(cap * d.n_head_kv, d.head_dim), r.f32(cap * d.n_head_kv, d.head_dim),
                                       r.f32(cap, d.index_head_dim), r.put(RG_TYPE_F32, nb, d.index_head_dim, keys.data()),
                                       r.zeros(RG_TYPE_I64, cap, 3), n0, 0, ntok};
                      const Tensor iq = r.f32(ntok, d.index_n_head * d.index_head_dim);
                      const Tensor sel = r.zeros(RG_TYPE_I32, ntok, d.topk), n_sel = r.zeros(RG_TYPE_I32, 1, ntok);
                      r.be().qsa_select(iq, &seq, 1, d, sel, n_sel);
                      r.out(sel), r.out(n_sel);
                  }});
    cs.push_back({"qsa_attend", "2 sequences, selected blocks and tails", kComposite, [](Run& r) {
                      const QsaSeq seqs[] = {qsa_seq(r, 37, 0, 5), qsa_seq(r, 2, 5, 3)};
                      std::vector<int32_t> sel(static_cast<size_t>(8 * kQsa.topk)), n_sel(8);
                      for (int64_t t = 0; t < 8; ++t) {
                          const QsaSeq& s = t < 5 ? seqs[0] : seqs[1];
                          const int64_t nb = (s.n0 + (t - s.t0) + 1) / kQsa.ratio, k = std::min(kQsa.topk, nb);
                          n_sel[size_t(t)] = int32_t(k);
                          // the first and the last complete block (ascending, as qsa_select gives them)
                          if (k >= 1) sel[size_t(t * kQsa.topk)] = int32_t(k == 2 ? 0 : nb - 1);
                          if (k == 2) sel[size_t(t * kQsa.topk + 1)] = int32_t(nb - 1);
                      }
                      const int64_t rows = 8 * kQsa.n_head;
                      const Tensor q = r.f32(rows, kQsa.head_dim), gate = r.f32(rows, kQsa.head_dim, -3.0f, 3.0f);
                      const Tensor out = r.zeros(RG_TYPE_F32, rows, kQsa.head_dim);
                      r.be().qsa_attend(q, gate, r.ints(RG_TYPE_I32, 8, kQsa.topk, sel), r.ints(RG_TYPE_I32, 1, 8, n_sel),
                                        seqs, 2, kQsa, out);
                      r.out(out);
                  }});
    // Flash-Next's attention heads (16 of 256, 2 KV heads) over a few hundred keys: 16 selected blocks and a tail
    cs.push_back({"qsa_attend", "head_dim 256, 8 query heads per KV head, 259 keys", kComposite, [](Run& r) {
                      constexpr QsaDims d{16, 2, 256, 1, 16, 16, 16, 8, 1e-6f};
                      const int64_t cap = 320, n0 = 290, ntok = 2;
                      const QsaSeq seq{r.f32(cap * d.n_head_kv, d.head_dim), r.f32(cap * d.n_head_kv, d.head_dim),
                                       r.f32(cap, d.index_head_dim), r.f32(cap / d.ratio, d.index_head_dim),
                                       r.zeros(RG_TYPE_I64, cap, 3), n0, 0, ntok};
                      std::vector<int32_t> sel(static_cast<size_t>(ntok * d.topk)), n_sel(ntok, int32_t(d.topk));
                      for (int64_t t = 0; t < ntok; ++t)
                          for (int64_t b = 0; b < d.topk; ++b) sel[size_t(t * d.topk + b)] = int32_t(b + b / 8);
                      const int64_t rows = ntok * d.n_head;
                      const Tensor q = r.f32(rows, d.head_dim), gate = r.f32(rows, d.head_dim, -3.0f, 3.0f);
                      const Tensor out = r.zeros(RG_TYPE_F32, rows, d.head_dim);
                      r.be().qsa_attend(q, gate, r.ints(RG_TYPE_I32, ntok, d.topk, sel), r.ints(RG_TYPE_I32, 1, ntok, n_sel),
                                        &seq, 1, d, out);
                      r.out(out);
                  }});
}

void add_attention_cases(std::vector<Case>& cs) {
    for (uint32_t type : {RG_TYPE_F32, RG_TYPE_F16})
        for (int64_t window : {0, 8})
            cs.push_back({"attention", type_name(type) + " cache, GQA 4/2, window " + std::to_string(window) + ", 2 sequences",
                          kComposite, [=](Run& r) {
                              const int64_t KV = 2, H = 4, D = 16, cap = 64;
                              std::vector<KvSeq> seqs;
                              for (auto [n0, t0, ntok] : {std::array<int64_t, 3>{20, 0, 5}, std::array<int64_t, 3>{0, 5, 3}}) {
                                  const Tensor k = r.weights(type, KV * cap, D), vt = r.weights(type, KV * D, cap);
                                  seqs.push_back({k, vt, n0, t0, ntok});
                              }
                              const Tensor kn = r.f32(8, KV * D), vn = r.f32(8, KV * D);
                              r.be().kv_append(kn, vn, seqs.data(), 2, KV);
                              const Tensor q = r.f32(8, H * D), out = r.zeros(RG_TYPE_F32, 8, H * D);
                              r.be().attention(q, seqs.data(), 2, {H, KV, D, window, 0.25f}, out);
                              for (const KvSeq& s : seqs) r.out(s.k), r.out(s.vt);
                              r.out(out);
                          }});
    // Q8_0 / I8 caches: key and value rows
    for (uint32_t type : {RG_TYPE_Q8_0, RG_TYPE_I8})
        for (int64_t window : {0, 8})
            cs.push_back({"attention",
                          std::string(cache_type_name(type)) + " cache, GQA 4/2, window " +
                              std::to_string(window) + ", 2 sequences",
                          kComposite,
                          [=](Run& r) {
                              const int64_t KV = 2, H = 4, D = 32, cap = 64;
                              std::vector<KvSeq> seqs;
                              for (auto [n0, t0, ntok] :
                                   {std::array<int64_t, 3>{20, 0, 5}, std::array<int64_t, 3>{0, 5, 3}}) {
                                  KvSeq s{};
                                  std::tie(s.k, s.k_scale) = cache_rows(r, type, KV * cap, D);
                                  std::tie(s.v, s.v_scale) = cache_rows(r, type, KV * cap, D);
                                  s.n0 = n0, s.t0 = t0, s.ntok = ntok;
                                  seqs.push_back(s);
                              }
                              const Tensor kn = r.f32(8, KV * D), vn = r.f32(8, KV * D);
                              r.be().kv_append(kn, vn, seqs.data(), 2, KV);
                              const Tensor q = r.f32(8, H * D), out = r.zeros(RG_TYPE_F32, 8, H * D);
                              r.be().attention(q, seqs.data(), 2, {H, KV, D, window, 0.25f}, out);
                              for (const KvSeq& s : seqs) {
                                  r.out(s.k), r.out(s.v);
                                  if (s.k_scale) r.out(s.k_scale), r.out(s.v_scale);
                              }
                              r.out(out);
                          },
                          type});
    // gemma3's heads (head_dim 256) over a few hundred keys
    for (uint32_t type : {RG_TYPE_F32, RG_TYPE_F16})
        cs.push_back({"attention", type_name(type) + " cache, head_dim 256, 2 tokens after 300", kComposite, [=](Run& r) {
                          const int64_t KV = 1, H = 4, D = 256, cap = 320;
                          const KvSeq seq{r.weights(type, KV * cap, D), r.weights(type, KV * D, cap), 300, 0, 2};
                          r.be().kv_append(r.f32(2, KV * D), r.f32(2, KV * D), &seq, 1, KV);
                          const Tensor q = r.f32(2, H * D), out = r.zeros(RG_TYPE_F32, 2, H * D);
                          r.be().attention(q, &seq, 1, {H, KV, D, 0, 0.0625f}, out);
                          r.out(out);
                      }});
}

void add_moe_cases(std::vector<Case>& cs) {
    for (int mode = 0; mode < 3; ++mode)
        cs.push_back({"moe_route", mode == 0 ? "top 4 of 16, renormalised" : mode == 1 ? "not renormalised" : "MoCE bonus 2, protect 2",
                      kElementwise, [=](Run& r) {  // ids exact (integer outputs always are), weights an exp each
                          const Tensor logits = r.f32(6, 16, -4.0f, 4.0f);
                          std::vector<int8_t> mask(16);
                          for (int8_t& m : mask) m = int8_t(r.uniform_int(0, 1));
                          const Tensor resident = mode == 2 ? r.ints(RG_TYPE_I8, 1, 16, mask) : Tensor{};
                          const Tensor ids = r.zeros(RG_TYPE_I32, 6, 4), w = r.zeros(RG_TYPE_F32, 6, 4);
                          r.be().moe_route(logits, resident, {4, mode != 1, 2.0f, 2}, ids, w);
                          r.out(ids), r.out(w);
                      }});
    for (uint32_t type : {RG_TYPE_Q8_0, RG_TYPE_IQ2_XS})
        for (bool shared : {false, true})
            cs.push_back({"moe_experts", type_name(type) + " experts, top 3 of 8" + (shared ? ", shared expert" : ""),
                          kQuantMatmul, [=](Run& r) {
                              const int64_t ntok = 6, h = 256, ff = 256, ne = 8, k = 3, fs = 256;
                              std::vector<int32_t> ids;
                              std::vector<int32_t> all(static_cast<size_t>(ne));
                              for (int64_t t = 0; t < ntok; ++t) {
                                  std::iota(all.begin(), all.end(), 0);
                                  std::shuffle(all.begin(), all.end(), r.rng());
                                  ids.insert(ids.end(), all.begin(), all.begin() + k);
                              }
                              const ExpertSet experts{r.weights(type, ne * ff, h), r.weights(type, ne * ff, h),
                                                      r.weights(type, ne * h, ff), ne};
                              const Tensor x = r.f32(ntok, h), w = r.f32(ntok, k, 0.0f, 1.0f), y = r.zeros(RG_TYPE_F32, ntok, h);
                              const SharedExpert sh{r.f32(ntok, fs), r.f32(ntok, fs), r.weights(type, h, fs), r.f32(ntok, 1)};
                              r.be().moe_experts(x, r.ints(RG_TYPE_I32, ntok, k, ids), w, experts, shared ? &sh : nullptr, y);
                              r.out(y);
                          }});
    for (bool shared : {false, true})
        cs.push_back({"moe_combine", shared ? "with the shared expert" : "routed only", kElementwise, [=](Run& r) {
                          const int64_t ntok = 5, k = 3, rows = ntok * k;
                          std::vector<int32_t> pairs(static_cast<size_t>(rows));
                          std::iota(pairs.begin(), pairs.end(), 0);
                          std::shuffle(pairs.begin(), pairs.end(), r.rng());
                          const Tensor ys = r.f32(rows, 24), w = r.f32(ntok, k, 0.0f, 1.0f), y = r.zeros(RG_TYPE_F32, ntok, 24);
                          const Tensor sh = shared ? r.f32(ntok, 24) : Tensor{}, sg = shared ? r.f32(ntok, 1) : Tensor{};
                          r.be().moe_combine(ys, r.ints(RG_TYPE_I32, 1, rows, pairs), w, sh, sg, y);
                          r.out(y);
                      }});
}

void add_ple_cases(std::vector<Case>& cs) {
    cs.push_back({"ple_gate", "3 streams of 32", kReduction, [](Run& r) {
                      const int64_t C = 3 * 32;
                      const Tensor key = r.f32(4, C), q = r.f32(4, C), v = r.f32(4, 32);
                      const Tensor gated = r.zeros(RG_TYPE_F32, 4, C), normed = r.zeros(RG_TYPE_F32, 4, C);
                      r.be().ple_gate(key, q, v, r.f32(1, C), r.f32(1, C), r.f32(1, C), 3, 1e-6f, gated, normed);
                      r.out(gated), r.out(normed);
                  }});
    cs.push_back({"ple_conv", "kernel 4, dilation 3, 2 sequences", kReduction, [](Run& r) {
                      const int64_t C = 48, K = 4, dil = 3, hist = (K - 1) * dil;
                      const Tensor normed = r.f32(7, C), w = r.f32(C, K), out = r.f32(7, C);
                      const Tensor s0 = r.f32(hist, C), s1 = r.f32(hist, C);
                      const PleConvSeq seqs[] = {{s0, 0, 2}, {s1, 2, 5}};
                      r.be().ple_conv(normed, w, dil, seqs, 2, out);
                      r.out(out), r.out(s0), r.out(s1);
                  }});
}

void add_vision_cases(std::vector<Case>& cs) {
    cs.push_back({"add_interpolated", "4 taps of a 36-row grid", kReduction, [](Run& r) {
                      std::vector<int32_t> idx(10 * 4);
                      for (int32_t& i : idx) i = int32_t(r.uniform_int(0, 35));
                      const Tensor table = r.f32(36, 32), w = r.f32(10, 4, 0.0f, 1.0f), x = r.f32(10, 32);
                      r.be().add_interpolated(table, r.ints(RG_TYPE_I32, 10, 4, idx), w, x);
                      r.out(x);
                  }});
    for (int64_t hp : {16, 32})
        cs.push_back({"vision_qkv", "2 heads of 16, q/k padded to " + std::to_string(hp), kElementwise, [=](Run& r) {
                          const int64_t n = 9, nh = 2, hd = 16;
                          const Tensor qkv = r.f32(n, 3 * nh * hd), table = r.f32(n, hd);
                          const Tensor q = r.f32(nh * n, hp), k = r.f32(nh * n, hp), vt = r.zeros(RG_TYPE_F32, nh * hd, n);
                          r.be().vision_qkv(qkv, table, nh, q, k, vt);
                          r.out(q), r.out(k), r.out(vt);
                      }});
    cs.push_back({"softmax_scaled", "rows of 37", kReduction, [](Run& r) {
                      const Tensor x = r.f32(6, 37, -20.0f, 20.0f);
                      r.be().softmax_scaled(x, 0.3f);
                      r.out(x);
                  }});
}

std::vector<Case> all_cases() {
    std::vector<Case> cs;
    add_memory_cases(cs);
    add_matmul_cases(cs);
    add_row_cases(cs);
    add_norm_cases(cs);
    add_rope_cases(cs);
    add_elementwise_cases(cs);
    add_gdn_cases(cs);
    add_qsa_cases(cs);
    add_cache_cases(cs);
    add_attention_cases(cs);
    add_moe_cases(cs);
    add_ple_cases(cs);
    add_vision_cases(cs);
    return cs;
}

// sum (y - ref)^2 / sum ref^2 over the elements that differ (those that agree count neither way, so a few wrong
// elements are not diluted by many right ones); NaN on one side only is infinitely wrong.
double nmse(const std::vector<double>& y, const std::vector<double>& ref) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
        const double d = y[i] - ref[i];
        if (std::isnan(y[i]) != std::isnan(ref[i])) return INFINITY;
        if (std::isnan(ref[i]) || y[i] == ref[i]) continue;
        err += d * d;
        norm += ref[i] * ref[i];
    }
    return err == 0.0 ? 0.0 : err / (norm > 0.0 ? norm : 1.0);
}

}  // namespace

std::vector<OpCheck> check_backend(Backend& be, Backend& ref, const std::string& filter, uint64_t seed,
                                   uint64_t ref_seed) {
    if (ref_seed == 0) ref_seed = seed;
    std::vector<OpCheck> out;
    uint64_t index = 0;
    for (const Case& c : all_cases()) {
        ++index;
        if (c.op.find(filter) == std::string::npos) continue;
        OpCheck r{c.op, c.shape, 0.0, c.tolerance, false, "", ""};
        if (!be.supports_cache(c.cache)) {
            r.passed = true;
            r.skipped = std::string("the backend has no kernels for ") + cache_type_name(c.cache) +
                        " attention caches";
            out.push_back(std::move(r));
            continue;
        }
        try {
            Run a(be, seed * 1000003 + index), b(ref, ref_seed * 1000003 + index);
            c.run(a);
            c.run(b);
            const Run::Result ra = a.results(), rb = b.results();
            for (size_t i = 0; i < ra.floats.size(); ++i) r.nmse = std::max(r.nmse, nmse(ra.floats[i], rb.floats[i]));
            for (size_t i = 0; i < ra.ints.size() && r.error.empty(); ++i)
                for (size_t j = 0; j < ra.ints[i].size(); ++j)
                    if (ra.ints[i][j] != rb.ints[i][j]) {
                        r.error = "integer output " + std::to_string(i) + " differs at " + std::to_string(j) + ": " +
                                  std::to_string(ra.ints[i][j]) + " vs " + std::to_string(rb.ints[i][j]);
                        break;
                    }
            r.passed = r.error.empty() && r.nmse <= r.tolerance;
        } catch (const std::exception& e) {
            r.error = e.what();
        }
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace regolith
