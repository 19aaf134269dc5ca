#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "errors.h"
#include "types.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

namespace regolith {
namespace {

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr int kMaxArrayDepth = 64;
constexpr uint32_t kMaxDims = 4;
// Smallest encodings: a key/value pair (8-byte key length, 4-byte type, 1-byte value) and a tensor info
// (8-byte name length, n_dims, one dim, type, offset).
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

const char* value_type_name(uint32_t t) {
    static const char* names[kGgufValueTypeCount] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                                     "int32",  "float32", "bool",   "string", "array",
                                                     "uint64", "int64",   "float64"};
    return t < kGgufValueTypeCount ? names[t] : "unknown";
}

// Encoded size of a fixed-size value type; 0 for string and array.
uint64_t fixed_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL:
            return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16:
            return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32:
            return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64:
            return 8;
        default:
            return 0;
    }
}

// Smallest encoding of one value of type t: strings need their 8-byte length, arrays type + count.
uint64_t min_encoded_size(GgufValueType t) {
    if (t == GgufValueType::STRING) return 8;
    if (t == GgufValueType::ARRAY) return 4 + 8;
    return fixed_size(t);
}

// Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF), as Python decodes it.
bool valid_utf8(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const auto* end = p + s.size();
    while (p < end) {
        unsigned c = *p;
        if (c < 0x80) {
            ++p;
            continue;
        }
        int n;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return false;
        }
        if (end - p <= n) return false;
        if (p[1] < lo || p[1] > hi) return false;
        for (int i = 2; i <= n; ++i)
            if ((p[i] & 0xC0) != 0x80) return false;
        p += n + 1;
    }
    return true;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// A name (valid UTF-8) for an error message: control bytes escaped, long names cut at a character boundary.
std::string quoted(std::string_view s) {
    constexpr size_t kMax = 80;
    size_t n = s.size();
    if (n > kMax) {
        n = kMax;
        while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    }
    std::string out = "'";
    for (unsigned char ch : s.substr(0, n)) {
        if (ch < 0x20 || ch == 0x7F) {
            static const char hex[] = "0123456789abcdef";
            out += {'\\', 'x', hex[ch >> 4], hex[ch & 15]};
        } else {
            out += char(ch);
        }
    }
    if (n < s.size()) out += "...";
    return out + "'";
}

// Bounds-checked little-endian reads from the mapping.
class Cursor {
  public:
    Cursor(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return size_ - pos_; }
    const uint8_t* here() const { return base_ + pos_; }

    void need(uint64_t n, const char* what) const {
        if (n > remaining())
            throw GGUFError("truncated file: " + std::string(what) + " needs " + std::to_string(n) +
                                " bytes but only " + std::to_string(remaining()) + " remain",
                            pos_);
    }

    void skip(uint64_t n, const char* what) {
        need(n, what);
        pos_ += n;
    }

    template <class T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string_view read_string(const char* what) {
        uint64_t at = pos_;
        uint64_t len = read<uint64_t>(what);
        if (len > remaining())
            throw GGUFError(std::string(what) + " length " + std::to_string(len) +
                                " runs past the end of the file (" + std::to_string(remaining()) +
                                " bytes remain)",
                            at);
        std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
        pos_ += len;
        return s;
    }

  private:
    const uint8_t* base_;
    uint64_t size_;
    uint64_t pos_ = 0;
};

GgufValueType read_value_type(Cursor& c, const char* what) {
    uint64_t at = c.pos();
    uint32_t t = c.read<uint32_t>(what);
    if (t >= kGgufValueTypeCount) throw GGUFError("unknown metadata value type " + std::to_string(t), at);
    return GgufValueType(t);
}

GgufValue read_value(Cursor& c, GgufValueType type, int depth);

GgufArray read_array(Cursor& c, int depth) {
    if (depth > kMaxArrayDepth)
        throw GGUFError("metadata arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels",
                        c.pos());
    GgufArray a;
    a.type = read_value_type(c, "array element type");
    uint64_t at = c.pos();
    a.size = c.read<uint64_t>("array length");
    uint64_t min_size = min_encoded_size(a.type);
    if (a.size > c.remaining() / min_size)
        throw GGUFError("array of " + std::to_string(a.size) + " " + value_type_name(uint32_t(a.type)) +
                            " elements runs past the end of the file (" + std::to_string(c.remaining()) +
                            " bytes remain)",
                        at);
    if (uint64_t esize = fixed_size(a.type)) {
        a.data = c.here();
        if (a.type == GgufValueType::BOOL) {
            for (uint64_t i = 0; i < a.size; ++i)
                if (a.data[i] > 1)
                    throw GGUFError("invalid bool value " + std::to_string(a.data[i]) + " in array",
                                    c.pos() + i);
        }
        c.skip(a.size * esize, "array data");
        return a;
    }
    a.items.reserve(a.size);  // bounded by the check above: at most remaining / 8 elements
    for (uint64_t i = 0; i < a.size; ++i) a.items.push_back(read_value(c, a.type, depth));
    return a;
}

