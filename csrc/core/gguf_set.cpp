#include "core/gguf_set.h"

#include <variant>

#include "core/errors.h"

namespace regolith {
namespace {

// An integer metadata value of any width (gguf-split writes split.no / split.count as u16, split.tensors.count as
// i32); -1 when absent or not an integer.
std::string_view string_value(const GgufFile& f, std::string_view key) {
    const GgufValue* v = f.find(key);
    const auto* s = v ? std::get_if<std::string_view>(v) : nullptr;
    return s ? *s : std::string_view();
}

int64_t int_value(const GgufFile& f, std::string_view key) {
    const GgufValue* v = f.find(key);
    if (!v) return -1;
    return std::visit(
        [](const auto& x) -> int64_t {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
                return int64_t(x);
            else
                return -2;
        },
        static_cast<const GgufVariant&>(*v));
}

}  // namespace

GgufSet::GgufSet(const std::vector<std::vector<std::string>>& groups) {
    if (groups.empty() || groups.front().empty()) throw Error("GgufSet: no model file given");
    const bool several = groups.size() > 1 || groups.front().size() > 1;
    for (const auto& g : groups) add_group(g, several);
}

void GgufSet::add_group(const std::vector<std::string>& shards, bool name_files) {
    if (shards.empty()) throw Error("GgufSet: a side file with no path");
    const size_t first = files_.size();
    const int64_t n = int64_t(shards.size());
    int64_t n_tensors = 0, declared = -1;
    for (int64_t i = 0; i < n; ++i) {
        const std::string& path = shards[size_t(i)];
        try {
            files_.push_back(std::make_unique<GgufFile>(path));
        } catch (const GGUFError& e) {
            if (!name_files) throw;
            throw GGUFError(path + ": ", e);  // which of the model's files is malformed
        }
        paths_.push_back(path);
        const GgufFile& f = *files_.back();
        const int64_t no = int_value(f, "split.no"), count = int_value(f, "split.count");
        const int64_t total = int_value(f, "split.tensors.count");
        if (no < -1 || count < -1 || total < -1)
            throw ModelFormatError(path + ": split.no, split.count and split.tensors.count must be integers");
        if (n == 1) {
            if (count > 1)
                throw ModelFormatError(path + " is shard " + std::to_string(no + 1) + " of " + std::to_string(count) +
                                       " of a split model; the other shards are missing (shards are found by "
                                       "their names, <prefix>-00001-of-" + std::to_string(count) + ".gguf ...)");
        } else {
            const std::string where = path + " (shard " + std::to_string(i + 1) + " of " + std::to_string(n) + ")";
            if (count < 0 || no < 0 || total < 0)
                throw ModelFormatError(where + " is not a shard of a split model (no split.* keys)");
            if (count != n)
                throw ModelFormatError(where + " belongs to a set of " + std::to_string(count) + " shards");
            if (no != i)
                throw ModelFormatError(where + " says it is shard " + std::to_string(no + 1) + " (split.no " +
                                       std::to_string(no) + ")");
            if (i == 0) declared = total;
            if (total != declared)
                throw ModelFormatError(where + " is from another set: split.tensors.count " + std::to_string(total) +
                                       ", the first shard says " + std::to_string(declared));
        }
        if (first > 0 && i == 0) {
            const std::string_view arch = string_value(f, "general.architecture");
            const std::string_view main_arch = string_value(main(), "general.architecture");
            if (arch != main_arch)
                throw ModelFormatError(path + ": a side file of a '" + std::string(main_arch) + "' model, but its "
                                       "architecture is '" + std::string(arch) + "'");
        }
        const uint32_t index = uint32_t(files_.size() - 1);
        for (const GgufTensor& t : f.tensors()) {
            const auto [it, added] = index_.emplace(t.name, tensors_.size());
            if (!added)
                throw ModelFormatError(path + ": tensor '" + std::string(t.name) + "' is also in " +
                                       paths_[tensors_[it->second].file]);
            tensors_.push_back(t);
            tensors_.back().file = index;
        }
        n_tensors += int64_t(f.tensors().size());
    }
    if (n > 1 && n_tensors != declared)
        throw ModelFormatError(paths_[first] + ": the set's " + std::to_string(n) + " shards hold " +
                               std::to_string(n_tensors) + " tensors, split.tensors.count says " +
                               std::to_string(declared) + " (a shard from another set?)");
}

const GgufTensor* GgufSet::find_tensor(std::string_view name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace regolith
