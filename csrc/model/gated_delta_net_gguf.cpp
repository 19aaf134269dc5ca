// load_gdn_layer: GdnShape / GdnWeights of one layer from llama.cpp's qwen4exp (qwen35-family) GGUF layout.
#include <string>
#include <variant>

#include "core/dequant.h"
#include "core/errors.h"
#include "core/gguf.h"
#include "core/types.h"
#include "model/gated_delta_net.h"

namespace regolith {

namespace {

std::string arch_of(const GgufFile& f) {
    const GgufValue* v = f.find("general.architecture");
    if (!v || v->type() != GgufValueType::STRING)
        throw ModelFormatError("GGUF has no string metadata key 'general.architecture'");
    return std::string(std::get<std::string_view>(*v));
}

int64_t uint_key(const GgufFile& f, const std::string& key) {
    const GgufValue* v = f.find(key);
    if (!v) throw ModelFormatError("missing metadata key '" + key + "' (needed by the Gated DeltaNet layers)");
    int64_t out = -1;
    std::visit(
        [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) out = int64_t(x);
        },
        static_cast<const GgufVariant&>(*v));
    if (out <= 0) throw ModelFormatError("metadata key '" + key + "' must be a positive integer");
    return out;
}

float float_key(const GgufFile& f, const std::string& key) {
    const GgufValue* v = f.find(key);
    if (!v) throw ModelFormatError("missing metadata key '" + key + "'");
    if (v->type() == GgufValueType::FLOAT32) return std::get<float>(*v);
    if (v->type() == GgufValueType::FLOAT64) return float(std::get<double>(*v));
    throw ModelFormatError("metadata key '" + key + "' must be a float");
}

std::string dims(const GgufTensor& t) {
    std::string s = "[";
    for (uint32_t i = 0; i < t.n_dims; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
    return s + "]";
}

// The tensor `name` with ggml shape [ne0] or [ne0, ne1]; ModelFormatError otherwise.
const GgufTensor& tensor(const GgufFile& f, const std::string& name, int64_t ne0, int64_t ne1 = 0) {
    const GgufTensor* t = f.find_tensor(name);
    if (!t) throw ModelFormatError("missing tensor '" + name + "' (not a Gated DeltaNet layer, or an incomplete file)");
    const uint32_t want_dims = ne1 ? 2 : 1;
    // ggml drops trailing 1s, so [n, 1] may be stored as 1-D.
    const bool ok = t->ne[0] == uint64_t(ne0) && t->ne[1] == uint64_t(ne1 ? ne1 : 1) && t->ne[2] == 1 &&
                    t->ne[3] == 1 && t->n_dims <= want_dims;
    if (!ok) {
        const std::string want = ne1 ? "[" + std::to_string(ne0) + ", " + std::to_string(ne1) + "]"
                                     : "[" + std::to_string(ne0) + "]";
        throw ModelFormatError("tensor '" + name + "' has shape " + dims(*t) + ", expected " + want +
                               " from the ssm.* metadata");
    }
    return *t;
}

WeightView weight(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows) {
    const GgufTensor& t = tensor(f, name, cols, rows);
    const TypeTraits* tr = type_traits(t.type);
    if (!tr || !tr->supported)
        throw ModelFormatError("tensor '" + name + "' has a type regolith cannot multiply with (id " +
                               std::to_string(t.type) + ")");
    return WeightView{t.type, f.tensor_data(t), rows, cols, int64_t(t.row_bytes)};
}

// An f32 pointer to the tensor's data, converting into `owned` when stored in another type.
const float* floats(const GgufFile& f, const std::string& name, int64_t ne0, int64_t ne1, GdnLayer& layer) {
    const GgufTensor& t = tensor(f, name, ne0, ne1);
    if (t.type == 0 /* F32 */) return reinterpret_cast<const float*>(f.tensor_data(t));
    std::vector<float>& v = layer.owned.emplace_back(size_t(t.n_elements));
    try {
        dequantize_row(t.type, f.tensor_data(t), v.data(), int64_t(t.n_elements));
    } catch (const Error& e) {
        throw ModelFormatError("tensor '" + name + "': " + e.what());
    }
    return v.data();
}

}  // namespace

GdnLayer load_gdn_layer(const GgufFile& f, int64_t layer, GdnGateAct gate_act) {
    const std::string a = arch_of(f) + ".";
    GdnLayer out;
    out.owned.reserve(4);  // pointers into the inner vectors stay valid
    GdnShape& s = out.shape;
    s.hidden = uint_key(f, a + "embedding_length");
    s.conv_kernel = uint_key(f, a + "ssm.conv_kernel");
    s.k_dim = uint_key(f, a + "ssm.state_size");
    s.n_k_heads = uint_key(f, a + "ssm.group_count");
    s.n_v_heads = uint_key(f, a + "ssm.time_step_rank");
    const int64_t inner = uint_key(f, a + "ssm.inner_size");
    s.eps = float_key(f, a + "attention.layer_norm_rms_epsilon");
    s.gate_act = gate_act;
    if (s.n_v_heads % s.n_k_heads != 0)
        throw ModelFormatError(a + "ssm.time_step_rank (value heads, " + std::to_string(s.n_v_heads) +
                               ") must be a multiple of ssm.group_count (key heads, " +
                               std::to_string(s.n_k_heads) + ")");
    if (inner % s.n_v_heads != 0)
        throw ModelFormatError(a + "ssm.inner_size (" + std::to_string(inner) +
                               ") must be a multiple of ssm.time_step_rank (" + std::to_string(s.n_v_heads) + ")");
    s.v_dim = inner / s.n_v_heads;

    const std::string p = "blk." + std::to_string(layer) + ".";
    GdnWeights& w = out.weights;
    w.qkv = weight(f, p + "attn_qkv.weight", s.hidden, s.conv_dim());
    w.gate = weight(f, p + "attn_gate.weight", s.hidden, s.value_dim());
    w.alpha = weight(f, p + "ssm_alpha.weight", s.hidden, s.n_v_heads);
    w.beta = weight(f, p + "ssm_beta.weight", s.hidden, s.n_v_heads);
    w.out = weight(f, p + "ssm_out.weight", s.value_dim(), s.hidden);
    w.conv1d = floats(f, p + "ssm_conv1d.weight", s.conv_kernel, s.conv_dim(), out);
    w.a = floats(f, p + "ssm_a", s.n_v_heads, 0, out);
    w.dt_bias = floats(f, p + "ssm_dt.bias", s.n_v_heads, 0, out);
    w.norm = floats(f, p + "ssm_norm.weight", s.v_dim, 0, out);
    return out;
}

}  // namespace regolith
