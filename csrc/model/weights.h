// Typed, validated access to a model file's tensors by llama.cpp name.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/ops.h"

namespace regolith {

class ModelWeights {
public:
    explicit ModelWeights(const GgufFile& file) : file_(file) {}

    const GgufFile& file() const { return file_; }
    bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }

    // The tensor `name` of a type regolith computes with and of ggml shape `ne` ({ne0} or {ne0, ne1}, ...):
    // at most ne.size() dimensions, every dimension past them 1 (ggml drops trailing 1s, so [n, 1] may be
    // stored 1-D).
    const GgufTensor& tensor(const std::string& name, std::initializer_list<int64_t> ne) const;
    // A matrix of numpy shape (rows, cols): ggml ne = {cols, rows}. Any supported type.
    WeightView matrix(const std::string& name, int64_t rows, int64_t cols) const;
    // Matrix `e` of a stacked 3-D tensor of numpy shape (n, rows, cols) (llama.cpp's *_exps tensors).
    WeightView stacked(const std::string& name, int64_t n, int64_t e, int64_t rows, int64_t cols) const;
    // An F32 tensor of exactly n elements, any dimensionality (norm weights, biases, conv kernels).
    const float* f32(const std::string& name, int64_t n) const;
    // An F32 vector of ggml shape [n] (1-D): stricter than f32(name, n).
    const float* f32_vector(const std::string& name, int64_t n) const;
    // The tensor `name` of ggml shape `ne` (as tensor()) as f32: F32 data in place; any other type dequantized
    // into a new vector appended to `owned` (the caller keeps it alive; its buffers do not move).
    const float* f32_or_convert(const std::string& name, std::initializer_list<int64_t> ne,
                                std::vector<std::vector<float>>& owned) const;
    // The n elements (any dimensionality, as f32()) of tensor `name`, of any supported type, as f32 into dst[n].
    void to_f32(const std::string& name, int64_t n, float* dst) const;

private:
    const GgufTensor& get(const std::string& name) const;
    void convert(const std::string& name, const GgufTensor& t, float* dst) const;
    const GgufFile& file_;
};

}  // namespace regolith
