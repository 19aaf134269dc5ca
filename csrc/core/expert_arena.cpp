#include "core/expert_arena.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/crc32c.h"
#include "core/errors.h"

namespace regolith {

uint64_t ExpertFileLayout::record_bytes(int64_t layer) const {
    const auto& p = layers[size_t(layer)];
    return p[0].bytes + p[1].bytes + p[2].bytes;
}

uint64_t ExpertFileLayout::footprint(int64_t layer) const {
    const auto& p = layers[size_t(layer)];
    // Each extent starts up to one alignment unit before its data and ends rounded up to the next unit.
    if (contiguous) return align_up(record_bytes(layer) + kDirectAlign);
    uint64_t n = 0;
    for (const auto& m : p) n += align_up(m.bytes + kDirectAlign);
    return n;
}

ExpertArena::ExpertArena(ExpertFileLayout layout, const ArenaOptions& opt, Backend& backend)
    : layout_(std::move(layout)),
      n_slots_(opt.slots),
      be_(backend),
      policy_(layout_.n_layer * layout_.n_expert, opt.slots, opt.policy) {
    if (n_slots_ <= 0) throw Error("expert arena: the number of slots must be positive");
    const int64_t n_keys = layout_.n_layer * layout_.n_expert;
    if (int64_t(layout_.layers.size()) != layout_.n_layer || int64_t(layout_.files.size()) != layout_.n_layer ||
        int64_t(layout_.offsets.size()) != n_keys * 3 || layout_.paths.empty() ||
        (!layout_.crcs.empty() && int64_t(layout_.crcs.size()) != n_keys) ||
        (layout_.contiguous && layout_.paths.size() != 1))
        throw Error("expert arena: inconsistent expert file layout");
    for (const auto& f : layout_.files)
        for (uint32_t i : f)
            if (i >= layout_.paths.size()) throw Error("expert arena: inconsistent expert file layout");
    for (int64_t l = 0; l < layout_.n_layer; ++l) slot_bytes_ = std::max(slot_bytes_, layout_.footprint(l));
    const uint64_t bytes = uint64_t(n_slots_) * slot_bytes_;
    try {
        memory_ = Buffer(be_, bytes, MemoryUse::Arena);
    } catch (const std::system_error& e) {
        throw std::system_error(e.code(), "expert arena: cannot allocate " + std::to_string(bytes) + " bytes");
    }
    host_ = static_cast<uint8_t*>(be_.host_address(memory_.get()));
    routed_ = opt.device_routed;
    if (routed_ && (host_ || opt.host_slots < n_keys || !be_.supports_expert_slots()))
        throw Error(std::string("expert arena: device routing needs a backend with memory of its own that takes "
                                "expert slots (") + be_.name() + (be_.supports_expert_slots() && !host_ ? " does" : " does not") +
                    ") and a host tier of every record (" + std::to_string(opt.host_slots) + " of " +
                    std::to_string(n_keys) + ")");
    if (routed_) {
        n_host_ = n_keys;
        promote_limit_ = std::max<int64_t>(1, opt.policy.lru_reserve);
        CachePolicyOptions routed_policy = opt.policy;  // scores that outlive a record's stay: routed_decay
        routed_policy.decay = routed_decay(n_slots_);
        policy_ = ExpertCachePolicy(n_keys, n_slots_, routed_policy);
        const uint64_t host_bytes = uint64_t(n_keys) * slot_bytes_;
        try {
            mapped_ = Buffer(be_, host_bytes, MemoryUse::Mapped);
        } catch (const std::system_error& e) {
            throw std::system_error(e.code(), "expert arena: cannot allocate a host tier of " +
                                                  std::to_string(host_bytes) + " bytes");
        }
    } else if (!host_ && opt.host_slots > 0) {
        // at least one host slot per device slot: every read in flight has somewhere to land
        n_host_ = std::max(opt.host_slots, n_slots_);
        const uint64_t host_bytes = uint64_t(n_host_) * slot_bytes_;
        try {
            host_tier_ = std::make_unique<AlignedBuffer>(size_t(host_bytes));
        } catch (const std::bad_alloc&) {
            throw std::system_error(ENOMEM, std::generic_category(),
                                    "expert arena: cannot allocate a host tier of " + std::to_string(host_bytes) + " bytes");
        }
        host_slots_.resize(size_t(n_host_));
    } else if (!host_) {
        staging_ = std::make_unique<AlignedBuffer>(size_t(bytes));
        host_ = staging_->data.get();
    }
    if (AlignedBuffer* from = host_tier_ ? host_tier_.get() : staging_.get())
        if (be_.pin_host(from->data.get(), from->size)) pinned_ = from->data.get();
    if (opt.lock) locked_ = be_.lock(memory_.get(), &lock_error_);
    slots_.resize(size_t(n_slots_));
    slot_key_.assign(size_t(n_slots_), -1);
    slot_last_use_.assign(size_t(n_slots_), 0);
    stats_.layer_hits.assign(size_t(layout_.n_layer), 0);
    stats_.layer_misses.assign(size_t(layout_.n_layer), 0);
    streamer_ = std::make_unique<ExpertStreamer>(layout_.paths, opt.io_threads, opt.direct);
    if (routed_) fill_routed();
}

ExpertArena::~ExpertArena() {
    streamer_.reset();  // joins the I/O threads: no read lands in freed memory
    if (pinned_) be_.unpin_host(pinned_);
}

uint64_t ExpertArena::upload(int64_t s, const uint8_t* src) {
    Tensor slot = memory_.tensor(RG_TYPE_I8, 1, int64_t(slot_bytes_), uint64_t(s) * slot_bytes_);
    return be_.upload(slot, src);  // the slot's last readers were submitted before it was released
}

int64_t ExpertArena::host_victim_locked() {
    int64_t best = -1;
    for (int64_t h = 0; h < n_host_; ++h) {
        const HostSlot& x = host_slots_[size_t(h)];
        if (x.loading) continue;
        if (x.key < 0) return h;
        if (best < 0 || x.last_use < host_slots_[size_t(best)].last_use) best = h;
    }
    return best;
}

int64_t ExpertArena::load_locked(int64_t key, IoPriority priority, bool pin) {
    const int64_t s = policy_.victim(slot_key_, slot_last_use_, [&](int64_t i) {
        const Slot& x = slots_[size_t(i)];
        return x.pins == 0 && (x.state == State::Empty || x.state == State::Ready);
    });
    if (s < 0) return -1;
    Slot& slot = slots_[size_t(s)];
    if (slot.key >= 0) where_.erase(slot.key);
    slot.key = key;
    slot.state = State::Loading;
    slot.pins = pin ? 1 : 0;
    slot.prefetched = priority != IoPriority::Demand;
    slot.error = nullptr;
    slot_key_[size_t(s)] = key;
    slot_last_use_[size_t(s)] = policy_.clock();
    where_[key] = s;
    slot.host = -1;

    if (n_host_ > 0) {
        auto hit = host_where_.find(key);
        if (hit != host_where_.end()) {
            // The host tier has the record: one copy to the device slot, no read.
            HostSlot& hs = host_slots_[size_t(hit->second)];
            hs.last_use = ++host_clock_;
            std::copy(hs.part_offset, hs.part_offset + 3, slot.part_offset);
            try {
                hs.upload = upload(s, host_slot_memory(hit->second));
                slot.state = State::Ready;
            } catch (...) {
                where_.erase(key);
                slot.key = -1;
                slot_key_[size_t(s)] = -1;
                slot.state = State::Empty;
                slot.pins = 0;
                throw;
            }
            ++stats_.host_hits;
            return s;
        }
        // Read into a host-tier slot (there is always one not being read into: see the constructor).
        const int64_t h = host_victim_locked();
        HostSlot& hs = host_slots_[size_t(h)];
        if (hs.key >= 0) host_where_.erase(hs.key);
        hs.key = key;
        hs.loading = true;
        hs.last_use = ++host_clock_;
        host_where_[key] = h;
        slot.host = h;
    }

    ReadJob job = record_job(key, slot.host >= 0 ? host_slot_memory(slot.host) : slot_memory(s), slot.part_offset);
    job.slot = s;
    if (slot.host >= 0) std::copy(slot.part_offset, slot.part_offset + 3, host_slots_[size_t(slot.host)].part_offset);
    if (job.dst == slot_memory(s) && !staging_ && slot.reuse_after > 0) {
        // The read lands in the backend's own memory, which ops submitted before the slot's last release may
        // still read (a GPU with unified memory): wait for them first, on the I/O thread.
        job.before_write = [this, n = slot.reuse_after] { be_.wait_submitted(n); };
    } else if (const uint64_t t = slot.host >= 0 ? host_slots_[size_t(slot.host)].upload : slot.staged_upload) {
        // The read lands in host memory an upload may still be copying from (a DMA waiting for the ops
        // before it): wait for that copy first, on the I/O thread.
        job.before_write = [this, t] { be_.wait_upload(t); };
    }
    job.done = [this](int64_t slot_index, uint64_t bytes, std::exception_ptr error) {
        on_read(slot_index, bytes, error);
    };
    streamer_->submit(std::move(job), priority);
    return s;
}

std::exception_ptr ExpertArena::check_record(int64_t key, const uint8_t* record) const {
    if (layout_.crcs.empty()) return nullptr;
    const int64_t layer = key / layout_.n_expert;
    if (crc32c(0, record, layout_.record_bytes(layer)) == layout_.crcs[size_t(key)]) return nullptr;
    return std::make_exception_ptr(ModelFormatError(layout_.paths.front() + ": the record of layer " +
                                                    std::to_string(layer) + " expert " +
                                                    std::to_string(key % layout_.n_expert) +
                                                    " fails its checksum (the file is corrupt)"));
}

ReadJob ExpertArena::record_job(int64_t key, uint8_t* dst, uint64_t (&part_offset)[3]) const {
    // The record's extents: one when its parts are adjacent, else one per part, each aligned for O_DIRECT.
    const int64_t layer = key / layout_.n_expert;
    const auto& parts = layout_.layers[size_t(layer)];
    const uint64_t* off = &layout_.offsets[size_t(key) * 3];
    const auto& file = layout_.files[size_t(layer)];
    ReadJob job;
    job.dst = dst;
    if (layout_.contiguous) {
        const uint64_t start = align_down(off[0]), end = off[0] + layout_.record_bytes(layer);
        job.extents.push_back({file[0], start, align_up(end) - start, 0, end - start});
        for (int i = 0; i < 3; ++i) part_offset[i] = off[i] - start;
    } else {
        uint64_t at = 0;
        for (int i = 0; i < 3; ++i) {
            const uint64_t start = align_down(off[i]), end = off[i] + parts[size_t(i)].bytes;
            job.extents.push_back({file[size_t(i)], start, align_up(end) - start, at, end - start});
            part_offset[i] = at + (off[i] - start);
            at += align_up(end) - start;
        }
    }
    return job;
}

void ExpertArena::on_read(int64_t s, uint64_t bytes, std::exception_ptr error) {
    // The slot is Loading (and its host-tier slot, if any, loading), so nobody else touches their memory or
    // keys until this returns.
    const int64_t key = slots_[size_t(s)].key, h = slots_[size_t(s)].host;
    const uint8_t* mem = h >= 0 ? host_slot_memory(h) : slot_memory(s);
    if (!error) error = check_record(key, mem + slots_[size_t(s)].part_offset[0]);
    if (!error && (staging_ || h >= 0)) {
        try {  // the record to the backend's slot, in stream order before any op that reads it
            (h >= 0 ? host_slots_[size_t(h)].upload : slots_[size_t(s)].staged_upload) = upload(s, mem);
        } catch (...) {
            error = std::current_exception();
        }
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        Slot& slot = slots_[size_t(s)];
        stats_.reads += 1;
        stats_.bytes_read += bytes;
        if (slot.prefetched && prefetch_loading_ > 0 && slot.pins == 0) --prefetch_loading_;
        if (h >= 0) {
            HostSlot& hs = host_slots_[size_t(h)];
            hs.loading = false;
            if (error) {
                host_where_.erase(hs.key);
                hs.key = -1;
            }
            slot.host = -1;
        }
        if (error) {
            // Forget the record; computations pinning the slot see the error, then the slot empties.
            where_.erase(slot.key);
            slot.state = slot.pins > 0 ? State::Failed : State::Empty;
            slot.error = error;
            slot.key = -1;
            slot_key_[size_t(s)] = -1;
        } else {
            slot.state = State::Ready;
        }
    }
    loaded_.notify_all();
}

int64_t ExpertArena::acquire(int64_t layer, int64_t expert) {
    if (layer < 0 || layer >= layout_.n_layer || expert < 0 || expert >= layout_.n_expert)
        throw Error("expert arena: no expert " + std::to_string(expert) + " in layer " + std::to_string(layer));
    const int64_t key = layer * layout_.n_expert + expert;
    std::unique_lock<std::mutex> lock(mu_);
    policy_.touch(key);
    auto it = where_.find(key);
    if (it != where_.end()) {
        const int64_t s = it->second;
        Slot& slot = slots_[size_t(s)];
        if (slot.state == State::Ready) {
            ++stats_.hits;
            ++stats_.layer_hits[size_t(layer)];
        } else {
            ++stats_.misses;  // a read is on its way: the computation may still wait for it
            ++stats_.layer_misses[size_t(layer)];
            streamer_->promote(s);
        }
        if (slot.prefetched) {
            ++stats_.prefetch_hits;
            if (slot.state == State::Loading && prefetch_loading_ > 0) --prefetch_loading_;
            slot.prefetched = false;
        }
        ++slot.pins;
        slot_last_use_[size_t(s)] = policy_.clock();
        return s;
    }
    ++stats_.misses;
    ++stats_.layer_misses[size_t(layer)];
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
        const int64_t s = load_locked(key, IoPriority::Demand, true);
        if (s >= 0) {
            stats_.stall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            return s;
        }
        // Every slot is pinned or loading: wait for a read to land (a pinned-only arena is the caller's bug).
        const bool loading = std::any_of(slots_.begin(), slots_.end(),
                                         [](const Slot& x) { return x.state == State::Loading && x.pins == 0; });
        if (!loading)
            throw Error("expert arena: all " + std::to_string(n_slots_) + " slots are pinned by one computation");
        loaded_.wait(lock);
    }
}

