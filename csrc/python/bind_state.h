// Saving and restoring a ModelWindow (bind_state.cpp), used by the window's bindings in bind_model.cpp.
#pragma once

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "model/language_model.h"
#include "model/state_file.h"

using StateTokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using StateLogits = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Writes the window's state (positional rows from token `from` on) with `tokens` (its n_past ids) and
// `meta`; returns {bytes, direct, threads}.
nb::dict save_window_state(regolith::ModelWindow& w, const std::string& path, nb::bytes fingerprint,
                           const std::string& arch, StateTokens tokens, int64_t from, nb::bytes meta,
                           std::optional<StateLogits> logits, int threads, bool direct);
// The whole state of a window in host memory: a copy taken by snapshot_window, put back by
// restore_window (several replies to one prompt start from the prompt's state).
struct WindowSnapshot {
    struct Part {
        regolith::StateKind kind;
        uint32_t layer;
        regolith::StateDtype dtype;
        std::vector<uint8_t> bytes;  // the part's spans, in order
    };
    int64_t n = 0;  // tokens
    std::vector<Part> parts;
    uint64_t bytes() const;
};
WindowSnapshot snapshot_window(regolith::ModelWindow& w);
// Resets `w` and restores `s` onto it; StateError (the window then reset) for a snapshot of another model
// or one longer than the window.
void restore_window(regolith::ModelWindow& w, const WindowSnapshot& s);
// ModelWindow::append_moved of tokens [src, src + n) of snapshot `s` (suffix cache reuse).
void append_moved(regolith::ModelWindow& w, const WindowSnapshot& s, int64_t src, int64_t n,
                  const std::vector<int32_t>& recent);
// ModelWindow::adopt_recurrent of snapshot `s`.
void adopt_recurrent(regolith::ModelWindow& w, const WindowSnapshot& s, const std::vector<int32_t>& recent);
// Restores the file whose checked header is `head`; returns (stats, logits or None).
nb::tuple load_window_state(regolith::ModelWindow& w, const std::string& path,
                            const regolith::StateHeader& head, bool whole, int threads, bool direct);
