// Typed reads of GGUF metadata for model loaders, with ModelFormatError naming the key on a missing key
// or a value of the wrong kind. Integers of any width and sign read as int64 (a uint64 above INT64_MAX is an
// error, never wrapped); floats are FLOAT32 or FLOAT64 values only (as llama.cpp reads them: an integer is
// not a float).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf_set.h"

namespace regolith::meta {

std::optional<int64_t> get_int(const GgufSet& f, const std::string& key);
int64_t require_int(const GgufSet& f, const std::string& key);
// require_int, and the value must be > 0.
int64_t require_positive_int(const GgufSet& f, const std::string& key);
float require_float(const GgufSet& f, const std::string& key);
std::optional<float> get_float(const GgufSet& f, const std::string& key);
std::optional<bool> get_bool(const GgufSet& f, const std::string& key);
std::string require_string(const GgufSet& f, const std::string& key);
std::optional<std::string> get_string(const GgufSet& f, const std::string& key);
// Checks general.architecture == arch (ModelFormatError "architecture 'x' is not supported by the <arch>
// loader" otherwise) and returns the key prefix "<arch>.".
std::string require_arch(const GgufSet& f, const std::string& arch);
// An integer array, or a scalar integer broadcast to `n` elements when n > 0 (llama.cpp's "key or array").
// With n > 0 an array must have exactly n elements. BOOL elements read as 0 / 1 only when allow_bool.
std::optional<std::vector<int64_t>> get_int_array(const GgufSet& f, const std::string& key, int64_t n = 0,
                                                  bool allow_bool = false);

}  // namespace regolith::meta
