// Typed, validated access to a model file's tensors by llama.cpp name.
#pragma once

#include <cstdint>
#include <string>

#include "core/gguf.h"
#include "core/ops.h"

namespace regolith {

class ModelWeights {
public:
    explicit ModelWeights(const GgufFile& file) : file_(file) {}

    const GgufFile& file() const { return file_; }
    bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }

    // A matrix of numpy shape (rows, cols): ggml ne = {cols, rows}. Any supported type.
    WeightView matrix(const std::string& name, int64_t rows, int64_t cols) const;
    // Matrix `e` of a stacked 3-D tensor of numpy shape (n, rows, cols) (llama.cpp's *_exps tensors).
    WeightView stacked(const std::string& name, int64_t n, int64_t e, int64_t rows, int64_t cols) const;
    // An F32 tensor of exactly n elements, any dimensionality (norm weights, biases, conv kernels).
    const float* f32(const std::string& name, int64_t n) const;

private:
    const GgufTensor& get(const std::string& name) const;
    const GgufFile& file_;
};

}  // namespace regolith
