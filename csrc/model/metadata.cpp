#include "model/metadata.h"

#include <cstring>
#include <type_traits>
#include <variant>

#include "core/errors.h"

namespace regolith::meta {
namespace {

[[noreturn]] void wrong(const std::string& key, const char* want) {
    throw ModelFormatError("metadata key '" + key + "' must be " + want);
}

// An integer scalar as int64; nullopt for another kind of value. A uint64 above INT64_MAX is an error.
std::optional<int64_t> as_int(const GgufValue& v, const std::string& key) {
    return std::visit(
        [&](const auto& x) -> std::optional<int64_t> {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
                if constexpr (std::is_same_v<T, uint64_t>)
                    if (x > uint64_t(INT64_MAX)) wrong(key, "an integer that fits int64");
                return int64_t(x);
            } else {
                return std::nullopt;
            }
        },
        static_cast<const GgufVariant&>(v));
}

// Element i of an integer (or, with allow_bool, BOOL) array stored in the mapping.
int64_t array_int(const GgufArray& a, uint64_t i, const std::string& key, bool allow_bool) {
    auto load = [&](auto tag) {
        decltype(tag) x;
        std::memcpy(&x, a.data + i * sizeof(x), sizeof(x));
        return x;
    };
    switch (a.type) {
        case GgufValueType::BOOL:
            if (!allow_bool) break;
            return load(uint8_t{});
        case GgufValueType::UINT8: return load(uint8_t{});
        case GgufValueType::INT8: return load(int8_t{});
        case GgufValueType::UINT16: return load(uint16_t{});
        case GgufValueType::INT16: return load(int16_t{});
        case GgufValueType::UINT32: return load(uint32_t{});
        case GgufValueType::INT32: return load(int32_t{});
        case GgufValueType::INT64: return load(int64_t{});
        case GgufValueType::UINT64: {
            const uint64_t x = load(uint64_t{});
            if (x > uint64_t(INT64_MAX))
                throw ModelFormatError("metadata key '" + key + "' has element " + std::to_string(i) + " = " +
                                       std::to_string(x) + ", which does not fit int64");
            return int64_t(x);
        }
        default: break;
    }
    wrong(key, "an array of integers");
}

}  // namespace

std::optional<int64_t> get_int(const GgufSet& f, const std::string& key) {
    const GgufValue* v = f.find(key);
    if (!v) return std::nullopt;
    const auto i = as_int(*v, key);
    if (!i) wrong(key, "an integer");
    return i;
}

int64_t require_int(const GgufSet& f, const std::string& key) {
    const auto v = get_int(f, key);
    if (!v) throw ModelFormatError("missing metadata key '" + key + "'");
    return *v;
}

int64_t require_positive_int(const GgufSet& f, const std::string& key) {
    const int64_t v = require_int(f, key);
    if (v <= 0) throw ModelFormatError("metadata key '" + key + "' must be a positive integer, got " + std::to_string(v));
    return v;
}

std::optional<float> get_float(const GgufSet& f, const std::string& key) {
    const GgufValue* v = f.find(key);
    if (!v) return std::nullopt;
    if (const auto* x = std::get_if<float>(v)) return *x;
    if (const auto* x = std::get_if<double>(v)) return float(*x);
    wrong(key, "a float");
}

float require_float(const GgufSet& f, const std::string& key) {
    const auto v = get_float(f, key);
    if (!v) throw ModelFormatError("missing metadata key '" + key + "'");
    return *v;
}

std::optional<bool> get_bool(const GgufSet& f, const std::string& key) {
    const GgufValue* v = f.find(key);
    if (!v) return std::nullopt;
    if (const auto* x = std::get_if<bool>(v)) return *x;
    wrong(key, "a bool");
}

std::optional<std::string> get_string(const GgufSet& f, const std::string& key) {
    const GgufValue* v = f.find(key);
    if (!v) return std::nullopt;
    if (const auto* x = std::get_if<std::string_view>(v)) return std::string(*x);
    wrong(key, "a string");
}

std::string require_arch(const GgufSet& f, const std::string& arch) {
    const std::string got = get_string(f, "general.architecture").value_or("<missing>");
    if (got != arch)
        throw ModelFormatError("architecture '" + got + "' is not supported by the " + arch + " loader");
    return arch + ".";
}

std::string require_string(const GgufSet& f, const std::string& key) {
    const auto v = get_string(f, key);
    if (!v) throw ModelFormatError("missing metadata key '" + key + "'");
    return *v;
}

std::optional<std::vector<int64_t>> get_int_array(const GgufSet& f, const std::string& key, int64_t n,
                                                  bool allow_bool) {
    const GgufValue* v = f.find(key);
    if (!v) return std::nullopt;
    if (const auto* a = std::get_if<GgufArray>(v)) {
        if (a->size && !a->data) wrong(key, "an array of integers");
        std::vector<int64_t> out;
        out.reserve(size_t(a->size));
        for (uint64_t i = 0; i < a->size; ++i) out.push_back(array_int(*a, i, key, allow_bool));
        if (n > 0 && int64_t(out.size()) != n)
            throw ModelFormatError("metadata key '" + key + "' has " + std::to_string(out.size()) +
                                   " elements, expected " + std::to_string(n));
        return out;
    }
    const auto i = as_int(*v, key);
    if (!i || n <= 0) wrong(key, "an array of integers");
    return std::vector<int64_t>(size_t(n), *i);
}

}  // namespace regolith::meta
