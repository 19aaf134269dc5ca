// GGUF reader: memory-maps a file, validates its header and exposes metadata and zero-copy tensor data.
//
// Supports GGUF v2 and v3, little-endian. Every length and count read from the file is checked against
// the bytes that remain before anything is allocated for it, so a malformed file costs at most a small
// constant multiple of its own size in memory and always ends in a GGUFError naming the byte offset.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace regolith {

// GGUF metadata value type ids; the order matches GgufValue's variant alternatives.
enum class GgufValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};
constexpr uint32_t kGgufValueTypeCount = 13;

struct GgufValue;

// An array value. Arrays of fixed-size scalars stay in the mapping (`data`, little-endian, `size` elements
// of `type`); arrays of strings or arrays hold one parsed element per entry in `items`.
struct GgufArray {
    GgufValueType type = GgufValueType::UINT8;
    uint64_t size = 0;
    const uint8_t* data = nullptr;
    std::vector<GgufValue> items;
};

// A metadata value. Strings are views into the mapping (bytes as stored, not validated as UTF-8).
// The alternative index equals the GGUF value type id.
using GgufVariant = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                                 std::string_view, GgufArray, uint64_t, int64_t, double>;
struct GgufValue : GgufVariant {
    using GgufVariant::GgufVariant;
    GgufValueType type() const { return GgufValueType(index()); }
};

struct GgufTensor {
    std::string_view name;          // valid UTF-8
    uint32_t n_dims = 0;            // 1..4
    uint64_t ne[4] = {1, 1, 1, 1};  // ggml order: ne[0] is the contiguous dimension
    uint32_t type = 0;              // GGUF (ggml) type id
    uint64_t offset = 0;            // absolute byte offset in the file
    uint64_t nbytes = 0;
    uint64_t n_elements = 0;
    uint64_t row_bytes = 0;  // bytes of one ne[0] row
    uint32_t file = 0;       // in a GgufSet: the index of the file holding it (0 in a lone GgufFile)
};

class GgufFile {
  public:
    // Maps and parses `path`. Throws std::system_error when the file cannot be opened or mapped and
    // GGUFError when it is not a valid GGUF v2/v3 file.
    explicit GgufFile(const std::string& path);
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t file_size() const { return size_; }
    uint64_t data_offset() const { return data_offset_; }

    // Metadata in file order; keys are unique and valid UTF-8.
    const std::vector<std::pair<std::string_view, GgufValue>>& metadata() const { return metadata_; }
    const GgufValue* find(std::string_view key) const;

    // Tensors in file order; names are unique.
    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* find_tensor(std::string_view name) const;
    const uint8_t* tensor_data(const GgufTensor& t) const { return base_ + t.offset; }

  private:
    void parse();

    const uint8_t* base_ = nullptr;
    uint64_t size_ = 0;
    void* map_ = nullptr;  // null for an empty file

    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string_view, GgufValue>> metadata_;
    std::vector<GgufTensor> tensors_;
    std::unordered_map<std::string_view, size_t> key_index_;
    std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace regolith
