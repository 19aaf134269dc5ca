#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "bindings.h"
#include "numpy_out.h"
#include "core/backend.h"
#include "core/block_decode.h"
#include "core/thread_pool.h"
#include "core/types.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/matmul.h"
#include "cpu/membench.h"

namespace {

using Weights = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Acts = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

Out matmul(uint32_t type, Weights w, int64_t cols, Acts x) {
    const regolith::TypeTraits* t = regolith::type_traits(type);
    if (!t) throw nb::value_error(("unknown type id " + std::to_string(type)).c_str());
    if (int64_t(x.shape(1)) != cols) throw nb::value_error("x must have shape (ntok, cols)");
    if (cols % t->block_elems != 0 || int64_t(w.shape(1)) != regolith::type_row_bytes(*t, cols))
        throw nb::value_error("weight rows must hold exactly cols elements of the type");
    const int64_t rows = int64_t(w.shape(0)), ntok = int64_t(x.shape(0));
    float* y;
    Out out = new_array({size_t(ntok), size_t(rows)}, &y);
    {
        nb::gil_scoped_release release;
        const regolith::cpu::WeightView view{type, w.data(), rows, cols, int64_t(w.shape(1))};
        regolith::cpu::matmul(view, x.data(), ntok, y);
    }
    return out;
}

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Moves a vector into a 1-D numpy array that owns it.
template <class T>
nb::object to_numpy(std::vector<T>&& v) {
    auto* heap = new std::vector<T>(std::move(v));
    nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
    return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), {heap->size()}, owner));
}

// The BlockDecoder view of quantized data: (codes int8[n], scale f32[n/G], bias f32[n/G] or None, G).
// For tests that need the magnitudes of the integer decomposition (float rounding bounds of the kernels).
nb::tuple decode_blocks(uint32_t type, Bytes data, int64_t n) {
    if (!regolith::is_quant_type(type)) throw nb::value_error("not a quantized type with a block decoder");
    return regolith::dispatch_quant_type(type, [&](auto decoder) -> nb::tuple {
        using D = decltype(decoder);
        if (n % D::QK != 0 || int64_t(data.shape(0)) != n / D::QK * int64_t(sizeof(typename D::Block)))
            throw nb::value_error("data must hold exactly n elements");
        std::vector<int8_t> q(static_cast<size_t>(n));
        std::vector<float> sc(static_cast<size_t>(n / D::G)), bi(sc.size());
        const auto* blocks = reinterpret_cast<const typename D::Block*>(data.data());
        constexpr int NG = D::QK / D::G;
        for (int64_t b = 0; b < n / D::QK; ++b) D::decode(blocks[b], &q[b * D::QK], &sc[b * NG], &bi[b * NG]);
        nb::object bias = D::HAS_BIAS ? to_numpy(std::move(bi)) : nb::none();
        return nb::make_tuple(to_numpy(std::move(q)), to_numpy(std::move(sc)), bias, D::G);
    });
}

