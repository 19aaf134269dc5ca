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
    uint64_t offset;
};

// A well-formed file that does not describe a model regolith can run: a missing tensor or key, a shape
// or constant that contradicts another (-> regolith.errors.ModelFormatError).
struct ModelFormatError : Error {
    using Error::Error;
};

}  // namespace regolith
