// Exceptions thrown by the core. The Python layer maps each to its regolith.* exception class.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace regolith {

// Base of all core errors (-> regolith.RegolithError).
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A malformed or unsupported GGUF file (-> regolith.GGUFError). `offset` is the byte offset in the file
// where the problem was found.
struct GGUFError : Error {
    GGUFError(const std::string& what, uint64_t offset)
        : Error(what + " (at byte offset " + std::to_string(offset) + ")"), offset(offset) {}
    // `e` with `context` (e.g. the file's path) before its message.
    GGUFError(const std::string& context, const GGUFError& e) : Error(context + e.what()), offset(e.offset) {}
    uint64_t offset;
};

// A well-formed model file that does not describe a model regolith can run as stated: a missing or
// mis-shaped tensor, inconsistent metadata (-> regolith.ModelFormatError).
struct ModelFormatError : Error {
    using Error::Error;
};

// A saved window state that cannot be restored: not a state file, another version or model, truncated or
// corrupt, or not fitting the window (-> regolith.SessionError).
struct StateError : Error {
    using Error::Error;
};

// A failed system call on a file the caller named (-> OSError, whose subclass errno picks, e.g.
// FileNotFoundError).
struct IoError : Error {
    // reason: what failed and why, e.g. "cannot open: No such file or directory".
    IoError(int err, const std::string& path, const std::string& reason)
        : Error(path + ": " + reason), err(err), path(path), reason(reason) {}
    int err;
    std::string path, reason;
};

// Returns f(); a ModelFormatError it throws is rethrown with `context` (e.g. "PLE: ") before its message, so
// the shared readers' messages ("missing tensor 'blk.3.attn_q.weight'") also say which loader failed.
template <class F>
decltype(auto) with_context(const std::string& context, F&& f) {
    try {
        return f();
    } catch (const ModelFormatError& e) {
        throw ModelFormatError(context + e.what());
    }
}

}  // namespace regolith