GgufValue read_value(Cursor& c, GgufValueType type, int depth) {
    switch (type) {
        case GgufValueType::UINT8:
            return c.read<uint8_t>("uint8 value");
        case GgufValueType::INT8:
            return c.read<int8_t>("int8 value");
        case GgufValueType::UINT16:
            return c.read<uint16_t>("uint16 value");
        case GgufValueType::INT16:
            return c.read<int16_t>("int16 value");
        case GgufValueType::UINT32:
            return c.read<uint32_t>("uint32 value");
        case GgufValueType::INT32:
            return c.read<int32_t>("int32 value");
        case GgufValueType::FLOAT32:
            return c.read<float>("float32 value");
        case GgufValueType::BOOL: {
            uint64_t at = c.pos();
            uint8_t b = c.read<uint8_t>("bool value");
            if (b > 1) throw GGUFError("invalid bool value " + std::to_string(b), at);
            return b == 1;
        }
        case GgufValueType::STRING:
            return c.read_string("string value");
        case GgufValueType::ARRAY:
            return read_array(c, depth + 1);
        case GgufValueType::UINT64:
            return c.read<uint64_t>("uint64 value");
        case GgufValueType::INT64:
            return c.read<int64_t>("int64 value");
        case GgufValueType::FLOAT64:
            return c.read<double>("float64 value");
    }
    throw GGUFError("unknown metadata value type " + std::to_string(uint32_t(type)), c.pos());
}

}  // namespace

GgufFile::GgufFile(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), path);
    struct stat st;
    int err = ::fstat(fd, &st) != 0  ? errno
              : S_ISDIR(st.st_mode)  ? EISDIR
              : !S_ISREG(st.st_mode) ? EINVAL
                                     : 0;
    if (err) {
        ::close(fd);
        throw std::system_error(err, std::generic_category(), path);
    }
    size_ = uint64_t(st.st_size);
    if (size_ > 0) {
        map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map_ == MAP_FAILED) {
            err = errno;
            map_ = nullptr;
            ::close(fd);
            throw std::system_error(err, std::generic_category(), path);
        }
        base_ = static_cast<const uint8_t*>(map_);
    }
    ::close(fd);
    try {
        parse();
    } catch (...) {
        if (map_) ::munmap(map_, size_);
        throw;
    }
}

