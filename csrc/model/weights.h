// Typed, validated access to a model file's tensors by llama.cpp name, as backend tensors.
//
// A WeightStore imports the tensors a model uses into its backend (the CPU wraps the file mapping, other
// backends copy) and owns the buffers; ModelWeights is the loaders' view of it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backend.h"
#include "core/buffers.h"
#include "core/gguf_set.h"

namespace regolith {

class WeightStore {
public:
    WeightStore(const GgufSet& file, Backend& be) : file_(file), be_(be) {}
    WeightStore(const WeightStore&) = delete;
    WeightStore& operator=(const WeightStore&) = delete;

    const GgufSet& file() const { return file_; }
    Backend& backend() const { return be_; }
    // Tensor t's data as a backend buffer (imported once): [ne1 * ne2 * ne3][ne0].
    Tensor whole(const GgufTensor& t);
    // rows x cols of `type` copied from host memory into a new backend buffer the store owns.
    Tensor upload(uint32_t type, int64_t rows, int64_t cols, const void* data);
    // Bytes of the tensors imported and uploaded so far.
    uint64_t bytes() const;

private:
    const GgufSet& file_;
    Backend& be_;
    std::unordered_map<const GgufTensor*, Buffer> imported_;
    std::vector<OwnedTensor> uploaded_;
};

// Tensor `name` of `file` checked to be a stacked 3-D tensor of numpy shape (n, rows, cols) of a type regolith
// computes with (llama.cpp's *_exps tensors). Throws ModelFormatError.
const GgufTensor& stacked_tensor(const GgufSet& file, const std::string& name, int64_t n, int64_t rows, int64_t cols);

class ModelWeights {
public:
    explicit ModelWeights(WeightStore& store) : store_(store), file_(store.file()) {}

    const GgufSet& file() const { return file_; }
    WeightStore& store() const { return store_; }
    bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }

    // The tensor `name` of a type regolith computes with and of ggml shape `ne` ({ne0} or {ne0, ne1}, ...):
    // at most ne.size() dimensions, every dimension past them 1 (ggml drops trailing 1s, so [n, 1] may be
    // stored 1-D).
    const GgufTensor& tensor(const std::string& name, std::initializer_list<int64_t> ne) const;
    // A matrix of numpy shape (rows, cols): ggml ne = {cols, rows}. Any supported type.
    Tensor matrix(const std::string& name, int64_t rows, int64_t cols) const;
    // A stacked 3-D tensor of numpy shape (n, rows, cols) (llama.cpp's *_exps tensors) as [n * rows][cols].
    Tensor stacked_all(const std::string& name, int64_t n, int64_t rows, int64_t cols) const;
    // An F32 tensor of exactly n elements, any dimensionality (norm weights, biases, conv kernels): [1][n].
    Tensor f32(const std::string& name, int64_t n) const;
    // An F32 vector of ggml shape [n] (1-D): stricter than f32(name, n).
    Tensor f32_vector(const std::string& name, int64_t n) const;
    // The tensor `name` of ggml shape `ne` (as tensor()) as f32 [1][elements]: F32 data as stored, any other
    // type dequantized at load.
    Tensor f32_converted(const std::string& name, std::initializer_list<int64_t> ne) const;
    // The n elements (any dimensionality, as f32()) of tensor `name`, of any supported type, as f32 into
    // host memory dst[n] (for weights transformed at load).
    void to_f32(const std::string& name, int64_t n, float* dst) const;
    // The file's own F32 data of tensor `name` (n elements), in host memory (load-time transforms).
    const float* host_f32(const std::string& name, int64_t n) const;

private:
    const GgufTensor& get(const std::string& name) const;
    void convert(const std::string& name, const GgufTensor& t, float* dst) const;
    WeightStore& store_;
    const GgufSet& file_;
};

}  // namespace regolith
