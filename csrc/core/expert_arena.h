// The expert arena: a fixed number of slots in one allocation (locked in RAM where the OS allows), holding
// the routed experts most likely to be used; the rest stay on disk and are read into a slot on demand.
//
// A computation pins the experts it needs (acquire), runs each as soon as its record is in memory
// (ready / wait: per record, never per layer) and unpins them (release). A miss evicts by the cache policy
// (core/expert_cache_policy.h) among unpinned slots and queues a demand read; predictions queue prefetch
// reads; empty slots are warmed in the background with the experts used most so far. The arena never holds
// more than its slots: a layer needing more experts than there are slots runs them in waves.
//
// The slots are one backend buffer (MemoryUse::Arena). Where the backend's memory is host memory (the CPU,
// unified memory) the streamer reads records straight into it; elsewhere into host memory that is written
// to the backend when the read lands: a staging copy of the slots, or, with host_slots > 0, a host tier —
// a second, larger cache of records in host RAM between the device slots and the disk (a device miss whose
// record the host tier holds is one copy, no read). Ops reading a slot are submitted before its pin is
// released, so the slot is not rewritten under them: a copy is ordered after them (Backend::upload), and a
// read straight into the backend's memory first waits until they have run (Backend::wait_submitted: a GPU
// with unified memory may still be running them).
//
// Device-routed mode (expert_arena_routed.cpp; ArenaOptions::device_routed): where the backend takes expert
// slots (Backend::supports_expert_slots, a discrete GPU) and the host tier holds every record, the host tier
// is mapped memory the device reads in place, filled with every record at load. A layer's experts then run on
// the device with no host round trip (SparseMoe through expert_slots()): records in device slots are read
// from there, the others over the bus from the host tier. Between steps, after_step() takes the step's
// routing, counts hits and misses, and copies the policy's choice of missed records into device slots: a
// slot's `where` entry is cleared before its upload starts and set once it has completed, so a step never
// reads a slot being written.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backend.h"
#include "core/buffers.h"
#include "core/direct_file.h"
#include "core/expert_cache_policy.h"
#include "core/expert_streamer.h"

namespace regolith {

// One of a routed expert's three matrices (gate, up, down) as stored: rows x cols elements of a GGUF type.
struct ExpertMatrixShape {
    uint32_t type = 0;
    int64_t rows = 0, cols = 0;
    uint64_t row_bytes = 0, bytes = 0;
};

// Where every (layer, expert) record of a model lies in one file.
struct ExpertFileLayout {
    std::vector<std::string> paths;  // the files holding the records (a split GGUF's shards)
    int64_t n_layer = 0, n_expert = 0;
    std::vector<std::array<ExpertMatrixShape, 3>> layers;  // [n_layer]: gate, up, down
    std::vector<std::array<uint32_t, 3>> files;  // [n_layer]: index into `paths` of gate, up, down
    std::vector<uint64_t> offsets;  // [n_layer][n_expert][3]: offset of gate, up, down in their file
    // Packed files: the three parts are adjacent (one read per record) and crcs[layer][expert] is the CRC32C
    // of the record's bytes. A GGUF read in place: three reads, no checksums (crcs empty).
    bool contiguous = false;
    std::vector<uint32_t> crcs;

    uint64_t record_bytes(int64_t layer) const;
    // Bytes a slot needs for any record of `layer`, alignment padding included.
    uint64_t footprint(int64_t layer) const;
};

struct ArenaOptions {
    int64_t slots = 0;
    int io_threads = 4;
    bool direct = true;  // O_DIRECT (Linux) / F_NOCACHE (macOS) reads
    bool lock = true;    // mlock the slots
    int64_t host_slots = 0;  // records the host tier holds, where the slots are not host memory (0: none)
    // Device-routed mode (see above): an Error where the backend cannot route on the device or the host tier
    // does not hold every record.
    bool device_routed = false;
    CachePolicyOptions policy;
};

struct ArenaStats {
    uint64_t hits = 0, misses = 0;  // acquires that found the record resident / had to wait for a read
    uint64_t host_hits = 0;         // device slots filled from the host tier (no disk read)
    uint64_t prefetches = 0, prefetch_hits = 0;  // prefetch reads issued / later used by a computation
    uint64_t background_reads = 0;
    uint64_t reads = 0, bytes_read = 0;
    double stall_s = 0.0;  // time computations spent waiting for records
    std::vector<uint64_t> layer_hits, layer_misses;
};

struct ExpertWeights {
    Tensor gate, up, down;
};

class ExpertArena {
  public:
    ExpertArena(ExpertFileLayout layout, const ArenaOptions& opt, Backend& backend);
    ~ExpertArena();
    ExpertArena(const ExpertArena&) = delete;
    ExpertArena& operator=(const ExpertArena&) = delete;