// Times `iters` products of x with consecutive rows x cols matrices taken in turn from `pool` (wrapping),
// in C++ so that Python call overhead is not measured. Returns seconds.
double time_matmul(uint32_t type, Weights pool, int64_t rows, int64_t cols, Acts x, int64_t iters) {
    const regolith::TypeTraits* t = regolith::type_traits(type);
    if (!t || cols <= 0 || cols % t->block_elems != 0) throw nb::value_error("bad type or cols");
    if (rows <= 0 || iters <= 0) throw nb::value_error("rows and iters must be positive");
    const int64_t row_bytes = int64_t(pool.shape(1));
    if (row_bytes != regolith::type_row_bytes(*t, cols) || int64_t(x.shape(1)) != cols)
        throw nb::value_error("shape mismatch");
    const int64_t n_mats = int64_t(pool.shape(0)) / rows;
    if (n_mats < 1) throw nb::value_error("pool smaller than one matrix");
    const int64_t ntok = int64_t(x.shape(0));
    std::vector<float> y(size_t(rows * ntok));
    nb::gil_scoped_release release;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) {
        const regolith::cpu::WeightView view{type, pool.data() + (i % n_mats) * rows * row_bytes, rows, cols, row_bytes};
        regolith::cpu::matmul(view, x.data(), ntok, y.data());
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

using Floats = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;

// The CPU delta-rule scan of one sequence (cpu::gdn_scan) on prepared inputs: qkv [ntok][conv_dim] (q and k
// normalised), g and beta [ntok][n_v], state [n_v][k_dim][v_dim]. Returns (out [ntok][n_v * v_dim], the state
// after the last token, the state after each token [ntok][n_v * k_dim * v_dim] or None).
nb::tuple gdn_scan(Floats qkv, Floats g, Floats beta, Floats state, int64_t n_k_heads, int64_t chunk, bool after) {
    if (qkv.ndim() != 2 || g.ndim() != 2 || beta.ndim() != 2 || state.ndim() != 3)
        throw nb::value_error("qkv, g, beta must be 2-D and state 3-D");
    const int64_t ntok = int64_t(qkv.shape(0)), nv = int64_t(state.shape(0));
    const regolith::GdnDims d{n_k_heads, nv, int64_t(state.shape(1)), int64_t(state.shape(2))};
    if (ntok < 1 || chunk < 1 || n_k_heads < 1 || nv % n_k_heads != 0 || int64_t(qkv.shape(1)) != d.conv_dim() ||
        int64_t(g.shape(0)) != ntok || int64_t(g.shape(1)) != nv || int64_t(beta.shape(0)) != ntok ||
        int64_t(beta.shape(1)) != nv)
        throw nb::value_error("shapes disagree: qkv [ntok][conv_dim], g and beta [ntok][n_v], state [n_v][k][v]");
    const int64_t hs = d.k_dim * d.v_dim;
    std::vector<float> q(qkv.data(), qkv.data() + ntok * d.conv_dim()), gv(g.data(), g.data() + ntok * nv),
        bv(beta.data(), beta.data() + ntok * nv);
    float *o, *s, *a = nullptr;
    Out out = new_array({size_t(ntok), size_t(d.value_dim())}, &o);
    auto st = new_array({size_t(nv), size_t(d.k_dim), size_t(d.v_dim)}, &s);
    std::copy(state.data(), state.data() + nv * hs, s);
    nb::object aft = nb::none();
    if (after) aft = nb::cast(new_array({size_t(ntok), size_t(nv * hs)}, &a));
    {
        nb::gil_scoped_release release;
        using regolith::cpu::Rows;
        auto rows = [](float* p, int64_t r, int64_t c) {
            return Rows{reinterpret_cast<uint8_t*>(p), RG_TYPE_F32, r, c, c * int64_t(sizeof(float))};
        };
        const regolith::cpu::GdnSeqRows seq{rows(s, 1, nv * hs), a ? rows(a, ntok, nv * hs) : Rows{}, 0, ntok};
        regolith::cpu::gdn_scan(rows(q.data(), ntok, d.conv_dim()), rows(gv.data(), ntok, nv),
                                rows(bv.data(), ntok, nv), {seq}, d, chunk, rows(o, ntok, d.value_dim()));
    }
    return nb::make_tuple(out, st, aft);
}

}  // namespace

void init_kernels(nb::module_& m) {
    m.def("matmul", &matmul, nb::arg("type_id"), nb::arg("w"), nb::arg("cols"), nb::arg("x"),
          "y[t, r] = sum_c W[r, c] x[t, c] by the CPU kernels. w: uint8 (rows, row_bytes); x: float32 (ntok, cols).");
    m.def("gdn_scan", &gdn_scan, nb::arg("qkv"), nb::arg("g"), nb::arg("beta"), nb::arg("state"),
          nb::arg("n_k_heads"), nb::arg("chunk"), nb::arg("after") = false,
          "The CPU kernels' Gated DeltaNet scan of one sequence (chunks of `chunk` tokens, or token by token with "
          "`after`): (out [ntok][n_v * v_dim], final state, per-token states or None).");
    m.def("decode_blocks", &decode_blocks, nb::arg("type_id"), nb::arg("data"), nb::arg("n"),
          "Decode quantized data into (int8 codes, scale per group, bias per group or None, group size).");
    m.def("time_matmul", &time_matmul, nb::arg("type_id"), nb::arg("pool"), nb::arg("rows"), nb::arg("cols"),
          nb::arg("x"), nb::arg("iters"), "Benchmark helper: seconds for iters matmuls cycling through pool.");
    m.def("activation_block", &regolith::cpu::activation_block, nb::arg("type_id"),
          "Elements per activation quantization block the active kernels use for a weight type (32 or 128).");
    m.def(
        "set_isa", [](const std::string& name) { regolith::cpu::set_active_isa(regolith::cpu::isa_from_name(name)); },
        nb::arg("name"), "Select the CPU kernels: 'scalar', 'avx2', 'avxvnni', 'avx512', 'neon' or 'neondot'.");
    m.def("isa", [] { return std::string(regolith::cpu::isa_name(regolith::cpu::active_isa())); });
    m.def("available_isas", [] {
        std::vector<std::string> out;
        for (auto isa : regolith::cpu::available_isas()) out.emplace_back(regolith::cpu::isa_name(isa));
        return out;
    });
    m.def("set_exact_activations", &regolith::set_exact_activations, nb::arg("on"),
          "Multiply quantized weights with float activations on every backend (dequantize-then-float; slow, for "
          "verification).");
    m.def("exact_activations", &regolith::exact_activations);
    m.def("set_threads", &regolith::set_default_threads, nb::arg("n"), "Threads for CPU kernels (0: all cores).");
    m.def("threads", &regolith::default_threads);
    m.def(
        "read_all",
        [](Bytes data) {
            nb::gil_scoped_release release;
            return regolith::cpu::read_all(data.data(), data.shape(0));
        },
        nb::arg("data"), "Read every byte on the kernel threads (bandwidth probe); returns an XOR checksum.");
}
