#pragma once

#include <cstddef>
#include <cstdint>

namespace regolith::cpu {

// Reads every byte of data once on the default thread pool and returns an XOR checksum (so the reads
// cannot be optimised away). Timing it gives the machine's achievable read bandwidth.
uint64_t read_all(const uint8_t* data, size_t nbytes);

}  // namespace regolith::cpu