GgufFile::~GgufFile() {
    if (map_) ::munmap(map_, size_);
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::parse() {
    Cursor c(base_, size_);

    // ---- header
    c.need(4, "magic");
    if (std::memcmp(c.here(), kMagic, 4) != 0) throw GGUFError("not a GGUF file: bad magic", 0);
    c.skip(4, "magic");
    version_ = c.read<uint32_t>("version");
    if ((version_ & 0xFFFF) == 0 && version_ != 0)
        throw GGUFError("big-endian GGUF files are not supported (version field reads " +
                            std::to_string(version_) + " little-endian)",
                        4);
    if (version_ != 2 && version_ != 3)
        throw GGUFError(
            "unsupported GGUF version " + std::to_string(version_) + " (regolith reads versions 2 and 3)", 4);
    uint64_t at_counts = c.pos();
    uint64_t n_tensors = c.read<uint64_t>("tensor count");
    uint64_t n_kv = c.read<uint64_t>("metadata count");
    if (n_kv > c.remaining() / kMinKvBytes)
        throw GGUFError("metadata count " + std::to_string(n_kv) + " cannot fit in the file", at_counts + 8);
    if (n_tensors > c.remaining() / kMinTensorInfoBytes)
        throw GGUFError("tensor count " + std::to_string(n_tensors) + " cannot fit in the file", at_counts);

    // ---- metadata
    metadata_.reserve(n_kv);
    key_index_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
        uint64_t at_key = c.pos();
        std::string_view key = c.read_string("metadata key");
        if (key.empty()) throw GGUFError("empty metadata key", at_key);
        if (!valid_utf8(key)) throw GGUFError("metadata key is not valid UTF-8", at_key);
        if (!key_index_.emplace(key, metadata_.size()).second)
            throw GGUFError("duplicate metadata key " + quoted(key), at_key);
        GgufValueType type = read_value_type(c, "metadata value type");
        uint64_t at_value = c.pos();
        GgufValue value = read_value(c, type, 0);
        if (key == "general.alignment") {
            const uint32_t* a = std::get_if<uint32_t>(&value);
            if (!a)
                throw GGUFError(
                    std::string("general.alignment must be a uint32, not ") + value_type_name(uint32_t(type)),
                    at_value);
            if (*a == 0 || (*a & (*a - 1)) != 0)
                throw GGUFError("general.alignment " + std::to_string(*a) + " is not a nonzero power of two",
                                at_value);
            alignment_ = *a;
        }
        metadata_.emplace_back(key, std::move(value));
    }

    // ---- tensor infos
    tensors_.reserve(n_tensors);
    tensor_index_.reserve(n_tensors);
    std::vector<uint64_t> offset_field(n_tensors);  // where each tensor's offset was read, for errors
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensor t;
        uint64_t at_name = c.pos();
        t.name = c.read_string("tensor name");
        if (!valid_utf8(t.name)) throw GGUFError("tensor name is not valid UTF-8", at_name);
        if (!tensor_index_.emplace(t.name, tensors_.size()).second)
            throw GGUFError("duplicate tensor name " + quoted(t.name), at_name);
        uint64_t at = c.pos();
        t.n_dims = c.read<uint32_t>("tensor n_dims");
        if (t.n_dims == 0 || t.n_dims > kMaxDims)
            throw GGUFError("tensor " + quoted(t.name) + " has " + std::to_string(t.n_dims) +
                                " dimensions (must be 1..4)",
                            at);
        t.n_elements = 1;
        for (uint32_t d = 0; d < t.n_dims; ++d) {
            at = c.pos();
            t.ne[d] = c.read<uint64_t>("tensor dimension");
            if (t.ne[d] == 0) throw GGUFError("tensor " + quoted(t.name) + " has a zero dimension", at);
            if (mul_overflows(t.n_elements, t.ne[d], &t.n_elements) || t.n_elements > uint64_t(INT64_MAX))
                throw GGUFError("tensor " + quoted(t.name) + " element count overflows 63 bits", at);
        }
        at = c.pos();
        t.type = c.read<uint32_t>("tensor type");
        const TypeTraits* tt = type_traits(t.type);
        if (!tt)
            throw GGUFError("tensor " + quoted(t.name) + " has unknown type id " + std::to_string(t.type),
                            at);
        if (t.ne[0] % uint64_t(tt->block_elems) != 0)
            throw GGUFError("tensor " + quoted(t.name) + " row length " + std::to_string(t.ne[0]) +
                                " is not a multiple of the " + std::string(tt->name) + " block size " +
                                std::to_string(tt->block_elems),
                            at);
        if (mul_overflows(t.ne[0] / uint64_t(tt->block_elems), uint64_t(tt->block_bytes), &t.row_bytes) ||
            mul_overflows(t.row_bytes, t.n_elements / t.ne[0], &t.nbytes))
            throw GGUFError("tensor " + quoted(t.name) + " byte size overflows 64 bits", at);
        offset_field[i] = c.pos();
        t.offset = c.read<uint64_t>("tensor offset");
        tensors_.push_back(t);
    }

    // ---- tensor data: aligned, inside the file, not overlapping
    uint64_t end_of_header = c.pos();
    data_offset_ =
        (end_of_header + alignment_ - 1) / alignment_ * alignment_;  // cannot overflow: header < 2^63
    for (size_t i = 0; i < tensors_.size(); ++i) {
        GgufTensor& t = tensors_[i];
        if (t.offset % alignment_ != 0)
            throw GGUFError("tensor " + quoted(t.name) + " data offset " + std::to_string(t.offset) +
                                " is not a multiple of the alignment " + std::to_string(alignment_),
                            offset_field[i]);
        uint64_t abs;
        if (__builtin_add_overflow(data_offset_, t.offset, &abs) || abs > size_ || t.nbytes > size_ - abs)
            throw GGUFError("tensor " + quoted(t.name) + " data (" + std::to_string(t.nbytes) +
                                " bytes at data offset " + std::to_string(t.offset) +
                                ") lies outside the file of " + std::to_string(size_) + " bytes",
                            offset_field[i]);
        t.offset = abs;
    }
    std::vector<size_t> order(tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
        const GgufTensor& prev = tensors_[order[k - 1]];
        const GgufTensor& cur = tensors_[order[k]];
        if (prev.offset + prev.nbytes > cur.offset)
            throw GGUFError("tensor data of " + quoted(prev.name) + " and " + quoted(cur.name) + " overlap",
                            offset_field[order[k]]);
    }
}

}  // namespace regolith
