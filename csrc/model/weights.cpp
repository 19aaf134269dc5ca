#include "model/weights.h"

#include "core/dequant.h"
#include "core/errors.h"
#include "core/types.h"

namespace regolith {
namespace {

std::string dims_str(const GgufTensor& t) {
    std::string s = "[";
    for (uint32_t i = 0; i < t.n_dims; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
    return s + "]";
}

[[noreturn]] void bad_shape(const std::string& name, const GgufTensor& t, const std::string& want) {
    throw ModelFormatError("tensor '" + name + "' has ggml shape " + dims_str(t) + ", expected " + want);
}

}  // namespace

const GgufTensor& ModelWeights::get(const std::string& name) const {
    const GgufTensor* t = file_.find_tensor(name);
    if (!t) throw ModelFormatError("missing tensor '" + name + "'");
    const TypeTraits* traits = type_traits(t->type);
    if (!traits || !traits->supported)
        throw ModelFormatError("tensor '" + name + "' has a type regolith cannot compute with (id " +
                               std::to_string(t->type) + ")");
    return *t;
}

const GgufTensor& ModelWeights::tensor(const std::string& name, std::initializer_list<int64_t> ne) const {
    const GgufTensor& t = get(name);
    bool ok = t.n_dims <= ne.size();
    size_t d = 0;
    for (int64_t n : ne) ok = ok && int64_t(t.ne[d++]) == n;
    for (; d < 4; ++d) ok = ok && t.ne[d] == 1;
    if (!ok) {
        std::string want = "[";
        d = 0;
        for (int64_t n : ne) want += (d++ ? ", " : "") + std::to_string(n);
        bad_shape(name, t, want + "]");
    }
    return t;
}

WeightView ModelWeights::matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const GgufTensor& t = tensor(name, {cols, rows});
    return {t.type, file_.tensor_data(t), rows, cols, int64_t(t.row_bytes)};
}

WeightView ModelWeights::stacked(const std::string& name, int64_t n, int64_t e, int64_t rows, int64_t cols) const {
    const GgufTensor& t = get(name);
    if (t.n_dims != 3 || int64_t(t.ne[0]) != cols || int64_t(t.ne[1]) != rows || int64_t(t.ne[2]) != n)
        bad_shape(name, t, "[" + std::to_string(cols) + ", " + std::to_string(rows) + ", " + std::to_string(n) + "]");
    const int64_t matrix_bytes = rows * int64_t(t.row_bytes);
    return {t.type, file_.tensor_data(t) + e * matrix_bytes, rows, cols, int64_t(t.row_bytes)};
}

const float* ModelWeights::f32(const std::string& name, int64_t n) const {
    const GgufTensor& t = get(name);
    if (t.type != RG_TYPE_F32) throw ModelFormatError("tensor '" + name + "' must be F32");
    if (int64_t(t.n_elements) != n) bad_shape(name, t, std::to_string(n) + " elements");
    return reinterpret_cast<const float*>(file_.tensor_data(t));
}

const float* ModelWeights::f32_vector(const std::string& name, int64_t n) const {
    const GgufTensor& t = tensor(name, {n});
    if (t.type != RG_TYPE_F32) throw ModelFormatError("tensor '" + name + "' must be F32");
    return reinterpret_cast<const float*>(file_.tensor_data(t));
}

void ModelWeights::convert(const std::string& name, const GgufTensor& t, float* dst) const {
    try {
        dequantize_row(t.type, file_.tensor_data(t), dst, int64_t(t.n_elements));
    } catch (const Error& e) {
        throw ModelFormatError("tensor '" + name + "': " + e.what());
    }
}

const float* ModelWeights::f32_or_convert(const std::string& name, std::initializer_list<int64_t> ne,
                                          std::vector<std::vector<float>>& owned) const {
    const GgufTensor& t = tensor(name, ne);
    if (t.type == RG_TYPE_F32) return reinterpret_cast<const float*>(file_.tensor_data(t));
    std::vector<float>& v = owned.emplace_back(size_t(t.n_elements));
    convert(name, t, v.data());
    return v.data();
}

void ModelWeights::to_f32(const std::string& name, int64_t n, float* dst) const {
    const GgufTensor& t = get(name);
    if (int64_t(t.n_elements) != n) bad_shape(name, t, std::to_string(n) + " elements");
    convert(name, t, dst);
}

}  // namespace regolith
