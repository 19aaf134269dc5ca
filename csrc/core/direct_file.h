// Files read and written in large aligned requests, with O_DIRECT where the file system takes it (the page
// cache is bypassed: streamed expert records and saved states must not evict the resident weights).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace regolith {

constexpr uint64_t kDirectAlign = 4096;  // offset, length and memory alignment O_DIRECT needs

inline uint64_t align_up(uint64_t n, uint64_t a = kDirectAlign) { return (n + a - 1) / a * a; }
inline uint64_t align_down(uint64_t n, uint64_t a = kDirectAlign) { return n / a * a; }

// An open file. Errors are IoError naming the path and the failed call.
class DirectFile {
  public:
    // flags: open(2) flags (O_RDONLY, O_RDWR | O_CREAT | O_TRUNC, ...). With `direct`, O_DIRECT is used when the
    // file system takes it (tmpfs does not: the file is then opened without it).
    DirectFile(const std::string& path, int flags, bool direct);
    ~DirectFile();
    DirectFile(const DirectFile&) = delete;
    DirectFile& operator=(const DirectFile&) = delete;

    bool direct() const { return direct_; }
    const std::string& path() const { return path_; }
    uint64_t size() const;
    void write_at(const uint8_t* p, size_t n, uint64_t off) const;
    // Returns the bytes read: fewer than n only at the end of the file. With O_DIRECT, p, n and off must be
    // multiples of kDirectAlign. Safe to call from several threads.
    size_t read_at(uint8_t* p, size_t n, uint64_t off) const;
    // Allocates the file's blocks up front where the file system can (Linux fallocate; no emulation by
    // writing zeros), so concurrent writes fill allocated space instead of each extending the file.
    void preallocate(uint64_t n) const;
    void sync() const;
    void close();

  private:
    [[noreturn]] void fail(const char* what) const;

    std::string path_;
    int fd_ = -1;
    bool direct_ = false;
};

// A kDirectAlign-aligned heap buffer.
struct AlignedBuffer {
    explicit AlignedBuffer(size_t n);
    struct Free {
        void operator()(uint8_t* p) const;
    };
    std::unique_ptr<uint8_t, Free> data;
    size_t size;
};

}  // namespace regolith
