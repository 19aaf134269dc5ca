// Bindings of window state files (regolith.state wraps them): the header reader, CRC32C, and the
// ModelWindow methods that save and restore (added to the class in bind_model.cpp through these helpers).
#include "bind_state.h"

#include <nanobind/stl/string.h>

#include <cstring>

#include "core/crc32c.h"
#include "core/errors.h"
#include "numpy_out.h"

namespace {

using regolith::StateHeader;

const char* kind_name(regolith::StateKind k) {
    switch (k) {
        case regolith::StateKind::Kv:
            return "kv";
        case regolith::StateKind::Qsa:
            return "qsa";
        case regolith::StateKind::Gdn:
            return "gdn";
        case regolith::StateKind::Ple:
            return "ple";
        case regolith::StateKind::Logits:
            return "logits";
    }
    return "?";
}

nb::dict stats_dict(const regolith::StateIoStats& s) {
    nb::dict d;
    d["bytes"] = s.bytes;
    d["direct"] = s.direct;
    d["threads"] = s.threads;
    return d;
}

const regolith::StatePartEntry* logits_entry(const StateHeader& h) {
    for (const auto& e : h.parts)
        if (e.kind == regolith::StateKind::Logits) return &e;
    return nullptr;
}

}  // namespace

nb::dict save_window_state(regolith::ModelWindow& w, const std::string& path, nb::bytes fingerprint,
                           const std::string& arch, StateTokens tokens, int64_t from, nb::bytes meta,
                           std::optional<StateLogits> logits, int threads, bool direct) {
    StateHeader head;
    if (fingerprint.size() != head.fingerprint.size()) throw nb::value_error("fingerprint must be 32 bytes");
    std::memcpy(head.fingerprint.data(), fingerprint.c_str(), head.fingerprint.size());
    head.arch = arch;
    head.from = from;
    head.tokens.assign(tokens.data(), tokens.data() + tokens.shape(0));
    head.meta.assign(meta.c_str(), meta.size());
    if (logits && int64_t(logits->shape(0)) != w.vocab())
        throw nb::value_error("logits must hold one value per vocabulary entry");
    if (head.n() != w.n_past()) throw nb::value_error("tokens must hold the window's n_past ids");
    const regolith::StateIo io{threads, direct};
    regolith::StateIoStats stats;
    {
        nb::gil_scoped_release release;
        SubmitOnReturn submit(w);
        w.export_state(from, [&](std::vector<regolith::StatePart>& parts) {
            if (logits)
                parts.push_back({regolith::StateKind::Logits,
                                 0,
                                 regolith::StateDtype::F32,
                                 {{reinterpret_cast<uint8_t*>(const_cast<float*>(logits->data())),
                                   size_t(logits->shape(0)) * sizeof(float)}}});
            stats = regolith::write_state_file(path, head, parts, io);
        });
    }
    return stats_dict(stats);
}

nb::tuple load_window_state(regolith::ModelWindow& w, const std::string& path, const StateHeader& head,
                            bool whole, int threads, bool direct) {
    const regolith::StateIo io{threads, direct};
    const regolith::StatePartEntry* le = whole ? logits_entry(head) : nullptr;
    if (le && le->bytes != uint64_t(w.vocab()) * sizeof(float))
        throw regolith::StateError(path + ": its logits are not of this model's vocabulary");
    float* out = nullptr;
    nb::object logits = nb::none();
    if (le) logits = nb::cast(new_array({size_t(w.vocab())}, &out));
    regolith::StateIoStats stats;
    {
        nb::gil_scoped_release release;
        SubmitOnReturn submit(w);
        w.import_state(head.from, head.n(), whole, [&](std::vector<regolith::StatePart>& parts) {
            if (le)
                parts.push_back({regolith::StateKind::Logits,
                                 0,
                                 regolith::StateDtype::F32,
                                 {{reinterpret_cast<uint8_t*>(out), size_t(w.vocab()) * sizeof(float)}}});
            stats = regolith::read_state_parts(path, head, parts, io);
        });
    }
    return nb::make_tuple(stats_dict(stats), logits);
}

uint64_t WindowSnapshot::bytes() const {
    uint64_t n = 0;
    for (const Part& p : parts) n += p.bytes.size();
    return n;
}

WindowSnapshot snapshot_window(regolith::ModelWindow& w) {
    WindowSnapshot s;
    s.n = w.n_past();
    nb::gil_scoped_release release;
    SubmitOnReturn submit(w);
    w.export_state(0, [&](std::vector<regolith::StatePart>& parts) {
        for (const regolith::StatePart& p : parts) {
            WindowSnapshot::Part& q =
                s.parts.emplace_back(WindowSnapshot::Part{p.kind, p.layer, p.dtype, {}});
            q.bytes.reserve(p.bytes());
            for (const regolith::StateSpan& span : p.spans)
                q.bytes.insert(q.bytes.end(), span.data, span.data + span.bytes);
        }
    });
    return s;
}

namespace {

// The snapshot's parts as state parts of one span each (read only: the window copies out of them).
std::vector<regolith::StatePart> saved_parts(const WindowSnapshot& s) {
    std::vector<regolith::StatePart> parts;
    for (const WindowSnapshot::Part& q : s.parts) {
        auto* data = const_cast<uint8_t*>(q.bytes.data());
        parts.push_back(regolith::StatePart{q.kind, q.layer, q.dtype, {regolith::StateSpan{data, q.bytes.size()}}});
    }
    return parts;
}

}  // namespace

