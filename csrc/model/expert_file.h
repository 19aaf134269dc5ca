// Where a qwen4exp model's routed experts lie on disk: in place in a GGUF's stacked *_exps tensors (three
// reads per record), or in a packed experts.bin (docs/formats.md: one 16 KiB-aligned, checksummed
// [gate | up | down] record per (layer, expert)).
#pragma once

#include <cstdint>
#include <string>

#include "core/expert_arena.h"
#include "core/gguf_set.h"
#include "model/moe.h"

namespace regolith {

constexpr char kExpertsMagic[8] = {'R', 'G', 'E', 'X', 'P', 'E', 'R', 'T'};
constexpr uint32_t kExpertsVersion = 1;

// The layout of blk.N.ffn_{gate,up,down}_exps.weight of every layer of `file`, each read from whichever of the
// model's files holds it. Throws ModelFormatError for missing or mis-shaped tensors.
ExpertFileLayout expert_layout_from_gguf(const GgufSet& file, int64_t n_layer, const MoeShape& shape);

// The layout of a packed experts.bin, validated against the model's shape: magic, version, header checksum,
// every matrix's type and shape, every record inside the file and aligned. Throws ModelFormatError saying
// what is wrong (IoError when the file cannot be read).
ExpertFileLayout expert_layout_from_pack(const std::string& path, int64_t n_layer, const MoeShape& shape);

}  // namespace regolith
