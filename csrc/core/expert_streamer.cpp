#include "core/expert_streamer.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

#include "core/errors.h"

namespace regolith {

ExpertStreamer::ExpertStreamer(const std::vector<std::string>& paths, int io_threads, bool direct) {
    if (io_threads < 1 || io_threads > 64) throw Error("io_threads must be in [1, 64]");
    for (const std::string& p : paths) files_.push_back(std::make_unique<DirectFile>(p, O_RDONLY, direct));
    for (int i = 0; i < io_threads; ++i) threads_.emplace_back([this] { worker(); });
}

ExpertStreamer::~ExpertStreamer() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_.notify_all();
    for (auto& t : threads_) t.join();
}

void ExpertStreamer::submit(ReadJob job, IoPriority priority) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        queues_[int(priority)].push_back(std::move(job));
    }
    work_.notify_one();
}

bool ExpertStreamer::promote(int64_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int p = 1; p < 3; ++p) {
        auto& q = queues_[p];
        auto it = std::find_if(q.begin(), q.end(), [&](const ReadJob& j) { return j.slot == slot; });
        if (it == q.end()) continue;
        queues_[0].push_back(std::move(*it));
        q.erase(it);
        return true;
    }
    return false;
}

size_t ExpertStreamer::queued(IoPriority priority) const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (int p = 0; p <= int(priority); ++p) n += queues_[p].size();
    return n;
}

void ExpertStreamer::worker() {
    for (;;) {
        ReadJob job;
        {
            std::unique_lock<std::mutex> lock(mu_);
            work_.wait(lock, [&] { return stop_ || !queues_[0].empty() || !queues_[1].empty() || !queues_[2].empty(); });
            if (stop_) return;
            for (auto& q : queues_) {
                if (q.empty()) continue;
                job = std::move(q.front());
                q.pop_front();
                break;
            }
        }
        uint64_t bytes = 0;
        std::exception_ptr error;
        try {
            if (job.before_write) job.before_write();
            for (const ReadExtent& e : job.extents) {
                DirectFile& file = *files_[e.file];
                const size_t got = file.read_at(job.dst + e.slot_offset, size_t(e.bytes), e.offset);
                bytes += got;
                if (got < e.needed)
                    throw IoError(EIO, file.path(), "reading an expert record at byte " + std::to_string(e.offset) +
                                                       ": unexpected end of file (truncated?)");
            }
        } catch (...) {
            error = std::current_exception();
        }
        job.done(job.slot, bytes, error);
    }
}

}  // namespace regolith
