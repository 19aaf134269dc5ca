// The GGUF files of one model read as one: the main model, whole or split into shards by llama.cpp's gguf-split
// (split.no, split.count, split.tensors.count in every shard; the first shard holds the metadata), and side files
// beside it (each whole or split too) that add tensors kept apart, such as a PLE n-gram table or an MTP head.
//
// The metadata is the main model's first shard's (a side file's own keys are not read, but its
// general.architecture must be the model's). The tensor table is the union of every file's, each name once; a
// tensor's `file` says which file holds it, and its offset is in that file.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/gguf.h"

namespace regolith {

class GgufSet {
  public:
    // groups[0]: the main model's shards in order (one path for a whole file); groups[1..]: the side files, each
    // its shards in order. Throws ModelFormatError naming the file for a shard that is missing from its set, in
    // the wrong place, from another set (split keys that disagree) or a tensor that two files hold; GGUFError /
    // IoError as GgufFile does.
    explicit GgufSet(const std::vector<std::vector<std::string>>& groups);
    explicit GgufSet(const std::string& path) : GgufSet(std::vector<std::vector<std::string>>{{path}}) {}
    GgufSet(const GgufSet&) = delete;
    GgufSet& operator=(const GgufSet&) = delete;

    const GgufFile& main() const { return *files_.front(); }
    size_t n_files() const { return files_.size(); }
    const GgufFile& file(size_t i) const { return *files_[i]; }
    const std::string& path(size_t i) const { return paths_[i]; }

    const std::vector<std::pair<std::string_view, GgufValue>>& metadata() const { return main().metadata(); }
    const GgufValue* find(std::string_view key) const { return main().find(key); }

    // Every file's tensors, the main model's shards first, then each side file's, in file order.
    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* find_tensor(std::string_view name) const;
    const uint8_t* tensor_data(const GgufTensor& t) const { return files_[t.file]->tensor_data(t); }
    const std::string& path(const GgufTensor& t) const { return paths_[t.file]; }

  private:
    void add_group(const std::vector<std::string>& shards, bool name_files);

    std::vector<std::unique_ptr<GgufFile>> files_;
    std::vector<std::string> paths_;
    std::vector<GgufTensor> tensors_;
    std::unordered_map<std::string_view, size_t> index_;
};

}  // namespace regolith
