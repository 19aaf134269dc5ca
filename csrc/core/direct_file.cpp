#include "core/direct_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <new>
#include <system_error>

#include "core/errors.h"

namespace regolith {

DirectFile::DirectFile(const std::string& path, int flags, bool direct) : path_(path) {
#ifdef O_DIRECT
    if (direct) {
        fd_ = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0666);
        direct_ = fd_ >= 0;
        if (fd_ < 0 && errno != EINVAL) fail("cannot open");
    }
#endif
    if (fd_ < 0) fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0666);
    if (fd_ < 0) fail("cannot open");
#ifdef __APPLE__
    if (direct) (void)::fcntl(fd_, F_NOCACHE, 1);  // macOS: no O_DIRECT; bypass the unified buffer cache
#endif
}

DirectFile::~DirectFile() {
    if (fd_ >= 0) ::close(fd_);
}

uint64_t DirectFile::size() const {
    struct stat st{};
    if (::fstat(fd_, &st) != 0) fail("cannot stat");
    return uint64_t(st.st_size);
}

void DirectFile::write_at(const uint8_t* p, size_t n, uint64_t off) const {
    while (n > 0) {
        const ssize_t w = ::pwrite(fd_, p, n, off_t(off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail("writing");
        p += w, n -= size_t(w), off += uint64_t(w);
    }
}

size_t DirectFile::read_at(uint8_t* p, size_t n, uint64_t off) const {
    size_t done = 0;
    while (done < n) {
        const ssize_t r = ::pread(fd_, p + done, n - done, off_t(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail("reading");
        if (r == 0) break;
        done += size_t(r);
    }
    return done;
}

void DirectFile::preallocate(uint64_t n) const {
#ifdef __linux__
    if (n > 0) (void)::fallocate(fd_, 0, 0, off_t(n));
#else
    (void)n;
#endif
}

void DirectFile::sync() const {
    if (::fsync(fd_) != 0) fail("syncing");
}

void DirectFile::close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing");
}

void DirectFile::fail(const char* what) const {
    const int err = errno;
    throw IoError(err, path_, std::string(what) + ": " + std::error_code(err, std::generic_category()).message());
}

AlignedBuffer::AlignedBuffer(size_t n) : size(n) {
    void* p = nullptr;
    if (posix_memalign(&p, kDirectAlign, n == 0 ? kDirectAlign : n) != 0) throw std::bad_alloc();
    data.reset(static_cast<uint8_t*>(p));
}

void AlignedBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

}  // namespace regolith
