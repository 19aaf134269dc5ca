#include "model/state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "core/crc32c.h"
#include "core/direct_file.h"
#include "core/errors.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "state files are little-endian, written as the host stores them");

namespace regolith {

namespace {

constexpr char kMagic[8] = {'R', 'G', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr uint64_t kAlign = kDirectAlign;  // part offsets, request offsets and lengths (O_DIRECT)
constexpr size_t kChunk = size_t(4) << 20;  // bytes per read or write request
constexpr uint64_t kFixed = 104;            // header bytes before the token ids
constexpr uint64_t kEntryBytes = 32;
constexpr uint64_t kMaxHead = uint64_t(1) << 32;
constexpr uint32_t kMaxParts = 1u << 20;

// Runs fn(i, buffer) for i in [0, n) on up to `threads` threads, each with its own kChunk buffer; rethrows
// the first exception (the other threads stop taking work).
template <class F>
int run_parts(size_t n, int threads, const F& fn) {
    const int t = int(std::max<size_t>(1, std::min<size_t>(n, size_t(std::max(threads, 1)))));
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;
    std::mutex error_mutex;
    const auto work = [&] {
        try {
            AlignedBuffer buf(kChunk);
            for (size_t i; !failed && (i = next++) < n;) fn(i, buf);
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!error) error = std::current_exception();
            failed = true;
        }
    };
    std::vector<std::thread> pool;
    for (int k = 1; k < t; ++k) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    if (error) std::rethrow_exception(error);
    return t;
}

template <class T>
void put(std::vector<uint8_t>& b, uint64_t off, const T& v) {
    std::memcpy(&b[size_t(off)], &v, sizeof(T));
}

template <class T>
T get(const std::vector<uint8_t>& b, uint64_t off) {
    T v;
    std::memcpy(&v, &b[size_t(off)], sizeof(T));
    return v;
}

// Streams a part's spans into the file at entry.offset through buf, padded with zeros to kAlign; returns
// the CRC32C of the part's bytes.
uint32_t write_part(const DirectFile& f, const StatePart& part, uint64_t offset, AlignedBuffer& buf) {
    uint8_t* b = buf.data.get();
    size_t fill = 0;
    uint32_t crc = 0;
    for (const StateSpan& s : part.spans) {
        crc = crc32c(crc, s.data, s.bytes);
        for (size_t done = 0; done < s.bytes;) {
            const size_t n = std::min(s.bytes - done, buf.size - fill);
            std::memcpy(b + fill, s.data + done, n);
            fill += n, done += n;
            if (fill == buf.size) {
                f.write_at(b, fill, offset);
                offset += fill, fill = 0;
            }
        }
    }
    if (fill > 0) {
        const size_t padded = size_t(align_up(fill));
        std::memset(b + fill, 0, padded - fill);
        f.write_at(b, padded, offset);
    }
    return crc;
}

// Reads entry's bytes into the part's spans through buf, checking the CRC32C.
void read_part(const DirectFile& f, const StatePart& part, const StatePartEntry& e, AlignedBuffer& buf) {
    uint8_t* b = buf.data.get();
    uint64_t offset = e.offset, left = e.bytes;
    size_t avail = 0, used = 0;
    uint32_t crc = 0;
    for (const StateSpan& s : part.spans) {
        for (size_t done = 0; done < s.bytes;) {
            if (used == avail) {
                const size_t want = size_t(std::min<uint64_t>(buf.size, align_up(left)));
                const size_t got = f.read_at(b, want, offset);
                if (got < std::min<uint64_t>(want, left))
                    throw StateError(f.path() + " is truncated in part " + state_part_name(e.kind, e.layer));
                avail = size_t(std::min<uint64_t>(want, left)), used = 0;
                offset += want, left -= avail;
            }
            const size_t n = std::min(s.bytes - done, avail - used);
            std::memcpy(s.data + done, b + used, n);
            crc = crc32c(crc, b + used, n);
            used += n, done += n;
        }
    }
    if (crc != e.crc)
        throw StateError(f.path() + ": part " + state_part_name(e.kind, e.layer) +
                         " is corrupt (CRC32C mismatch)");
}

const char* dtype_name(StateDtype d) {
    switch (d) {
        case StateDtype::F32:
            return "f32";
        case StateDtype::F16:
            return "f16";
        case StateDtype::Mixed:
            return "mixed (f32 caches)";
        case StateDtype::Q8_0:
            return "q8_0";
        case StateDtype::I8:
            return "i8";
    }
    return "unknown";
}

}  // namespace

StateIoStats write_state_file(const std::string& path, const StateHeader& head,
                              const std::vector<StatePart>& parts, const StateIo& io) {
    const uint64_t n = uint64_t(head.n());
    if (head.arch.size() > 15)
        throw Error("state file: architecture name '" + head.arch + "' is over 15 bytes");
    if (head.from < 0 || uint64_t(head.from) > n)
        throw Error("state file: from " + std::to_string(head.from) + " is outside [0, " + std::to_string(n) +
                    "]");
    if (head.meta.size() > 0xFFFFFFFFu || parts.size() > kMaxParts)
        throw Error("state file: header too large");

    // layout: fixed fields, token ids, metadata, the part table (8-aligned), then the parts (4 KiB-aligned)
    const uint64_t table = align_up(kFixed + 4 * n + head.meta.size(), 8);
    const uint64_t head_bytes = table + kEntryBytes * parts.size();
    std::vector<StatePartEntry> entries;
    uint64_t end = align_up(head_bytes);
    for (const StatePart& p : parts) {
        entries.push_back({p.kind, p.layer, p.dtype, 0, end, p.bytes()});
        end = align_up(end + entries.back().bytes);
    }

    DirectFile f(path, O_WRONLY | O_CREAT | O_TRUNC, io.direct);
    f.preallocate(end);
    StateIoStats stats;
    stats.threads = run_parts(parts.size(), io.threads, [&](size_t i, AlignedBuffer& buf) {
        entries[i].crc = write_part(f, parts[i], entries[i].offset, buf);
    });

    std::vector<uint8_t> h(size_t(align_up(head_bytes)), 0);
    std::memcpy(&h[0], kMagic, 8);
    put<uint32_t>(h, 8, kStateVersion);
    put<uint64_t>(h, 16, head_bytes);
    put<uint64_t>(h, 24, end);
    std::memcpy(&h[32], head.fingerprint.data(), 32);
    std::memcpy(&h[64], head.arch.data(), head.arch.size());
    put<int64_t>(h, 80, int64_t(n));
    put<int64_t>(h, 88, head.from);
    put<uint32_t>(h, 96, uint32_t(parts.size()));
    put<uint32_t>(h, 100, uint32_t(head.meta.size()));
    if (n > 0) std::memcpy(&h[kFixed], head.tokens.data(), size_t(4 * n));
    if (!head.meta.empty()) std::memcpy(&h[size_t(kFixed + 4 * n)], head.meta.data(), head.meta.size());
    for (size_t i = 0; i < entries.size(); ++i) {
        const StatePartEntry& e = entries[i];
        const uint64_t o = table + kEntryBytes * i;
        put<uint32_t>(h, o, uint32_t(e.kind));
        put<uint32_t>(h, o + 4, e.layer);
        put<uint32_t>(h, o + 8, uint32_t(e.dtype));
        put<uint32_t>(h, o + 12, e.crc);
        put<uint64_t>(h, o + 16, e.offset);
        put<uint64_t>(h, o + 24, e.bytes);
    }
    put<uint32_t>(h, 12, crc32c(0, &h[16], size_t(head_bytes - 16)));
    AlignedBuffer hb(h.size());
    std::memcpy(hb.data.get(), h.data(), h.size());
    f.write_at(hb.data.get(), h.size(), 0);
    f.sync();
    stats.direct = f.direct();
    f.close();
    stats.bytes = end;
    return stats;
}

StateHeader read_state_header(const std::string& path) {
    DirectFile f(path, O_RDONLY, false);
    const uint64_t size = f.size();
    std::vector<uint8_t> h(static_cast<size_t>(kFixed));
    const size_t got = f.read_at(h.data(), h.size(), 0);
    if (std::memcmp(h.data(), kMagic, std::min<size_t>(got, 8)) != 0 || got == 0)
        throw StateError(path + " is not a regolith window state file (bad magic)");
    if (got < kFixed) throw StateError(path + " is truncated: " + std::to_string(size) + " bytes");
    StateHeader head;
    head.version = get<uint32_t>(h, 8);
    if (head.version < kStateOldestVersion || head.version > kStateVersion)
        throw StateError(path + " is a version " + std::to_string(head.version) +
                         " state file; this regolith reads versions " + std::to_string(kStateOldestVersion) +
                         " to " + std::to_string(kStateVersion));
    const auto head_bytes = get<uint64_t>(h, 16);
    head.file_bytes = get<uint64_t>(h, 24);
    if (size < head.file_bytes)
        throw StateError(path + " is truncated: " + std::to_string(size) + " of " +
                         std::to_string(head.file_bytes) + " bytes");
    if (size > head.file_bytes)
        throw StateError(path + " has " + std::to_string(size) + " bytes; its header says " +
                         std::to_string(head.file_bytes));
    const auto corrupt = [&](const std::string& what) {
        return StateError(path + ": corrupt header (" + what + ")");
    };
    if (head_bytes < kFixed || head_bytes > head.file_bytes || head_bytes > kMaxHead)
        throw corrupt("header length " + std::to_string(head_bytes));
    h.resize(size_t(head_bytes));
    if (f.read_at(h.data() + kFixed, size_t(head_bytes - kFixed), kFixed) != head_bytes - kFixed)
        throw StateError(path + " is truncated in its header");
    if (crc32c(0, &h[16], size_t(head_bytes - 16)) != get<uint32_t>(h, 12)) throw corrupt("CRC32C mismatch");

    std::memcpy(head.fingerprint.data(), &h[32], 32);
    head.arch.assign(reinterpret_cast<const char*>(&h[64]),
                     strnlen(reinterpret_cast<const char*>(&h[64]), 16));
    const auto n = get<int64_t>(h, 80);
    head.from = get<int64_t>(h, 88);
    const auto n_parts = get<uint32_t>(h, 96);
    const auto meta_bytes = get<uint32_t>(h, 100);
    // Checked against each other in unsigned 64-bit sums that cannot wrap: n and the part count are bounded
    // by the header's length first.
    if (n < 0 || uint64_t(n) > head_bytes / 4 || head.from < 0 || head.from > n || n_parts > kMaxParts)
        throw corrupt("token or part counts");
    const uint64_t table = align_up(kFixed + 4 * uint64_t(n) + meta_bytes, 8);
    if (table + kEntryBytes * n_parts != head_bytes) throw corrupt("section lengths");
    head.tokens.resize(size_t(n));
    if (n > 0) std::memcpy(head.tokens.data(), &h[kFixed], size_t(4 * n));
    head.meta.assign(reinterpret_cast<const char*>(&h[size_t(kFixed + 4 * n)]), meta_bytes);
    uint64_t end = align_up(head_bytes);
    for (uint32_t i = 0; i < n_parts; ++i) {
        const uint64_t o = table + kEntryBytes * i;
        StatePartEntry e{
            StateKind(get<uint32_t>(h, o)), get<uint32_t>(h, o + 4),  StateDtype(get<uint32_t>(h, o + 8)),
            get<uint32_t>(h, o + 12),       get<uint64_t>(h, o + 16), get<uint64_t>(h, o + 24)};
        const uint32_t kind = uint32_t(e.kind), dtype = uint32_t(e.dtype);
        if (kind < uint32_t(StateKind::Kv) || kind > uint32_t(StateKind::Logits) ||
            dtype > uint32_t(StateDtype::I8))
            throw corrupt("part " + std::to_string(i) + " has kind " + std::to_string(kind) + ", dtype " +
                          std::to_string(dtype));
        if (e.offset != end || e.offset > head.file_bytes || e.bytes > head.file_bytes - e.offset)
            throw corrupt("part " + std::to_string(i) + " at " + std::to_string(e.offset) + " of " +
                          std::to_string(e.bytes) + " bytes");
        end = align_up(e.offset + e.bytes);
        head.parts.push_back(e);
    }
    if (end != head.file_bytes) throw corrupt("file length " + std::to_string(head.file_bytes));
    return head;
}

StateIoStats read_state_parts(const std::string& path, const StateHeader& head,
                              const std::vector<StatePart>& parts, const StateIo& io) {
    std::map<std::pair<uint32_t, uint32_t>, const StatePartEntry*> by_key;
    for (const StatePartEntry& e : head.parts) by_key[{uint32_t(e.kind), e.layer}] = &e;
    std::vector<const StatePartEntry*> entries;
    uint64_t bytes = 0;
    for (const StatePart& p : parts) {
        const std::string name = state_part_name(p.kind, p.layer);
        const auto it = by_key.find({uint32_t(p.kind), p.layer});
        if (it == by_key.end()) throw StateError(path + " has no part " + name + "; the window has one");
        const StatePartEntry& e = *it->second;
        if (e.dtype != p.dtype && p.kind == StateKind::Qsa)
            throw StateError(path + ": part " + name + " was saved with " + dtype_name(e.dtype) +
                             " attention caches; this window's are " + dtype_name(p.dtype) +
                             " (load the model with that kv_type to restore it)");
        if (e.dtype != p.dtype || e.bytes != p.bytes())
            throw StateError(path + ": part " + name + " holds " + std::to_string(e.bytes) + " bytes of " +
                             dtype_name(e.dtype) + "; this window's holds " + std::to_string(p.bytes()) +
                             " bytes of " + dtype_name(p.dtype));
        entries.push_back(&e);
        bytes += align_up(e.bytes);
    }
    DirectFile f(path, O_RDONLY, io.direct);
    if (f.size() != head.file_bytes) throw StateError(path + " changed since its header was read");
    StateIoStats stats;
    stats.threads = run_parts(parts.size(), io.threads, [&](size_t i, AlignedBuffer& buf) {
        read_part(f, parts[i], *entries[i], buf);
    });
    stats.direct = f.direct();
    stats.bytes = bytes;
    return stats;
}

}  // namespace regolith
