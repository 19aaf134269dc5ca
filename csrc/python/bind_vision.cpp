#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "model/qwen4exp.h"
#include "model/vision.h"
#include "numpy_out.h"

namespace {

using regolith::VisionEncoder;
using F32Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64Rows = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64Vec = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

nb::dict vision_config(const VisionEncoder& v) {
    const auto& c = v.config();
    nb::dict d;
    d["hidden_size"] = c.hidden;
    d["intermediate_size"] = c.ff;
    d["depth"] = c.n_layer;
    d["num_heads"] = c.n_head;
    d["patch_size"] = c.patch;
    d["spatial_merge_size"] = c.merge;
    d["temporal_patch_size"] = c.temporal;
    d["in_channels"] = c.channels;
    d["out_hidden_size"] = c.out_dim;
    d["num_position_embeddings"] = c.grid_side * c.grid_side;
    return d;
}

Out encode(const VisionEncoder& v, F32Rows pixels, I64Rows grids) {
    const auto& c = v.config();
    if (grids.shape(1) != 3) throw nb::value_error("grid_thw must have shape (n_images, 3)");
    if (int64_t(pixels.shape(1)) != c.patch_dim())
        throw nb::value_error(("pixel rows must have " + std::to_string(c.patch_dim()) + " values").c_str());
    int64_t patches = 0;
    for (size_t i = 0; i < grids.shape(0); ++i) patches += grids(i, 0) * grids(i, 1) * grids(i, 2);
    if (patches != int64_t(pixels.shape(0)))
        throw nb::value_error(("grid_thw describes " + std::to_string(patches) + " patches, pixel_values has " +
                               std::to_string(pixels.shape(0)))
                                  .c_str());
    float* out;
    Out result = new_array({size_t(patches / (c.merge * c.merge)), size_t(c.out_dim)}, &out);
    nb::gil_scoped_release release;
    v.encode(pixels.data(), grids.data(), int64_t(grids.shape(0)), out);
    return result;
}

Out eval_multimodal(regolith::ModelWindow& w, Tokens tokens, F32Rows embd, I64Vec rows, I64Rows positions,
                    bool all_logits) {
    auto* q = dynamic_cast<regolith::Qwen4ExpWindow*>(&w);
    if (!q) throw nb::type_error("images need a qwen4exp window");
    const int64_t n = int64_t(tokens.shape(0));
    if (rows.shape(0) != embd.shape(0)) throw nb::value_error("embeddings and rows must have as many entries");
    if (int64_t(positions.shape(0)) != n || positions.shape(1) != 3)
        throw nb::value_error("positions must have shape (n_tokens, 3)");
    if (embd.shape(0) && int64_t(embd.shape(1)) != q->hidden())
        throw nb::value_error(("embeddings must have " + std::to_string(q->hidden()) + " columns").c_str());
    regolith::MultimodalRows mm{embd.data(), rows.data(), int64_t(rows.shape(0)), positions.data()};
    float* out;
    Out logits = new_array({size_t(all_logits ? n : std::min<int64_t>(n, 1)), size_t(w.vocab())}, &out);
    nb::gil_scoped_release release;
    SubmitOnReturn submit(w);
    q->eval_multimodal(tokens.data(), n, mm, out, all_logits);
    return logits;
}

}  // namespace

void init_vision(nb::module_& m) {
    nb::class_<VisionEncoder>(m, "VisionEncoder", "The qwen4_exp vision tower from a projector (mmproj) GGUF.")
        .def("__init__",
             [](VisionEncoder* self, const std::string& path, const std::string& backend) {
                 regolith::Backend& be = regolith::backend_by_name(backend);
                 nb::gil_scoped_release release;
                 SubmitOnReturn done(be);  // what loading recorded
                 new (self) VisionEncoder(path, be);
             },
             nb::arg("path"), nb::arg("backend") = "")
        .def("config", &vision_config)
        .def_prop_ro("weight_bytes", &VisionEncoder::weight_bytes,
                     "Bytes of the weights it holds: what the memory plan's vision encoder row counts.")
        .def("encode", &encode, nb::arg("pixel_values"), nb::arg("grid_thw"),
             "pixel_values [patches, C*T*p*p] float32, grid_thw [images, 3] int64 -> embeddings "
             "[patches / merge^2, out_hidden_size] float32");
    m.def("eval_multimodal", &eval_multimodal, nb::arg("window"), nb::arg("tokens"), nb::arg("embeddings"),
          nb::arg("rows"), nb::arg("positions"), nb::arg("all_logits") = true,
          "Evaluate tokens on a qwen4exp window with image embeddings at `rows` and M-RoPE positions "
          "[n, 3] (t, h, w); returns logits like ModelWindow.eval.");
}
