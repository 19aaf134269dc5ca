// A window's decoding state as parts of bytes: what model/state_file.h writes to a file and reads back.
// A part is one layer's state (or the logits after the last token); its bytes are its spans' bytes in order,
// in the storage's own types (f32, f16 KV caches, int64 token ids and positions), little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"

namespace regolith {

enum class StateKind : uint32_t {
    Kv = 1,      // dense attention KV cache (positional)
    Qsa = 2,     // QSA keys, values, indexer keys, positions, pooled block keys (positional)
    Gdn = 3,     // Gated DeltaNet conv history and recurrent state (whole)
    Ple = 4,     // PLE n-gram context and conv history (whole)
    Logits = 5,  // f32 logits after the last token (whole, optional)
};

// A part's storage type. A QSA part's names its attention caches: Mixed for f32 (its positions are I64), F16,
// Q8_0, I8 (then also F32 row scales); a dense KV part's is F32 or F16.
enum class StateDtype : uint32_t { F32 = 0, F16 = 1, Mixed = 2, Q8_0 = 3, I8 = 4 };

// The dtype of a QSA part whose caches are of this type (F32, F16, Q8_0, I8).
StateDtype qsa_state_dtype(uint32_t cache_type);
// The dtype of a dense KV part whose cache is of this tensor type (F32, F16, Q8_0, I8).
StateDtype kv_state_dtype(uint32_t cache_type);

struct StateSpan {
    uint8_t* data;
    size_t bytes;
};

struct StatePart {
    StateKind kind;
    uint32_t layer;
    StateDtype dtype;
    std::vector<StateSpan> spans;

    // Positional parts hold the rows of tokens [from, n) only, so a state can be stored as a delta on top of
    // the state of its first `from` tokens; the others hold a whole state that replaces the window's.
    bool positional() const { return kind == StateKind::Kv || kind == StateKind::Qsa; }
    uint64_t bytes() const {
        uint64_t n = 0;
        for (const StateSpan& s : spans) n += s.bytes;
        return n;
    }
};

// A part as the window holds it: each item a view of a backend tensor (packed rows, in order) or host bytes.
struct StateItem {
    Tensor tensor;
    StateSpan host{nullptr, 0};
};
struct TensorPart {
    StateKind kind;
    uint32_t layer;
    StateDtype dtype;
    std::vector<StateItem> items;
};

// The host spans of a window's parts, for the state file. Views of host-addressable backend memory are
// used in place (after waiting for the ops recorded before: Backend::synchronize); the others go through
// host staging, filled from the backend before a save (download) and written back after a restore (upload).
class HostStateParts {
public:
    HostStateParts(Backend& be, const std::vector<TensorPart>& parts);
    std::vector<StatePart>& parts() { return host_; }
    void download();
    void upload();

private:
    struct Staged {
        Tensor tensor;
        std::vector<uint8_t> bytes;
    };
    Backend& be_;
    std::vector<StatePart> host_;
    std::vector<Staged> staged_;
};

// "blk.3 kv" (or "logits"), for messages.
std::string state_part_name(StateKind kind, uint32_t layer);

// What every window checks before restoring: it holds exactly `from` tokens, and from <= n <= max_ctx.
// Throws StateError.
void check_state_import(int64_t from, int64_t n, int64_t n_past, int64_t max_ctx);

}  // namespace regolith
