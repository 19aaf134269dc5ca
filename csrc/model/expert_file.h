// Where a qwen4exp model's routed experts lie on disk: in place in a GGUF's stacked *_exps tensors (three
// reads per record), or in a packed experts.bin (docs/formats.md: one 16 KiB-aligned, checksummed
// [gate | up | down] record per (layer, expert)).
#pragma once

#include <cstdint>
#include <memory>
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

// The arena a model of `n_layer` layers streams `n_block` blocks' experts through (n_block > n_layer where
// draft-head blocks follow the main layers), from the pack or the GGUF as `options` say; null when
// options.arena.slots is 0 (resident experts). Throws Error for a packed model without slots.
std::unique_ptr<ExpertArena> open_expert_arena(const GgufSet& file, int64_t n_block, int64_t n_layer,
                                               const MoeShape& shape, const ExpertLoadOptions& options,
                                               Backend& backend);

}  // namespace regolith
