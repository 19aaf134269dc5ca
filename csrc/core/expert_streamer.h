// I/O threads that read expert records from files (a GGUF's shards, or a packed experts.bin) into arena slots.
//
// Three queues in strict priority order: demand (a computation is waiting for the record), prefetch (a
// prediction: lookahead routing), background (warming the arena while it has empty slots). A queued prefetch
// whose record becomes a demand is promoted. Each read is one or a few large pread calls at aligned offsets
// (O_DIRECT where the file system takes it), straight into the slot's memory.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/direct_file.h"

namespace regolith {

enum class IoPriority : int { Demand = 0, Prefetch = 1, Background = 2 };

// One aligned read: bytes [offset, offset + bytes) of file `file` into slot memory at `slot_offset`. Reads past
// the end of the file are allowed only beyond `needed` bytes (the alignment padding of the record's last extent).
struct ReadExtent {
    uint32_t file = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint64_t slot_offset = 0;
    uint64_t needed = 0;
};

struct ReadJob {
    int64_t slot = -1;
    uint8_t* dst = nullptr;                // the slot's memory
    std::vector<ReadExtent> extents;
    // Where set, called on the I/O thread before the read writes to dst (waits until nothing still reads the
    // slot's old record); an exception fails the read.
    std::function<void()> before_write;
    // Called on an I/O thread after the read (error null) or its failure; must not throw.
    std::function<void(int64_t slot, uint64_t bytes, std::exception_ptr error)> done;
};

class ExpertStreamer {
  public:
    ExpertStreamer(const std::vector<std::string>& paths, int io_threads, bool direct);
    ~ExpertStreamer();
    ExpertStreamer(const ExpertStreamer&) = delete;
    ExpertStreamer& operator=(const ExpertStreamer&) = delete;

    bool direct() const { return files_.front()->direct(); }
    void submit(ReadJob job, IoPriority priority);
    // Moves the queued job of `slot` to the demand queue; false when it is not queued (already reading).
    bool promote(int64_t slot);
    // Jobs queued at or above `priority` (not those being read).
    size_t queued(IoPriority priority) const;

  private:
    void worker();

    std::vector<std::unique_ptr<DirectFile>> files_;
    mutable std::mutex mu_;
    std::condition_variable work_;
    std::deque<ReadJob> queues_[3];
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace regolith
