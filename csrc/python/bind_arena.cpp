// Expert arena tools that need no model: the cache policy replayed over a routing trace, and block checksums
// for the packer.
#include <nanobind/ndarray.h>

#include <cstdint>

#include "bindings.h"
#include "core/crc32c.h"
#include "core/expert_cache_policy.h"
#include "numpy_out.h"

namespace {

using Trace = nb::ndarray<const int32_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Crcs = nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>>;

}  // namespace

void init_arena(nb::module_& m) {
    m.def(
        "replay_trace",
        [](Trace trace, int64_t n_expert, int64_t n_slots, double hot_fraction, double decay, int64_t refresh,
           int64_t lru_reserve) {
            if (lru_reserve < 0) lru_reserve = int64_t(trace.shape(1) * trace.shape(2));
            regolith::CachePolicyOptions opt{hot_fraction, decay, refresh, lru_reserve};
            regolith::TraceReplay r;
            {
                nb::gil_scoped_release release;
                r = regolith::replay_trace(trace.data(), int64_t(trace.shape(0)), int64_t(trace.shape(1)),
                                           int64_t(trace.shape(2)), n_expert, n_slots, opt);
            }
            nb::dict d;
            d["hits"] = r.hits;
            d["misses"] = r.misses;
            return d;
        },
        nb::arg("trace"), nb::arg("n_expert"), nb::arg("n_slots"), nb::arg("hot_fraction") = 0.75,
        nb::arg("decay") = 0.999, nb::arg("refresh") = 256, nb::arg("lru_reserve") = -1,
        "Replay a routing trace int32 [tokens, layers, k] (-1: none) through the arena's cache policy with n_slots "
        "slots; lru_reserve -1 reserves layers x k slots for LRU, as the arena does. Returns {'hits', 'misses'}.");
    m.def(
        "replay_routed_trace",
        [](Trace trace, int64_t n_expert, int64_t n_slots, double hot_fraction, int64_t limit) {
            const int64_t per_step = int64_t(trace.shape(1) * trace.shape(2));
            regolith::CachePolicyOptions opt{hot_fraction, 0.999, 256, per_step};
            regolith::RoutedReplay r;
            {
                nb::gil_scoped_release release;
                r = regolith::replay_routed_trace(trace.data(), int64_t(trace.shape(0)), int64_t(trace.shape(1)),
                                                  int64_t(trace.shape(2)), n_expert, n_slots,
                                                  limit < 0 ? per_step : limit, opt);
            }
            nb::dict d;
            d["hits"] = r.hits;
            d["misses"] = r.misses;
            d["copies"] = r.copies;
            return d;
        },
        nb::arg("trace"), nb::arg("n_expert"), nb::arg("n_slots"), nb::arg("hot_fraction") = 0.75,
        nb::arg("limit") = -1,
        "Replay a routing trace int32 [tokens, layers, k] (-1: none) through the device-routed arena's policy "
        "(each token a step: hits against the arena as the step began, then the misses it admits, at most "
        "`limit` a step, -1: layers x k). Returns {'hits', 'misses', 'copies'}.");
    m.def(
        "crc32c_blocks",
        [](Bytes data, int64_t block) {
            if (block <= 0 || data.shape(0) % size_t(block) != 0)
                throw nb::value_error("data must be a whole number of positive-sized blocks");
            const size_t n = data.shape(0) / size_t(block);
            uint32_t* out;
            Crcs crcs = new_array({n}, &out);
            nb::gil_scoped_release release;
            for (size_t i = 0; i < n; ++i) out[i] = regolith::crc32c(0, data.data() + i * size_t(block), size_t(block));
            return crcs;
        },
        nb::arg("data"), nb::arg("block"), "CRC32C of each `block`-byte block of uint8 data.");
}
