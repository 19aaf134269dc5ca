#include "model/expert_file.h"

#include <fcntl.h>

#include <cstring>
#include <vector>

#include "core/crc32c.h"
#include "core/direct_file.h"
#include "core/errors.h"
#include "core/types.h"
#include "model/weights.h"

namespace regolith {
namespace {

const char* kPartNames[3] = {"gate", "up", "down"};

// (rows, cols) of part i of an expert: gate and up [ff, hidden], down [hidden, ff].
void part_dims(const MoeShape& s, int i, int64_t& rows, int64_t& cols) {
    rows = i == 2 ? s.hidden : s.ff_expert;
    cols = i == 2 ? s.ff_expert : s.hidden;
}

template <class T>
T get(const std::vector<uint8_t>& b, size_t off) {
    T v;
    std::memcpy(&v, b.data() + off, sizeof(T));
    return v;
}

}  // namespace

ExpertFileLayout expert_layout_from_gguf(const GgufSet& file, int64_t n_layer, const MoeShape& shape) {
    ExpertFileLayout L;
    for (size_t i = 0; i < file.n_files(); ++i) L.paths.push_back(file.path(i));
    L.n_layer = n_layer;
    L.n_expert = shape.n_expert;
    L.offsets.resize(size_t(n_layer * shape.n_expert * 3));
    const char* names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int64_t l = 0; l < n_layer; ++l) {
        std::array<ExpertMatrixShape, 3> parts;
        std::array<uint32_t, 3> files;
        for (int i = 0; i < 3; ++i) {
            int64_t rows, cols;
            part_dims(shape, i, rows, cols);
            const std::string name = "blk." + std::to_string(l) + "." + names[i] + ".weight";
            const GgufTensor& t = stacked_tensor(file, name, shape.n_expert, rows, cols);  // validates the shape
            const uint64_t bytes = uint64_t(rows) * t.row_bytes;
            parts[size_t(i)] = {t.type, rows, cols, t.row_bytes, bytes};
            const uint64_t base = t.offset;  // absolute offset in the file holding it
            files[size_t(i)] = t.file;
            for (int64_t e = 0; e < shape.n_expert; ++e)
                L.offsets[size_t((l * shape.n_expert + e) * 3 + i)] = base + uint64_t(e) * bytes;
        }
        L.layers.push_back(parts);
        L.files.push_back(files);
    }
    return L;
}