    int64_t slots() const { return n_slots_; }
    uint64_t slot_bytes() const { return slot_bytes_; }
    bool locked() const { return locked_; }
    const std::string& lock_error() const { return lock_error_; }
    bool direct() const { return streamer_->direct(); }
    int64_t host_slots() const { return n_host_; }
    bool device_routed() const { return routed_; }
    const ExpertFileLayout& layout() const { return layout_; }

    // Computations take turns: hold this for the whole of a layer's expert work (acquire ... release).
    std::unique_lock<std::mutex> use() { return std::unique_lock<std::mutex>(use_mu_); }
    // Pins expert `expert` of `layer` in a slot and returns the slot; queues a demand read when it is not
    // resident. A caller pins at most slots() experts at a time.
    int64_t acquire(int64_t layer, int64_t expert);
    bool ready(int64_t slot) const;
    // The slot's matrices once its record is in memory; rethrows a failed read (IoError, or ModelFormatError
    // for a record failing its checksum).
    ExpertWeights wait(int64_t slot);
    void release(int64_t slot);

    // Queues reads of the experts of `layer` not resident (predictions: never evicts a pinned or loading
    // slot, and keeps at most a quarter of the slots loading prefetches).
    void prefetch(int64_t layer, const int32_t* experts, int64_t n);
    // Queues background reads of the most used experts into empty slots, while the streamer is idle.
    void warm();
    // mask[e] = 1 when expert e of `layer` is resident or being read.
    void resident_mask(int64_t layer, uint8_t* mask) const;

    // Device-routed mode: layer `layer`'s records as moe_experts takes them, and the I8 [1][n_expert] mask of
    // those in device slots (MoCE's resident experts).
    ExpertSlots expert_slots(int64_t layer) const;
    Tensor routed_mask(int64_t layer) const;
    // Copies layer `layer`'s records from the host tier to dst (device memory, [n_expert][slot_bytes] I8) in
    // one upload ordered before the ops recorded after it that read dst (a prefill chunk's products then read
    // device memory: the copy crosses the bus at the copy engine's speed, products reading in place do not).
    void stage(int64_t layer, const Tensor& dst);
    // After a step of `rows` routing pairs per layer: ids [layers][rows] (the first `layers` layers' expert
    // ids, each layer's pairs in token order). Counts the hits (records in device slots) and misses, points
    // the tables at the slots whose uploads have completed, and starts the uploads of the misses the policy
    // admits (at most one step's worth of layers x k records, so a prefill does not flood the bus).
    void after_step(const int32_t* ids, int64_t layers, int64_t rows);
    // The end of a model's step: a device-routed arena reads the step's routing (`routing`: [layers][rows] I32
    // on the backend, the ids each layer's SparseMoe wrote) and runs after_step; any other arena warms.
    void end_step(const Tensor& routing);

    ArenaStats stats() const;
    // stats().stall_s without copying the per-layer counters (read once per speculative round).
    double stall_seconds() const;
    void reset_stats();

  private:
    enum class State : uint8_t { Empty, Loading, Ready, Failed };
    struct Slot {
        int64_t key = -1;
        State state = State::Empty;
        int pins = 0;
        bool prefetched = false;  // read by a prediction and not yet used
        std::exception_ptr error;
        uint64_t part_offset[3] = {0, 0, 0};  // of gate, up, down in the slot's memory
        int64_t host = -1;                    // the host-tier slot its record is read into, while Loading
        uint64_t reuse_after = 0;             // Backend::submitted() when it was last released
        uint64_t staged_upload = 0;           // the last upload from its staging copy (Backend::upload's ticket)
    };
    struct HostSlot {
        int64_t key = -1;
        bool loading = false;
        uint64_t last_use = 0;
        uint64_t part_offset[3] = {0, 0, 0};
        uint64_t upload = 0;  // the last upload from it (Backend::upload's ticket)
    };