void append_moved(regolith::ModelWindow& w, const WindowSnapshot& s, int64_t src, int64_t n,
                  const std::vector<int32_t>& recent) {
    const std::vector<regolith::StatePart> parts = saved_parts(s);
    nb::gil_scoped_release release;
    SubmitOnReturn submit(w);
    w.append_moved(parts, s.n, src, n, recent);
}

void adopt_recurrent(regolith::ModelWindow& w, const WindowSnapshot& s, const std::vector<int32_t>& recent) {
    const std::vector<regolith::StatePart> parts = saved_parts(s);
    nb::gil_scoped_release release;
    SubmitOnReturn submit(w);
    w.adopt_recurrent(parts, recent);
}

void restore_window(regolith::ModelWindow& w, const WindowSnapshot& s) {
    nb::gil_scoped_release release;
    SubmitOnReturn submit(w);
    w.reset();
    w.import_state(0, s.n, true, [&](std::vector<regolith::StatePart>& parts) {
        if (parts.size() != s.parts.size())
            throw regolith::StateError("the snapshot has " + std::to_string(s.parts.size()) +
                                       " state parts; this window has " + std::to_string(parts.size()));
        for (size_t i = 0; i < parts.size(); ++i) {
            const regolith::StatePart& p = parts[i];
            const WindowSnapshot::Part& q = s.parts[i];
            if (p.kind == q.kind && p.layer == q.layer && p.dtype != q.dtype)
                throw regolith::StateError("the snapshot's " + regolith::state_part_name(q.kind, q.layer) +
                                           " holds caches of another type than this window's");
            if (p.kind != q.kind || p.layer != q.layer || p.bytes() != q.bytes.size())
                throw regolith::StateError("the snapshot's " + regolith::state_part_name(q.kind, q.layer) +
                                           " does not fit this window's " +
                                           regolith::state_part_name(p.kind, p.layer));
            size_t at = 0;
            for (const regolith::StateSpan& span : p.spans) {
                std::memcpy(span.data, q.bytes.data() + at, span.bytes);
                at += span.bytes;
            }
        }
    });
}

void init_state(nb::module_& m) {
    nb::class_<WindowSnapshot>(m, "WindowSnapshot", "A window's whole state in host memory.")
        .def_ro("n", &WindowSnapshot::n, "Tokens the state has seen.")
        .def_prop_ro("bytes", &WindowSnapshot::bytes, "Host memory the copy takes.");
    m.def(
        "crc32c",
        [](nb::bytes data, uint32_t crc) { return regolith::crc32c(crc, data.c_str(), data.size()); },
        nb::arg("data"), nb::arg("crc") = 0, "CRC32C of data, continuing crc (0 to start).");
    nb::class_<StateHeader>(m, "StateHeader", "The checked header of a window state file.")
        .def_ro("version", &StateHeader::version)
        .def_prop_ro("fingerprint",
                     [](const StateHeader& h) {
                         return nb::bytes(reinterpret_cast<const char*>(h.fingerprint.data()),
                                          h.fingerprint.size());
                     })
        .def_ro("architecture", &StateHeader::arch)
        .def_ro("start", &StateHeader::from, "Positional parts hold the rows of tokens [start, n).")
        .def_prop_ro("n", &StateHeader::n)
        .def_prop_ro(
            "tokens",
            [](const StateHeader& h) {
                int32_t* p;
                auto a = new_array({h.tokens.size()}, &p);
                if (!h.tokens.empty()) std::memcpy(p, h.tokens.data(), h.tokens.size() * sizeof(int32_t));
                return a;
            },
            nb::rv_policy::move, "The token ids the state has seen (int32, a new array).")
        .def_prop_ro("meta", [](const StateHeader& h) { return nb::bytes(h.meta.data(), h.meta.size()); })
        .def_ro("file_bytes", &StateHeader::file_bytes)
        .def_prop_ro("has_logits", [](const StateHeader& h) { return logits_entry(h) != nullptr; })
        .def_prop_ro(
            "kv_type",
            [](const StateHeader& h) -> nb::object {
                for (const auto& e : h.parts) {
                    if (e.kind != regolith::StateKind::Qsa && e.kind != regolith::StateKind::Kv) continue;
                    switch (e.dtype) {
                        case regolith::StateDtype::F16: return nb::str("f16");
                        case regolith::StateDtype::Q8_0: return nb::str("q8_0");
                        case regolith::StateDtype::I8: return nb::str("i8");
                        default: return nb::str("f32");  // F32, and Mixed: a QSA part of f32 caches
                    }
                }
                return nb::none();
            },
            "The type of the state's attention caches ('f32', 'f16', 'q8_0', 'i8'), None without any.")
        .def_prop_ro(
            "parts",
            [](const StateHeader& h) {
                nb::list out;
                for (const auto& e : h.parts)
                    out.append(nb::make_tuple(kind_name(e.kind), e.layer, e.offset, e.bytes, e.crc));
                return out;
            },
            "(kind, layer, offset, bytes, crc32c) of each part, in file order.");
    m.def(
        "read_state_header",
        [](const std::string& path) {
            nb::gil_scoped_release release;
            return regolith::read_state_header(path);
        },
        nb::arg("path"));
}