ExpertFileLayout expert_layout_from_pack(const std::string& path, int64_t n_layer, const MoeShape& shape) {
    DirectFile f(path, O_RDONLY, false);
    const uint64_t size = f.size();
    auto bad = [&](const std::string& what) -> ModelFormatError { return ModelFormatError(path + ": " + what); };
    constexpr size_t kFixed = 56, kPart = 32, kEntry = 16;
    std::vector<uint8_t> head(kFixed);
    if (size < kFixed || f.read_at(head.data(), kFixed, 0) != kFixed) throw bad("too short for an experts file");
    if (std::memcmp(head.data(), kExpertsMagic, 8) != 0) throw bad("not a regolith experts file (bad magic)");
    const uint32_t version = get<uint32_t>(head, 8);
    if (version != kExpertsVersion)
        throw bad("experts file version " + std::to_string(version) + " (this regolith reads " +
                  std::to_string(kExpertsVersion) + ")");
    const uint32_t nl = get<uint32_t>(head, 12), ne = get<uint32_t>(head, 16), align = get<uint32_t>(head, 20);
    const uint64_t index_off = get<uint64_t>(head, 24), data_off = get<uint64_t>(head, 32);
    const uint64_t file_bytes = get<uint64_t>(head, 40);
    const uint32_t head_crc = get<uint32_t>(head, 48);
    if (int64_t(nl) != n_layer || int64_t(ne) != shape.n_expert)
        throw bad("holds " + std::to_string(nl) + " layers x " + std::to_string(ne) + " experts; the model has " +
                  std::to_string(n_layer) + " x " + std::to_string(shape.n_expert));
    if (file_bytes != size)
        throw bad("is " + std::to_string(size) + " bytes, its header says " + std::to_string(file_bytes) +
                  " (truncated or appended to)");
    if (align < kDirectAlign || (align & (align - 1)) != 0) throw bad("bad record alignment " + std::to_string(align));
    const uint64_t n_rec = uint64_t(nl) * ne, table_end = kFixed + uint64_t(nl) * 3 * kPart;
    if (index_off < table_end || index_off + n_rec * kEntry > data_off || data_off > size || data_off % align != 0)
        throw bad("inconsistent header (index or data offset)");

    std::vector<uint8_t> meta(size_t(index_off + n_rec * kEntry));
    if (f.read_at(meta.data(), meta.size(), 0) != meta.size()) throw bad("truncated header");
    uint32_t crc = crc32c(0, meta.data(), 48);
    crc = crc32c(crc, meta.data() + kFixed, meta.size() - kFixed);
    if (crc != head_crc) throw bad("header checksum mismatch (the file is corrupt)");

    ExpertFileLayout L;
    L.paths = {path};
    L.files.assign(size_t(n_layer), {0, 0, 0});
    L.n_layer = n_layer;
    L.n_expert = shape.n_expert;
    L.contiguous = true;
    for (int64_t l = 0; l < n_layer; ++l) {
        std::array<ExpertMatrixShape, 3> parts;
        for (int i = 0; i < 3; ++i) {
            const size_t at = kFixed + size_t((l * 3 + i) * kPart);
            ExpertMatrixShape& m = parts[size_t(i)];
            m.type = get<uint32_t>(meta, at);
            m.rows = int64_t(get<uint64_t>(meta, at + 8));
            m.cols = int64_t(get<uint64_t>(meta, at + 16));
            m.bytes = get<uint64_t>(meta, at + 24);
            int64_t rows, cols;
            part_dims(shape, i, rows, cols);
            const TypeTraits* t = type_traits(m.type);
            const std::string what = "layer " + std::to_string(l) + " " + kPartNames[i];
            if (!t || !t->supported) throw bad(what + ": unsupported type id " + std::to_string(m.type));
            if (m.rows != rows || m.cols != cols || cols % t->block_elems != 0)
                throw bad(what + " is [" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "], expected [" +
                          std::to_string(rows) + ", " + std::to_string(cols) + "]");
            m.row_bytes = uint64_t(type_row_bytes(*t, cols));
            if (m.bytes != uint64_t(rows) * m.row_bytes) throw bad(what + ": byte count disagrees with its shape");
        }
        L.layers.push_back(parts);
    }
    L.offsets.resize(size_t(n_rec * 3));
    L.crcs.resize(size_t(n_rec));
    for (uint64_t r = 0; r < n_rec; ++r) {
        const uint64_t off = get<uint64_t>(meta, size_t(index_off + r * kEntry));
        const int64_t l = int64_t(r / ne);
        const auto& p = L.layers[size_t(l)];
        if (off < data_off || off % align != 0 || off + L.record_bytes(l) > size)
            throw bad("record " + std::to_string(r) + " (layer " + std::to_string(l) + ") lies outside the data");
        L.offsets[size_t(r * 3)] = off;
        L.offsets[size_t(r * 3 + 1)] = off + p[0].bytes;
        L.offsets[size_t(r * 3 + 2)] = off + p[0].bytes + p[1].bytes;
        L.crcs[size_t(r)] = get<uint32_t>(meta, size_t(index_off + r * kEntry + 8));
    }
    return L;
}

std::unique_ptr<ExpertArena> open_expert_arena(const GgufSet& file, int64_t n_block, int64_t n_layer,
                                               const MoeShape& shape, const ExpertLoadOptions& options,
                                               Backend& backend) {
    const bool packed = !options.experts_path.empty();
    if (packed && options.arena.slots <= 0)
        throw Error("a packed model streams its experts: the arena needs at least one slot");
    if (options.arena.slots <= 0) return nullptr;
    ExpertFileLayout layout = packed ? expert_layout_from_pack(options.experts_path, n_block, shape)
                                     : expert_layout_from_gguf(file, n_block, shape);
    ArenaOptions arena = options.arena;
    arena.policy.lru_reserve = n_layer * shape.n_used;  // one token's experts always pass through LRU
    return std::make_unique<ExpertArena>(std::move(layout), arena, backend);
}

}  // namespace regolith
