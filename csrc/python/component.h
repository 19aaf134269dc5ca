// Internal: one model component (a layer, a mixer) loaded from a GGUF on its own, for the tests that compare
// it with the transformers reference. Owns the mapped file, the weights on the backend and a workspace;
// numpy in, numpy out.
#pragma once

#include <nanobind/ndarray.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "core/buffers.h"
#include "core/gguf_set.h"
#include "model/weights.h"
#include "numpy_out.h"

using F32Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using F32Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

struct ComponentFile {
    explicit ComponentFile(const std::string& path, const std::string& backend = "")
        : ComponentFile(std::make_unique<regolith::GgufSet>(path), backend) {}
    explicit ComponentFile(std::unique_ptr<regolith::GgufSet> f, const std::string& backend = "")
        : file(std::move(f)),
          be(&regolith::backend_by_name(backend)),
          store(std::make_unique<regolith::WeightStore>(*file, *be)),
          ws(std::make_unique<regolith::Workspace>(*be)) {}

    regolith::ModelWeights weights() const { return regolith::ModelWeights(*store); }
    // rows x cols of host floats as a workspace tensor
    regolith::Tensor upload(const float* data, int64_t rows, int64_t cols) const {
        const regolith::Tensor t = ws->f32(rows, cols);
        be->write(t, data);
        return t;
    }
    // a tensor as a new numpy array (reset the workspace after the last one)
    F32Out download(const regolith::Tensor& t) const {
        float* out;
        F32Out a = new_array({size_t(t.rows), size_t(t.cols)}, &out);
        be->read(t, out);
        return a;
    }

    std::unique_ptr<regolith::GgufSet> file;
    regolith::Backend* be;
    std::unique_ptr<regolith::WeightStore> store;
    std::unique_ptr<regolith::Workspace> ws;
};
