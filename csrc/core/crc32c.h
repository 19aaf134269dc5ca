// CRC32C (Castagnoli: reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF), the checksum of
// iSCSI, ext4 and SSE4.2's crc32 instruction. crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace regolith {

// The CRC of data[0, n) continuing a CRC `crc` of the bytes before it (0 to start), so
// crc32c(crc32c(0, a, na), b, nb) == crc32c(0, ab, na + nb). Uses the CPU's crc32 instruction when it has
// one.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace regolith
