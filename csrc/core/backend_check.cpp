#include "core/backend_check.h"

#include "core/backend_check_cases.h"

namespace regolith {

namespace check {

namespace {

bool float_type(uint32_t type) { return type == RG_TYPE_F32 || type == RG_TYPE_F16 || type == RG_TYPE_BF16; }

// 48 tokens at once against one at a time and 5 at a time, 37 rows of `cols`; the output is
// all + 2^40 (all - parts): the product itself where the two agree bit for bit, and off by orders of
// magnitude where they differ by one ulp.
void add_batch_invariance_case(std::vector<Case>& cs, uint32_t type, int64_t cols) {
    cs.push_back({"matmul", type_name(type) + " 37x" + std::to_string(cols) + ": 48 tokens at once = 1 and 5 at a time, bit for bit",
                  float_type(type) ? kFloatMatmul : kQuantMatmul, [=](Run& r) {
                      const Tensor w = r.weights(type, 37, cols), x = r.f32(48, cols);
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

}  // namespace

void add_matmul_cases(std::vector<Case>& cs) {
    for (uint32_t type = 0; type < RG_TYPE_COUNT; ++type) {
        const TypeTraits* t = type_traits(type);
        if (!t || !t->supported) continue;
        const bool fl = float_type(type);
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
    // The matmul contract: y[t][r] depends on W row r and x[t] only, per type.
    for (uint32_t type = 0; type < RG_TYPE_COUNT; ++type) {
        const TypeTraits* t = type_traits(type);
        if (t && t->supported) add_batch_invariance_case(cs, type, 512);
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
    for (const auto& [act, name] : {std::pair{Glu::Silu, "silu"}, {Glu::GeluTanh, "gelu_tanh"}, {Glu::Sigmoid, "sigmoid"},
                                    {Glu::SwigluOai, "swiglu_oai (both clamps reached)"}})
        cs.push_back({"glu", name, kElementwise, [act = act](Run& r) {
                          const float ur = act == Glu::SwigluOai ? 10.0f : 1.0f;
                          const Tensor g = r.f32(6, 50, -8.0f, 8.0f), u = r.f32(6, 50, -ur, ur), y = r.zeros(RG_TYPE_F32, 6, 50);
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
    const auto scan = [](Run& r, int64_t ntok, bool after, int64_t n_seqs, bool grouped = false) {
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
        GdnDims d = kGdn;
        d.grouped = grouped;
        r.be().gdn_scan(qkv, g, beta, seqs.data(), n_seqs, d, 64, out);
        r.out(out);
    };
    cs.push_back({"gdn_scan", "1 token (recurrent step)", kReduction, [=](Run& r) { scan(r, 1, false, 1); }});
    cs.push_back({"gdn_scan", "70 tokens (chunks of 64)", kComposite, [=](Run& r) { scan(r, 70, false, 1); }});
    cs.push_back({"gdn_scan", "5 tokens with per-token states", kReduction, [=](Run& r) { scan(r, 5, true, 1); }});
    cs.push_back({"gdn_scan", "2 sequences of 9 tokens", kComposite, [=](Run& r) { scan(r, 9, false, 2); }});
    cs.push_back({"gdn_scan", "1 token, value heads grouped", kReduction, [=](Run& r) { scan(r, 1, false, 1, true); }});
    cs.push_back({"gdn_scan", "70 tokens, value heads grouped", kComposite, [=](Run& r) { scan(r, 70, false, 1, true); }});
}

namespace {

// ntok tokens' routing: k distinct experts of ne each, drawn at random ([ntok][k] row-major).
std::vector<int32_t> routing_ids(Run& r, int64_t ntok, int64_t ne, int64_t k) {
    std::vector<int32_t> ids, all(static_cast<size_t>(ne));
    for (int64_t t = 0; t < ntok; ++t) {
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), r.rng());
        ids.insert(ids.end(), all.begin(), all.begin() + k);
    }
    return ids;
}

}  // namespace

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
    // gpt-oss's experts: biases on every product, the clamped SwiGLU
    for (uint32_t type : {RG_TYPE_Q8_0, RG_TYPE_MXFP4})
        cs.push_back({"moe_experts", type_name(type) + " experts, top 3 of 8, biases and swiglu_oai", kQuantMatmul, [=](Run& r) {
                          const int64_t ntok = 6, h = 256, ff = 128, ne = 8, k = 3;
                          const std::vector<int32_t> ids = routing_ids(r, ntok, ne, k);
                          ExpertSet experts{r.weights(type, ne * ff, h), r.weights(type, ne * ff, h),
                                            r.weights(type, ne * h, ff), ne};
                          experts.act = Glu::SwigluOai;
                          experts.gate_bias = r.f32(ne, ff, -3.0f, 3.0f), experts.up_bias = r.f32(ne, ff, -3.0f, 3.0f);
                          experts.down_bias = r.f32(ne, h);
                          const Tensor x = r.f32(ntok, h), w = r.f32(ntok, k, 0.0f, 1.0f);
                          const Tensor y = r.zeros(RG_TYPE_F32, ntok, h);
                          r.be().moe_experts(x, r.ints(RG_TYPE_I32, ntok, k, ids), w, experts, nullptr, y);
                          r.out(y);
                      }});
    for (uint32_t type : {RG_TYPE_Q8_0, RG_TYPE_IQ2_XS})
        for (bool shared : {false, true})
            cs.push_back({"moe_experts", type_name(type) + " experts, top 3 of 8" + (shared ? ", shared expert" : ""),
                          kQuantMatmul, [=](Run& r) {
                              const int64_t ntok = 6, h = 256, ff = 256, ne = 8, k = 3, fs = 256;
                              const std::vector<int32_t> ids = routing_ids(r, ntok, ne, k);
                              const ExpertSet experts{r.weights(type, ne * ff, h), r.weights(type, ne * ff, h),
                                                      r.weights(type, ne * h, ff), ne};
                              const Tensor x = r.f32(ntok, h), w = r.f32(ntok, k, 0.0f, 1.0f), y = r.zeros(RG_TYPE_F32, ntok, h);
                              const SharedExpert sh{r.f32(ntok, fs), r.f32(ntok, fs), r.weights(type, h, fs), r.f32(ntok, 1)};
                              r.be().moe_experts(x, r.ints(RG_TYPE_I32, ntok, k, ids), w, experts, shared ? &sh : nullptr, y);
                              r.out(y);
                          }});
    // The same experts as records in slots (ExpertSlots): each record at part offsets of its own, four of the
    // eight in device slots (their host rows and the unused device slot hold random bytes, which must not be
    // read) and the rest read from mapped host memory. The result must be the stacked tensors' bit for bit on
    // the backend under test, and match the reference as any product does.
    for (uint32_t type : {RG_TYPE_Q8_0, RG_TYPE_IQ2_XS, RG_TYPE_F16})
        for (int64_t ntok : {6, 40}) {
            Case c{"moe_experts", type_name(type) + " experts in slots (4 of 8 on the device), " + std::to_string(ntok) +
                                      " tokens, top 3 of 8",
                   type == RG_TYPE_F16 ? kFloatMatmul : kQuantMatmul, [=](Run& r) {
                       const int64_t h = 256, ff = 256, ne = 8, k = 3, n_slots = 5;
                       const std::vector<int32_t> ids = routing_ids(r, ntok, ne, k);
                       const int64_t dims[3][2] = {{ff, h}, {ff, h}, {h, ff}};
                       std::vector<uint8_t> stacked[3];
                       ExpertSlots sl;
                       for (int i = 0; i < 3; ++i) {
                           stacked[i] = r.weight_bytes(type, ne * dims[i][0], dims[i][1]);
                           const int64_t row = type_row_bytes(*type_traits(type), dims[i][1]);
                           sl.parts[i] = ExpertPart{type, dims[i][0], dims[i][1], row};
                       }
                       // expert e's parts at 16-byte offsets of its own: 16 (e % 3), then 48 bytes apart
                       std::vector<int32_t> offsets(size_t(3 * ne));
                       int64_t slot_bytes = 0;
                       for (int64_t e = 0; e < ne; ++e) {
                           int64_t at = 16 * (e % 3);
                           for (int i = 0; i < 3; ++i) {
                               offsets[size_t(3 * e + i)] = int32_t(at);
                               at += (sl.parts[i].rows * sl.parts[i].row_bytes + 15) / 16 * 16 + 48;
                           }
                           slot_bytes = std::max(slot_bytes, at);
                       }
                       const auto record = [&](int64_t e, std::vector<uint8_t>& dst, int64_t row) {
                           for (int i = 0; i < 3; ++i) {
                               const size_t bytes = size_t(sl.parts[i].rows * sl.parts[i].row_bytes);
                               std::memcpy(&dst[size_t(row * slot_bytes + offsets[size_t(3 * e + i)])],
                                           &stacked[i][size_t(e) * bytes], bytes);
                           }
                       };
                       const auto noise = [&](size_t n) {
                           std::vector<uint8_t> v(n);
                           for (uint8_t& b : v) b = uint8_t(r.rng()() & 0xff);
                           return v;
                       };
                       const int32_t where[8] = {-1, 3, -1, -1, 0, -1, 4, 2};  // slot 1 unused
                       std::vector<uint8_t> host = noise(size_t(ne * slot_bytes)), dev = noise(size_t(n_slots * slot_bytes));
                       for (int64_t e = 0; e < ne; ++e) record(e, where[e] >= 0 ? dev : host, where[e] >= 0 ? where[e] : e);
                       sl.device = r.put(RG_TYPE_I8, n_slots, slot_bytes, dev.data());
                       sl.host = r.mapped(ne, slot_bytes, host);
                       sl.where = r.put(RG_TYPE_I32, 1, ne, where);
                       sl.offsets = r.ints(RG_TYPE_I32, ne, 3, offsets);
                       const ExpertSet experts{r.put(type, ne * ff, h, stacked[0].data()),
                                               r.put(type, ne * ff, h, stacked[1].data()),
                                               r.put(type, ne * h, ff, stacked[2].data()), ne};
                       ExpertSet in_slots{Tensor{}, Tensor{}, Tensor{}, ne, &sl};
                       const Tensor x = r.f32(ntok, h), w = r.f32(ntok, k, 0.0f, 1.0f), id = r.ints(RG_TYPE_I32, ntok, k, ids);
                       const Tensor y = r.zeros(RG_TYPE_F32, ntok, h), ys = r.zeros(RG_TYPE_F32, ntok, h);
                       r.be().moe_experts(x, id, w, experts, nullptr, y);
                       r.be().moe_experts(x, id, w, in_slots, nullptr, ys);
                       std::vector<float> a(size_t(ntok * h)), b(a.size());
                       r.be().read(y, a.data());
                       r.be().read(ys, b.data());
                       if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0)
                           throw Error("moe_experts: the experts in slots differ from the stacked ones");
                       r.out(ys);
                   }};
            c.expert_slots = true;
            cs.push_back(std::move(c));
        }
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

// Appended last: a case's inputs are seeded by its index, so new cases leave the others' as they were.
void add_lifetime_cases(std::vector<Case>& cs) {
    // A backend that wraps imported memory (a mapped GGUF) instead of copying it must be done reading it when
    // free returns: the model unmaps its files right after freeing their buffers.
    cs.push_back({"import_host", "freed before its reader ran, then overwritten", kExact, [](Run& r) {
                      std::vector<float> host = r.floats(7 * 33);
                      const Tensor out = r.zeros(RG_TYPE_F32, 7, 33);
                      {
                          const Buffer imported = Buffer::import(r.be(), host.data(), 4 * host.size());
                          r.be().copy(imported.tensor(RG_TYPE_F32, 7, 33), out);
                      }
                      std::fill(host.begin(), host.end(), 0.0f);
                      r.out(out);
                  }});
}

// Appended after the lifetime cases: rows whose last 256-element K chunk is short (64 and 160 elements
// past the first), the batch-invariance contract for each type whose blocks fit them.
void add_short_chunk_cases(std::vector<Case>& cs) {
    for (int64_t cols : {320, 416})
        for (uint32_t type = 0; type < RG_TYPE_COUNT; ++type) {
            const TypeTraits* t = type_traits(type);
            if (t && t->supported && cols % t->block_elems == 0) add_batch_invariance_case(cs, type, cols);
        }
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
    add_lifetime_cases(cs);
    add_short_chunk_cases(cs);
    return cs;
}

}  // namespace check

namespace {

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
    for (const check::Case& c : check::all_cases()) {
        ++index;
        if (c.op.find(filter) == std::string::npos) continue;
        OpCheck r{c.op, c.shape, 0.0, c.tolerance, false, "", ""};
        if (!be.supports_cache(c.cache) || (c.expert_slots && !be.supports_expert_slots())) {
            r.passed = true;
            r.skipped = c.expert_slots ? std::string("the backend takes no expert slots")
                                       : std::string("the backend has no kernels for ") + cache_type_name(c.cache) +
                                             " attention caches";
            out.push_back(std::move(r));
            continue;
        }
        try {
            check::Run a(be, seed * 1000003 + index), b(ref, ref_seed * 1000003 + index);
            c.run(a);
            c.run(b);
            const check::Run::Result ra = a.results(), rb = b.results();
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
