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

const GgufTensor& supported(const GgufSet& file, const std::string& name) {
    const GgufTensor* t = file.find_tensor(name);
    if (!t) throw ModelFormatError("missing tensor '" + name + "'");
    const TypeTraits* traits = type_traits(t->type);
    if (!traits || !traits->supported)
        throw ModelFormatError("tensor '" + name + "' has a type regolith cannot compute with (id " +
                               std::to_string(t->type) + ")");
    return *t;
}

}  // namespace

const GgufTensor& stacked_tensor(const GgufSet& file, const std::string& name, int64_t n, int64_t rows, int64_t cols) {
    const GgufTensor& t = supported(file, name);
    if (t.n_dims != 3 || int64_t(t.ne[0]) != cols || int64_t(t.ne[1]) != rows || int64_t(t.ne[2]) != n)
        bad_shape(name, t, "[" + std::to_string(cols) + ", " + std::to_string(rows) + ", " + std::to_string(n) + "]");
    return t;
}

Tensor WeightStore::whole(const GgufTensor& t) {
    auto it = imported_.find(&t);
    if (it == imported_.end())
        it = imported_.emplace(&t, Buffer::import(be_, file_.tensor_data(t), t.nbytes)).first;
    Tensor out;
    out.buffer = it->second.get();
    out.type = t.type;
    out.cols = int64_t(t.ne[0]);
    out.rows = int64_t(t.ne[1] * t.ne[2] * t.ne[3]);
    out.row_bytes = int64_t(t.row_bytes);
    return out;
}

Tensor WeightStore::upload(uint32_t type, int64_t rows, int64_t cols, const void* data) {
    return uploaded_.emplace_back(OwnedTensor::from_host(be_, type, rows, cols, data)).t;
}

uint64_t WeightStore::bytes() const {
    uint64_t n = 0;
    for (const auto& [t, b] : imported_) n += b.bytes();
    for (const OwnedTensor& o : uploaded_) n += o.buffer.bytes();
    return n;
}

const GgufTensor& ModelWeights::get(const std::string& name) const { return supported(file_, name); }

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

Tensor ModelWeights::matrix(const std::string& name, int64_t rows, int64_t cols) const {
    return store_.whole(tensor(name, {cols, rows}));
}

Tensor ModelWeights::stacked_all(const std::string& name, int64_t n, int64_t rows, int64_t cols) const {
    return store_.whole(stacked_tensor(file_, name, n, rows, cols));
}

Tensor ModelWeights::f32(const std::string& name, int64_t n) const {
    const GgufTensor& t = get(name);
    if (t.type != RG_TYPE_F32) throw ModelFormatError("tensor '" + name + "' must be F32");
    if (int64_t(t.n_elements) != n) bad_shape(name, t, std::to_string(n) + " elements");
    return store_.whole(t).reshaped(1, n);
}

Tensor ModelWeights::f32_vector(const std::string& name, int64_t n) const {
    const GgufTensor& t = tensor(name, {n});
    if (t.type != RG_TYPE_F32) throw ModelFormatError("tensor '" + name + "' must be F32");
    return store_.whole(t).reshaped(1, n);
}

const float* ModelWeights::host_f32(const std::string& name, int64_t n) const {
    const GgufTensor& t = get(name);
    if (t.type != RG_TYPE_F32) throw ModelFormatError("tensor '" + name + "' must be F32");
    if (int64_t(t.n_elements) != n) bad_shape(name, t, std::to_string(n) + " elements");
    return reinterpret_cast<const float*>(file_.tensor_data(t));
}

void ModelWeights::convert(const std::string& name, const GgufTensor& t, float* dst) const {
    try {
        dequantize_row(t.type, file_.tensor_data(t), dst, int64_t(t.n_elements));
    } catch (const Error& e) {
        throw ModelFormatError("tensor '" + name + "': " + e.what());
    }
}

Tensor ModelWeights::f32_converted(const std::string& name, std::initializer_list<int64_t> ne) const {
    const GgufTensor& t = tensor(name, ne);
    const int64_t n = int64_t(t.n_elements);
    if (t.type == RG_TYPE_F32) return store_.whole(t).reshaped(1, n);
    std::vector<float> v(static_cast<size_t>(n));
    convert(name, t, v.data());
    return store_.upload(RG_TYPE_F32, 1, n, v.data());
}

void ModelWeights::to_f32(const std::string& name, int64_t n, float* dst) const {
    const GgufTensor& t = get(name);
    if (int64_t(t.n_elements) != n) bad_shape(name, t, std::to_string(n) + " elements");
    convert(name, t, dst);
}

}  // namespace regolith