bool ExpertArena::ready(int64_t s) const {
    std::lock_guard<std::mutex> lock(mu_);
    return slots_[size_t(s)].state != State::Loading;
}

ExpertWeights ExpertArena::wait(int64_t s) {
    std::unique_lock<std::mutex> lock(mu_);
    Slot& slot = slots_[size_t(s)];
    if (slot.state == State::Loading) {
        const auto t0 = std::chrono::steady_clock::now();
        loaded_.wait(lock, [&] { return slot.state != State::Loading; });
        stats_.stall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (slot.state == State::Failed) std::rethrow_exception(slot.error);
    const int64_t layer = slot.key / layout_.n_expert;
    const auto& parts = layout_.layers[size_t(layer)];
    ExpertWeights w;
    Tensor* views[3] = {&w.gate, &w.up, &w.down};
    for (int i = 0; i < 3; ++i) {
        const ExpertMatrixShape& m = parts[size_t(i)];
        Tensor& t = *views[i];
        t.buffer = memory_.get();
        t.offset = uint64_t(s) * slot_bytes_ + slot.part_offset[i];
        t.type = m.type;
        t.rows = m.rows;
        t.cols = m.cols;
        t.row_bytes = int64_t(m.row_bytes);
    }
    return w;
}

void ExpertArena::release(int64_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& slot = slots_[size_t(s)];
    if (slot.pins > 0) --slot.pins;
    // The ops that read the slot were submitted before its pins were released (SparseMoe::forward).
    if (slot.pins == 0) slot.reuse_after = be_.submitted();
    if (slot.pins == 0 && slot.state == State::Failed) {
        slot.state = State::Empty;
        slot.error = nullptr;
    }
}

void ExpertArena::prefetch(int64_t layer, const int32_t* experts, int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t limit = std::max<int64_t>(1, n_slots_ / 4);
    for (int64_t i = 0; i < n && prefetch_loading_ < limit; ++i) {
        if (experts[i] < 0 || experts[i] >= layout_.n_expert) continue;
        const int64_t key = layer * layout_.n_expert + experts[i];
        if (where_.count(key)) continue;
        const int64_t s = load_locked(key, IoPriority::Prefetch, false);
        if (s < 0) return;
        if (slots_[size_t(s)].state == State::Loading) ++prefetch_loading_;  // not when the host tier had it
        ++stats_.prefetches;
    }
}

void ExpertArena::warm() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t empty = std::count_if(slots_.begin(), slots_.end(), [](const Slot& x) { return x.state == State::Empty; });
    if (empty == 0 || streamer_->queued(IoPriority::Background) > 0) return;
    for (int64_t key : policy_.top(n_slots_)) {
        if (empty == 0) break;
        if (where_.count(key)) continue;
        // An empty slot exists, and the policy takes empty slots first: background work never evicts.
        const int64_t s = load_locked(key, IoPriority::Background, false);
        slots_[size_t(s)].prefetched = false;
        ++stats_.background_reads;
        --empty;
    }
}

void ExpertArena::resident_mask(int64_t layer, uint8_t* mask) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t e = 0; e < layout_.n_expert; ++e) mask[e] = where_.count(layer * layout_.n_expert + e) ? 1 : 0;
}

ArenaStats ExpertArena::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

double ExpertArena::stall_seconds() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_.stall_s;
}

void ExpertArena::reset_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = stats_.layer_hits.size();
    stats_ = ArenaStats{};
    stats_.layer_hits.assign(n, 0);
    stats_.layer_misses.assign(n, 0);
}

}  // namespace regolith
