// The expert arena's device-routed mode (core/expert_arena.h): every record in a mapped host tier the device
// reads in place, the device slots a cache of the records used most, filled between steps.
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <unordered_set>

#include "core/errors.h"
#include "core/expert_arena.h"

namespace regolith {

void ExpertArena::fill_routed() {
    const int64_t n_keys = layout_.n_layer * layout_.n_expert;
    auto* mapped = static_cast<uint8_t*>(be_.host_address(mapped_.get()));
    if (!mapped) throw Error(std::string("expert arena: ") + be_.name() + "'s mapped memory has no host address");
    std::vector<int32_t> offsets(size_t(n_keys) * 3);
    std::mutex mu;
    std::condition_variable done;
    int64_t left = n_keys;
    std::exception_ptr first_error;
    for (int64_t key = 0; key < n_keys; ++key) {
        uint64_t part_offset[3];
        ReadJob job = record_job(key, mapped + uint64_t(key) * slot_bytes_, part_offset);
        for (int i = 0; i < 3; ++i) offsets[size_t(key) * 3 + size_t(i)] = int32_t(part_offset[i]);
        job.slot = key;
        job.done = [&, mapped](int64_t k, uint64_t bytes, std::exception_ptr error) {
            if (!error) error = check_record(k, mapped + uint64_t(k) * slot_bytes_ + uint64_t(offsets[size_t(k) * 3]));
            std::lock_guard<std::mutex> lock(mu);
            stats_.reads += 1;
            stats_.bytes_read += bytes;
            if (error && !first_error) first_error = error;
            if (--left == 0) done.notify_all();
        };
        streamer_->submit(std::move(job), IoPriority::Background);
    }
    {
        std::unique_lock<std::mutex> lock(mu);
        done.wait(lock, [&] { return left == 0; });
    }
    if (first_error) std::rethrow_exception(first_error);

    // where [n_keys] I32, offsets [n_keys][3] I32, mask [n_keys] I8, one buffer
    const uint64_t where_bytes = align_up(uint64_t(n_keys) * 4), offsets_bytes = align_up(uint64_t(n_keys) * 12);
    tables_ = Buffer(be_, where_bytes + offsets_bytes + align_up(uint64_t(n_keys)));
    where_t_ = tables_.tensor(RG_TYPE_I32, 1, n_keys);
    offsets_t_ = tables_.tensor(RG_TYPE_I32, n_keys, 3, where_bytes);
    mask_t_ = tables_.tensor(RG_TYPE_I8, 1, n_keys, where_bytes + offsets_bytes);
    where_h_.assign(size_t(n_keys), -1);
    mask_h_.assign(size_t(n_keys), 0);
    be_.write(where_t_, where_h_.data());
    be_.write(offsets_t_, offsets.data());
    be_.write(mask_t_, mask_h_.data());
    be_.submit();
}

ExpertSlots ExpertArena::expert_slots(int64_t layer) const {
    if (!routed_) throw Error("expert arena: expert_slots needs the device-routed mode");
    const int64_t ne = layout_.n_expert;
    ExpertSlots s;
    s.device = memory_.tensor(RG_TYPE_I8, n_slots_, int64_t(slot_bytes_));
    s.host = mapped_.tensor(RG_TYPE_I8, ne, int64_t(slot_bytes_), uint64_t(layer * ne) * slot_bytes_);
    s.where = where_t_.col_range(layer * ne, ne);
    s.offsets = offsets_t_.row_range(layer * ne, ne);
    const auto& parts = layout_.layers[size_t(layer)];
    for (int i = 0; i < 3; ++i) {
        const ExpertMatrixShape& m = parts[size_t(i)];
        s.parts[i] = ExpertPart{m.type, m.rows, m.cols, int64_t(m.row_bytes)};
    }
    return s;
}

Tensor ExpertArena::routed_mask(int64_t layer) const {
    if (!routed_) throw Error("expert arena: routed_mask needs the device-routed mode");
    return mask_t_.col_range(layer * layout_.n_expert, layout_.n_expert);
}

void ExpertArena::stage(int64_t layer, const Tensor& dst) {
    if (!routed_) throw Error("expert arena: stage needs the device-routed mode");
    const auto* mapped = static_cast<const uint8_t*>(be_.host_address(mapped_.get()));
    be_.submit();  // the upload is ordered after the ops that last used dst's memory
    be_.upload(dst, mapped + uint64_t(layer * layout_.n_expert) * slot_bytes_);  // the tier never changes
}

void ExpertArena::end_step(const Tensor& routing) {
    if (!device_routed()) {
        warm();
        return;
    }
    std::vector<int32_t> ids(size_t(routing.rows * routing.cols));
    be_.read(routing, ids.data());
    after_step(ids.data(), routing.rows, routing.cols);
}

void ExpertArena::after_step(const int32_t* ids, int64_t layers, int64_t rows) {
    if (!routed_) throw Error("expert arena: after_step needs the device-routed mode");
    if (layers < 0 || layers > layout_.n_layer || rows < 0)
        throw Error("expert arena: a step's routing of " + std::to_string(layers) + " layers");
    const int64_t ne = layout_.n_expert;
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<uint8_t> dirty(size_t(layout_.n_layer), 0);
    const auto set = [&](int64_t key, int32_t slot) {
        where_h_[size_t(key)] = slot;
        mask_h_[size_t(key)] = slot >= 0 ? 1 : 0;
        dirty[size_t(key / ne)] = 1;
    };

    // The step ran with the tables as they were: count its hits and misses, and touch the policy.
    std::vector<int64_t> missed;
    std::unordered_set<int64_t> seen;
    for (int64_t l = 0; l < layers; ++l)
        for (int64_t i = 0; i < rows; ++i) {
            const int32_t e = ids[l * rows + i];
            if (e < 0 || e >= ne) throw Error("expert arena: expert id " + std::to_string(e) + " out of range");
            const int64_t key = l * ne + e;
            policy_.touch(key);
            const int32_t s = where_h_[size_t(key)];
            if (s >= 0) {
                ++stats_.hits;
                ++stats_.layer_hits[size_t(l)];
                slot_last_use_[size_t(s)] = policy_.clock();
            } else {
                ++stats_.misses;
                ++stats_.layer_misses[size_t(l)];
                if (seen.insert(key).second) missed.push_back(key);
            }
        }

    // Uploads started by the last step have completed by now (a step took longer): their slots become visible.
    for (const Promotion& p : promoting_) {
        be_.wait_upload(p.ticket);
        slots_[size_t(p.slot)].state = State::Ready;
        set(p.key, int32_t(p.slot));
    }
    promoting_.clear();

    // The misses the policy admits (admit_misses), at most promote_limit_ of the step's latest; the evicted
    // records' entries are cleared before any upload starts.
    const auto admitted = admit_misses(
        policy_, missed, std::min(n_slots_, promote_limit_), slot_key_, slot_last_use_,
        [&](int64_t key) { return where_h_[size_t(key)] >= 0; },
        [&](int64_t j) { return slots_[size_t(j)].state != State::Loading; });
    for (const Admission& a : admitted) {
        if (a.evicted >= 0) set(a.evicted, -1);
        slots_[size_t(a.slot)].key = a.key;
        slots_[size_t(a.slot)].state = State::Loading;
        promoting_.push_back({a.slot, a.key, 0});
    }
    for (int64_t l = 0; l < layout_.n_layer; ++l)
        if (dirty[size_t(l)]) {
            be_.write(where_t_.col_range(l * ne, ne), &where_h_[size_t(l * ne)]);
            be_.write(mask_t_.col_range(l * ne, ne), &mask_h_[size_t(l * ne)]);
        }
    if (promoting_.empty()) return;
    // Each upload starts after everything submitted: the cleared entries, and the ops that read the old records.
    be_.submit();
    const auto* mapped = static_cast<const uint8_t*>(be_.host_address(mapped_.get()));
    for (Promotion& p : promoting_) {
        p.ticket = upload(p.slot, mapped + uint64_t(p.key) * slot_bytes_);
        ++stats_.host_hits;
    }
}

}  // namespace regolith