    // Where the streamer reads slot s without a host tier: the slot itself, or its staging copy.
    uint8_t* slot_memory(int64_t s) const { return host_ + uint64_t(s) * slot_bytes_; }
    uint8_t* host_slot_memory(int64_t h) const { return host_tier_->data.get() + uint64_t(h) * slot_bytes_; }
    // Copies `src` (a record's slot bytes in host memory) to device slot s, in stream order; returns the
    // upload's ticket (src stays unchanged until Backend::wait_upload(ticket)).
    uint64_t upload(int64_t s, const uint8_t* src);
    // A host-tier slot for `key` (locked): the least recently used one not being read into.
    int64_t host_victim_locked();
    // Claims a slot for `key` (locked) and queues its read; -1 when no slot may be evicted.
    int64_t load_locked(int64_t key, IoPriority priority, bool pin);
    void on_read(int64_t slot, uint64_t bytes, std::exception_ptr error);
    // Null where record `key` (its bytes at `record`) passes its checksum or the file has none; else the error.
    std::exception_ptr check_record(int64_t key, const uint8_t* record) const;
    // The read of record `key` into dst (slot memory), its parts' offsets in the slot into part_offset.
    ReadJob record_job(int64_t key, uint8_t* dst, uint64_t (&part_offset)[3]) const;
    // Device-routed mode: reads every record into the mapped host tier (at load), then the tables.
    void fill_routed();

    ExpertFileLayout layout_;
    int64_t n_slots_ = 0;
    uint64_t slot_bytes_ = 0;
    Backend& be_;
    Buffer memory_;                      // the slots, [n_slots][slot_bytes]
    std::unique_ptr<AlignedBuffer> staging_;  // where the backend's memory is not host memory, without a host tier
    std::unique_ptr<AlignedBuffer> host_tier_;  // [n_host_][slot_bytes]
    void* pinned_ = nullptr;                    // host_tier_ or staging_, page-locked by the backend
    int64_t n_host_ = 0;
    std::vector<HostSlot> host_slots_;
    std::unordered_map<int64_t, int64_t> host_where_;  // key -> host-tier slot
    uint64_t host_clock_ = 0;
    uint8_t* host_ = nullptr;            // the slots' host memory, or staging_
    bool locked_ = false;
    std::string lock_error_;

    std::mutex use_mu_;
    mutable std::mutex mu_;
    std::condition_variable loaded_;
    ExpertCachePolicy policy_;
    std::vector<Slot> slots_;
    std::vector<int64_t> slot_key_;      // mirrors slots_[s].key for the policy
    std::vector<uint64_t> slot_last_use_;
    std::unordered_map<int64_t, int64_t> where_;  // key -> slot
    int64_t prefetch_loading_ = 0;
    ArenaStats stats_;
    // Device-routed mode: the host tier as mapped backend memory [n_keys][slot_bytes], record `key` in row
    // key; per key its device slot or -1 (where), its parts' offsets in a slot, and whether it has a device
    // slot (mask), each on the backend ([n_keys] I32, [n_keys][3] I32, [n_keys] I8) and mirrored here; the
    // uploads in flight (their slots are Loading until the next after_step sees them done).
    bool routed_ = false;
    int64_t promote_limit_ = 1;  // uploads a step may start: one token's records (the policy's lru_reserve)
    Buffer mapped_, tables_;
    Tensor where_t_, offsets_t_, mask_t_;
    std::vector<int32_t> where_h_;
    std::vector<int8_t> mask_h_;
    struct Promotion {
        int64_t slot, key;
        uint64_t ticket;
    };
    std::vector<Promotion> promoting_;
    std::unique_ptr<ExpertStreamer> streamer_;  // last: its threads stop before the rest is destroyed
};

}  // namespace regolith
