// Window state files (docs/formats.md, "Window state files"): a header (magic, version, the model's
// fingerprint, architecture, token ids, the caller's metadata, a table of parts with CRC32C checksums) and
// the parts' bytes, each at a 4 KiB-aligned offset. Written and read with several threads in large
// sequential requests, with O_DIRECT where the file system takes it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/window_state.h"

namespace regolith {

// Version 3 added the q8_0 and i8 cache dtypes; version 2 files (f32 / f16 caches) read unchanged.
constexpr uint32_t kStateVersion = 3;
constexpr uint32_t kStateOldestVersion = 2;

struct StatePartEntry {
    StateKind kind;
    uint32_t layer;
    StateDtype dtype;
    uint32_t crc;     // CRC32C of the part's bytes
    uint64_t offset;  // in the file, a multiple of 4096
    uint64_t bytes;
};

struct StateHeader {
    uint32_t version = kStateVersion;
    std::array<uint8_t, 32> fingerprint{};  // the model's (regolith.state computes it); opaque here
    std::string arch;                       // general.architecture, at most 15 bytes
    int64_t from = 0;                       // positional parts hold tokens [from, n)
    std::vector<int32_t> tokens;            // the n token ids the state has seen
    std::string meta;                       // the caller's metadata (a Session's JSON), opaque here
    // Filled when read:
    uint64_t file_bytes = 0;
    std::vector<StatePartEntry> parts;

    int64_t n() const { return int64_t(tokens.size()); }
};

struct StateIo {
    int threads = 4;     // parts are written / read concurrently, one thread per part at a time
    bool direct = true;  // O_DIRECT when the file system supports it
};

struct StateIoStats {
    uint64_t bytes = 0;  // file bytes written or read
    bool direct = false;
    int threads = 0;
};

// Writes `head` (from, tokens, fingerprint, arch, meta) and `parts` to `path`, replacing any file there, and
// fsyncs it. Not atomic by itself: write to a temporary name and rename (regolith._atomic does). Throws
// IoError on a failed write, Error on a header that does not fit the format.
StateIoStats write_state_file(const std::string& path, const StateHeader& head,
                              const std::vector<StatePart>& parts, const StateIo& io = {});

// The header of a state file, checked: magic, version, header checksum, the file's length and a consistent
// part table. Throws StateError saying what is wrong (IoError when the file cannot be opened or read).
StateHeader read_state_header(const std::string& path);

// Fills each of `parts` from the file entry with the same kind and layer (its dtype and length must match),
// checking every part's CRC32C; entries not asked for are skipped. Throws StateError for a missing or
// mismatched part, a checksum mismatch or a file changed since its header was read; spans may then hold
// partial data.
StateIoStats read_state_parts(const std::string& path, const StateHeader& head,
                              const std::vector<StatePart>& parts, const StateIo& io = {});

}  // namespace regolith
