#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>

#include "bind_state.h"
#include "bindings.h"
#include "component.h"
#include "numpy_out.h"
#include "model/dense_lm.h"
#include "model/qwen4exp.h"

namespace {

using regolith::DenseModel;
using regolith::Qwen4ExpModel;
using regolith::ModelWindow;
using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Logits = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

nb::dict config_dict(const Qwen4ExpModel& m) {
    const auto& c = m.config();
    nb::dict d;
    d["architecture"] = c.arch;
    d["n_layer"] = c.n_layer;
    d["hidden_size"] = c.hidden;
    d["vocab_size"] = c.vocab;
    d["context_length"] = c.context_length;
    d["hc_count"] = c.hc;
    d["hc_lowrank"] = c.hc_rank;
    d["rms_norm_eps"] = c.eps;
    nb::list types;
    for (bool r : c.recurrent) types.append(r ? "linear_attention" : "full_attention");
    d["layer_types"] = types;
    d["num_experts"] = c.moe.n_expert;
    d["num_experts_per_tok"] = c.moe.n_used;
    d["moe_intermediate_size"] = c.moe.ff_expert;
    d["shared_expert_intermediate_size"] = c.moe.ff_shared;
    d["norm_topk_prob"] = c.moe.norm_topk_prob;
    d["nextn_predict_layers"] = c.n_nextn;
    d["mtp"] = m.has_mtp();
    return d;
}

nb::dict dense_config_dict(const DenseModel& m) {
    const auto& c = m.config();
    nb::dict d;
    d["architecture"] = c.arch;
    d["n_layer"] = c.n_layer;
    d["hidden_size"] = c.hidden;
    d["vocab_size"] = c.vocab;
    d["context_length"] = c.context_length;
    d["rms_norm_eps"] = c.eps;
    d["num_attention_heads"] = c.n_head;
    d["num_key_value_heads"] = c.n_head_kv;
    d["head_dim"] = c.head_dim;
    d["intermediate_size"] = c.n_ff;
    d["rope_dimension_count"] = c.n_rot;
    d["rope_theta"] = c.rope_base;
    d["rope_scaling_factor"] = 1.0f / c.rope_scale;
    d["rope_type"] = c.yarn_orig_ctx > 0 ? "yarn" : c.rope_scale != 1.0f ? "linear" : "default";
    if (c.yarn_orig_ctx > 0) {
        d["original_max_position_embeddings"] = c.yarn_orig_ctx;
        d["rope_attention_factor"] = c.yarn_mscale;
    }
    d["rope_local_base_freq"] = c.rope_base_swa;
    d["sliding_window"] = c.sliding_window;
    nb::list types;
    for (bool swa : c.swa) types.append(swa ? "sliding_attention" : "full_attention");
    d["layer_types"] = types;
    d["attention_scale"] = c.attn_scale;
    d["hidden_activation"] = c.act == regolith::FfnActivation::GeluTanh ? "gelu_pytorch_tanh" : "silu";
    d["final_logit_softcapping"] = c.final_softcap;
    if (c.moe.n_expert > 0) {
        d["num_experts"] = c.moe.n_expert;
        d["num_experts_per_tok"] = c.moe.n_used;
        d["moe_intermediate_size"] = c.moe.ff_expert;
        d["norm_topk_prob"] = c.moe.norm_topk_prob;
        d["experts_activation"] = c.moe.act == regolith::Glu::SwigluOai ? "swiglu_oai" : "silu";
        d["experts_bias"] = c.moe.biases;
    }
    d["attention_sinks"] = c.arch == "gpt-oss";
    return d;
}

regolith::KvType kv_type(const std::string& name) {
    if (name == "f16") return regolith::KvType::F16;
    if (name == "f32") return regolith::KvType::F32;
    if (name == "q8_0") return regolith::KvType::Q8_0;
    if (name == "i8") return regolith::KvType::I8;
    throw nb::value_error(("kv_type must be 'f32', 'f16', 'q8_0' or 'i8', not '" + name + "'").c_str());
}

uint32_t cache_type(const std::string& name) {
    for (uint32_t t : {RG_TYPE_F32, RG_TYPE_F16, RG_TYPE_Q8_0, RG_TYPE_I8})
        if (name == regolith::cache_type_name(t)) return t;
    throw nb::value_error(("kv_type must be 'f32', 'f16', 'q8_0' or 'i8', not '" + name + "'").c_str());
}

Logits eval(ModelWindow& w, Tokens tokens, bool all_logits) {
    const int64_t n = int64_t(tokens.shape(0)), vocab = w.vocab();
    const int64_t rows = all_logits ? n : std::min<int64_t>(n, 1);
    float* out;
    Logits logits = new_array({size_t(rows), size_t(vocab)}, &out);
    {
        nb::gil_scoped_release release;
        SubmitOnReturn submit(w);
        w.eval(tokens.data(), n, out, all_logits);
    }
    return logits;
}

// One step over several windows of a model (regolith::eval_windows): the logits of each, as eval gives them.
std::vector<Logits> eval_windows(const std::vector<ModelWindow*>& windows, const std::vector<Tokens>& tokens,
                                 const std::vector<bool>& all_logits) {
    if (tokens.size() != windows.size() || all_logits.size() != windows.size())
        throw nb::value_error("eval_windows: windows, tokens and all_logits must have the same length");
    std::vector<Logits> out;
    std::vector<regolith::WindowStep> steps;
    for (size_t i = 0; i < windows.size(); ++i) {
        if (!windows[i]) throw nb::value_error("eval_windows: a window is None");
        const int64_t n = int64_t(tokens[i].shape(0));
        float* logits;
        out.push_back(new_array({size_t(all_logits[i] ? n : std::min<int64_t>(n, 1)), size_t(windows[i]->vocab())},
                                &logits));
        steps.push_back({windows[i], tokens[i].data(), n, logits, all_logits[i]});
    }
    {
        nb::gil_scoped_release release;
        // the windows share a backend: one submit covers them
        std::optional<SubmitOnReturn<regolith::ModelWindow>> submit;
        if (!windows.empty()) submit.emplace(*windows[0]);
        regolith::eval_windows(steps);
    }
    return out;
}

// Component handles over a GGUF, for tests against the reference layer by layer.
struct HyperConnectionHandle {
    ComponentFile c;
    regolith::HyperConnection hc;
};

struct MoeHandle {
    ComponentFile c;
    regolith::SparseMoe moe;
};

// The ExpertLoadOptions part of a MoE model's constructor arguments (Qwen4ExpModel's and DenseModel's).
void set_expert_options(regolith::ExpertLoadOptions& o, const std::string& experts_path, int64_t arena_slots,
                        int io_threads, bool direct, bool lock, double hot_fraction, bool lookahead, bool moce,
                        float moce_bonus, int64_t moce_protect, int64_t host_slots, bool device_routing) {
    o.experts_path = experts_path;
    o.arena.slots = arena_slots;
    o.arena.io_threads = io_threads;
    o.arena.direct = direct;
    o.arena.lock = lock;
    o.arena.host_slots = host_slots;
    o.arena.device_routed = device_routing;
    o.arena.policy.hot_fraction = hot_fraction;
    o.lookahead = lookahead;
    o.moce = {moce, moce_bonus, moce_protect};
}

nb::object arena_info(const regolith::ExpertArena* a) {
    if (!a) return nb::none();
    nb::dict d;
    d["slots"] = a->slots();
    d["slot_bytes"] = a->slot_bytes();
    d["host_slots"] = a->host_slots();
    d["device_routed"] = a->device_routed();
    d["locked"] = a->locked();
    d["lock_error"] = a->lock_error();
    d["direct"] = a->direct();
    d["packed"] = a->layout().contiguous;
    d["expert_bytes"] = [&] {
        uint64_t n = 0;
        for (int64_t l = 0; l < a->layout().n_layer; ++l) n += a->layout().record_bytes(l) * uint64_t(a->layout().n_expert);
        return n;
    }();
    return d;
}

nb::dict arena_stats(const regolith::ExpertArena* a) {
    nb::dict d;
    if (a) {
        const regolith::ArenaStats s = a->stats();
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["host_hits"] = s.host_hits;
        d["prefetches"] = s.prefetches;
        d["prefetch_hits"] = s.prefetch_hits;
        d["background_reads"] = s.background_reads;
        d["reads"] = s.reads;
        d["bytes_read"] = s.bytes_read;
        d["read_stall_s"] = s.stall_s;
        nb::list hits, misses;
        for (size_t l = 0; l < s.layer_hits.size(); ++l) {
            hits.append(s.layer_hits[l]);
            misses.append(s.layer_misses[l]);
        }
        d["layer_hits"] = hits;
        d["layer_misses"] = misses;
    }
    return d;
}

nb::dict model_stats(const Qwen4ExpModel& m) {
    nb::dict d = arena_stats(m.arena());
    regolith::PleTableStats p;
    for (regolith::PleTable* t : m.ple_tables()) {
        const regolith::PleTableStats s = t->stats();
        p.rows_requested += s.rows_requested;
        p.cache_hits += s.cache_hits;
        p.rows_read += s.rows_read;
        p.bytes_read += s.bytes_read;
    }
    d["ple_rows_requested"] = p.rows_requested;
    d["ple_cache_hits"] = p.cache_hits;
    d["ple_rows_read"] = p.rows_read;
    d["ple_bytes_read"] = p.bytes_read;
    return d;
}

void reset_model_stats(Qwen4ExpModel& m) {
    if (regolith::ExpertArena* a = m.arena()) a->reset_stats();
    for (regolith::PleTable* t : m.ple_tables()) t->reset_stats();
}

}  // namespace

void init_model(nb::module_& m) {
    nb::class_<HyperConnectionHandle>(m, "HyperConnectionBlock")
        .def("__init__",
             [](HyperConnectionHandle* self, const std::string& path, const std::string& prefix, bool with_inject) {
                 ComponentFile c(path);
                 const auto cfg = regolith::Qwen4ExpConfig::from_gguf(*c.file);
                 auto hc = regolith::HyperConnection::load(c.weights(), prefix, cfg.hidden, cfg.hc, cfg.hc_rank,
                                                           cfg.eps, with_inject);
                 new (self) HyperConnectionHandle{std::move(c), hc};
             },
             nb::arg("path"), nb::arg("prefix"), nb::arg("with_inject"))
        .def(
            "read",
            [](HyperConnectionHandle& h, F32Rows streams) {
                if (int64_t(streams.shape(1)) != h.hc.hc * h.hc.hidden) throw nb::value_error("streams must be [n, hc*hidden]");
                const int64_t n = int64_t(streams.shape(0));
                const regolith::Tensor s = h.c.upload(streams.data(), n, h.hc.hc * h.hc.hidden);
                const regolith::Tensor mixed = h.c.ws->f32(n, h.hc.hidden), inject = h.c.ws->f32(n, h.hc.hc);
                h.hc.read(*h.c.ws, s, mixed, h.hc.inject ? inject : regolith::Tensor{});
                if (!h.hc.inject) h.c.be->zero(inject);
                nb::tuple out = nb::make_tuple(h.c.download(mixed), h.c.download(inject));
                h.c.ws->reset();
                return out;
            },
            nb::arg("streams"), "streams [n, hc*hidden] -> (mixed [n, hidden], inject weights [n, hc])");
    nb::class_<MoeHandle>(m, "MoeLayer")
        .def("__init__",
             [](MoeHandle* self, const std::string& path, int layer) {
                 ComponentFile c(path);
                 const auto cfg = regolith::Qwen4ExpConfig::from_gguf(*c.file);
                 auto moe = regolith::SparseMoe::load(c.weights(), layer, cfg.moe);
                 new (self) MoeHandle{std::move(c), std::move(moe)};
             },
             nb::arg("path"), nb::arg("layer"))
        .def(
            "forward",
            [](MoeHandle& h, F32Rows x) {
                if (int64_t(x.shape(1)) != h.moe.shape().hidden) throw nb::value_error("x must be [n, hidden]");
                const int64_t n = int64_t(x.shape(0));
                const regolith::Tensor xt = h.c.upload(x.data(), n, h.moe.shape().hidden);
                const regolith::Tensor y = h.c.ws->f32(n, h.moe.shape().hidden);
                h.moe.forward(*h.c.ws, xt, y);
                F32Out out = h.c.download(y);
                h.c.ws->reset();
                return out;
            },
            nb::arg("x"));

    nb::class_<ModelWindow>(m, "ModelWindow")
        .def_prop_ro("n_past", &ModelWindow::n_past)
        .def_prop_ro("max_ctx", &ModelWindow::max_ctx)
        .def_prop_ro("scratch_peak_bytes", &ModelWindow::scratch_peak_bytes,
                     "The most backend memory the window's scratch has held at once (the memory plan's scratch).")
        .def_prop_ro("attention_cache_bytes", &ModelWindow::attention_cache_bytes,
                     "Backend memory the attention caches hold now (the memory plan's per-token state).")
        .def_prop_ro("vocab", &ModelWindow::vocab)
        .def("reset",
             [](ModelWindow& w) {
                 SubmitOnReturn submit(w);
                 w.reset();
             })
        .def(
            "truncate",
            [](ModelWindow& w, int64_t n) {
                SubmitOnReturn submit(w);
                return w.truncate(n);
            },
            nb::arg("n"), "Keep the first n tokens; False (nothing changed) when the state cannot be cut back.")
        .def("eval", &eval, nb::arg("tokens"), nb::arg("all_logits") = true)
        .def(
            "checkpoint",
            [](ModelWindow& w) {
                SubmitOnReturn submit(w);
                w.checkpoint();
            },
            "Let truncate() cut back into the next eval (at most 16 tokens): speculative verification.")
        .def_prop_ro("has_draft_head", &ModelWindow::has_draft_head)
        .def(
            "draft",
            [](ModelWindow& w, int32_t next, int64_t n) {
                nb::gil_scoped_release release;
                SubmitOnReturn submit(w);
                return w.draft(next, n);
            },
            nb::arg("next"), nb::arg("n"), "Up to n greedy tokens from the model's draft head (MTP) after `next`.")
        .def(
            "catch_up_draft_head",
            [](ModelWindow& w) {
                nb::gil_scoped_release release;
                SubmitOnReturn submit(w);
                return w.catch_up_draft_head();
            },
            "Let the draft head take in the held tokens it has not seen (all but the last); returns how many.")
        .def_prop_ro("draft_head_lag", &ModelWindow::draft_head_lag,
                     "How many tokens catch_up_draft_head() would take in now.")
        .def("snapshot", &snapshot_window, "A copy of the whole state in host memory.")
        .def("restore", &restore_window, nb::arg("snapshot"),
             "Reset, then put back the state a snapshot() copied (StateError for another model's).")
        .def_prop_ro("can_move", &regolith::ModelWindow::can_move,
                     "Whether append_moved works for this architecture (suffix cache reuse).")
        .def("append_moved", &append_moved, nb::arg("snapshot"), nb::arg("src"), nb::arg("n"), nb::arg("recent"),
             "Append tokens [src, src + n) of a snapshot of this model's window at the next positions, their "
             "attention keys turned to them (suffix cache reuse); recent: the window's last token ids after.")
        .def("adopt_recurrent", &adopt_recurrent, nb::arg("snapshot"), nb::arg("recent"),
             "Take a snapshot's recurrent states (Gated DeltaNet, PLE's conv history) as this window's "
             "(suffix cache reuse); recent: the window's last token ids.")
        .def(
            "truncate_attention",
            [](ModelWindow& w, int64_t n, const std::vector<int32_t>& recent) {
                nb::gil_scoped_release release;
                SubmitOnReturn submit(w);
                w.truncate_attention(n, recent);
            },
            nb::arg("n"), nb::arg("recent"),
            "Keep the attention rows of the first n tokens and the recurrent states as they are; recent: the "
            "last kept token ids.")
        .def("save_state", &save_window_state, nb::arg("path"), nb::arg("fingerprint"),
             nb::arg("architecture"), nb::arg("tokens"), nb::arg("start"), nb::arg("meta"),
             nb::arg("logits").none(), nb::arg("threads") = 4, nb::arg("direct") = true,
             "Write the state (positional rows from token `start` on) to path; returns I/O statistics.")
        .def("load_state", &load_window_state, nb::arg("path"), nb::arg("header"), nb::arg("whole") = true,
             nb::arg("threads") = 4, nb::arg("direct") = true,
             "Restore a state file onto a window holding its first header.start tokens; returns (stats, "
             "logits or None).");
    m.def("eval_windows", &eval_windows, nb::arg("windows"), nb::arg("tokens"), nb::arg("all_logits"),
          "One forward pass over several windows of one model; each window's logits as its eval would give.");
    nb::class_<Qwen4ExpModel>(m, "Qwen4ExpModel")
        .def(
            "__init__",
            [](Qwen4ExpModel* self, const std::vector<std::vector<std::string>>& files,
               const std::string& experts_path, int64_t arena_slots, int io_threads, bool direct, bool lock,
               double hot_fraction, bool lookahead, bool moce, float moce_bonus, int64_t moce_protect,
               const std::string& ple_path, int64_t ple_cache_bytes, const std::string& backend,
               int64_t host_slots, bool device_routing) {
                regolith::Qwen4ExpLoadOptions o;
                set_expert_options(o, experts_path, arena_slots, io_threads, direct, lock, hot_fraction, lookahead, moce,
                                   moce_bonus, moce_protect, host_slots, device_routing);
                o.ple_path = ple_path;
                o.ple.direct = direct;
                o.ple.cache_bytes = ple_cache_bytes;
                o.ple.io_threads = io_threads;
                regolith::Backend& be = regolith::backend_by_name(backend);
                nb::gil_scoped_release release;
                SubmitOnReturn done(be);  // what loading recorded (uploads, repacks)
                new (self) Qwen4ExpModel(files, o, be);
            },
            nb::arg("files"), nb::arg("experts_path") = "", nb::arg("arena_slots") = 0,
            nb::arg("io_threads") = 4, nb::arg("direct") = true, nb::arg("lock") = true,
            nb::arg("hot_fraction") = 0.75, nb::arg("lookahead") = true, nb::arg("moce") = false,
            nb::arg("moce_bonus") = 2.0f, nb::arg("moce_protect") = 2, nb::arg("ple_path") = "",
            nb::arg("ple_cache_bytes") = 0, nb::arg("backend") = "", nb::arg("host_slots") = 0,
            nb::arg("device_routing") = false,
            "A qwen4exp model (files: groups of paths, as GGUFSet takes them) on `backend` ('' = "
            "$REGOLITH_BACKEND or 'cpu'). arena_slots > 0 streams the routed experts (from experts_path, a "
            "packed experts.bin, or the GGUF in place) through an arena of that many slots; host_slots > 0 "
            "adds a host-RAM tier of that many records where the arena is device memory; device_routing "
            "(that tier holding every record) reads them all into it at load and routes on the device; "
            "ple_path reads the PLE table from a packed ple.bin.")
        .def("config", &config_dict)
        .def_prop_ro("backend", [](const Qwen4ExpModel& m) { return std::string(m.backend().name()); })
        .def(
            "arena_info", [](const Qwen4ExpModel& m) { return arena_info(m.arena()); },
            "None when the experts are resident, else the arena's geometry.")
        .def("stats", &model_stats, "Expert arena and PLE counters since load or reset_stats().")
        .def("reset_stats", &reset_model_stats)
        .def(
            "expert_stall_seconds",
            [](const Qwen4ExpModel& m) { return m.arena() ? m.arena()->stall_seconds() : 0.0; },
            "Seconds computations have waited for expert reads since load or reset_stats() (0 when resident).")
        .def(
            "set_moce",
            [](Qwen4ExpModel& m, bool enabled, float bonus, int64_t protect) {
                m.set_moce({enabled, bonus, protect});
            },
            nb::arg("enabled"), nb::arg("bonus") = 2.0f, nb::arg("protect") = 2,
            "Cache-aware routing (MoCE): resident experts' router logits get `bonus`; the top `protect` "
            "stay.")
        .def(
            "new_window",
            [](const Qwen4ExpModel& m, int64_t max_ctx, const std::string& kv) {
                auto w = m.new_window(max_ctx, cache_type(kv));
                w->submit();  // its state's initial writes
                return w;
            },
            nb::arg("max_ctx"), nb::arg("kv_type") = "f32", nb::keep_alive<0, 1>(),
            "A window of up to max_ctx tokens; kv_type: its attention caches' type ('f32', 'f16', 'q8_0', "
            "'i8').")
        .def(
            "check_kv_type",
            [](const Qwen4ExpModel& m, const std::string& kv) { m.check_cache_type(cache_type(kv)); },
            nb::arg("kv_type"),
            "Raises where this model's windows cannot have caches of kv_type on its backend.");
    nb::class_<DenseModel>(m, "DenseModel",
                           "A gemma3, qwen2, qwen3 or qwen3moe model (dense attention on every layer; qwen3moe's FFN "
                           "is a mixture of experts).")
        .def(
            "__init__",
            [](DenseModel* self, const std::vector<std::vector<std::string>>& files, const std::string& experts_path,
               int64_t arena_slots, int io_threads, bool direct, bool lock, double hot_fraction, bool lookahead,
               bool moce, float moce_bonus, int64_t moce_protect, const std::string& backend, int64_t host_slots,
               bool device_routing) {
                regolith::ExpertLoadOptions o;
                set_expert_options(o, experts_path, arena_slots, io_threads, direct, lock, hot_fraction, lookahead, moce,
                                   moce_bonus, moce_protect, host_slots, device_routing);
                regolith::Backend& be = regolith::backend_by_name(backend);
                nb::gil_scoped_release release;
                SubmitOnReturn done(be);  // what loading recorded (uploads, repacks)
                new (self) DenseModel(files, o, be);
            },
            nb::arg("files"), nb::arg("experts_path") = "", nb::arg("arena_slots") = 0, nb::arg("io_threads") = 4,
            nb::arg("direct") = true, nb::arg("lock") = true, nb::arg("hot_fraction") = 0.75,
            nb::arg("lookahead") = true, nb::arg("moce") = false, nb::arg("moce_bonus") = 2.0f,
            nb::arg("moce_protect") = 2, nb::arg("backend") = "", nb::arg("host_slots") = 0,
            nb::arg("device_routing") = false,
            "A model of files (groups of paths, as GGUFSet takes them) on `backend` ('' = $REGOLITH_BACKEND or "
            "'cpu'); a qwen3moe model streams its routed experts as Qwen4ExpModel does (arena_slots, "
            "experts_path, host_slots, device_routing).")
        .def(
            "arena_info", [](const DenseModel& m) { return arena_info(m.arena()); },
            "None when the model has no streamed experts, else the arena's geometry.")
        .def(
            "stats", [](const DenseModel& m) { return arena_stats(m.arena()); },
            "Expert arena counters since load or reset_stats() (empty without an arena).")
        .def("reset_stats",
             [](DenseModel& m) {
                 if (regolith::ExpertArena* a = m.arena()) a->reset_stats();
             })
        .def(
            "expert_stall_seconds",
            [](const DenseModel& m) { return m.arena() ? m.arena()->stall_seconds() : 0.0; },
            "Seconds computations have waited for expert reads since load or reset_stats() (0 when resident).")
        .def(
            "set_moce",
            [](DenseModel& m, bool enabled, float bonus, int64_t protect) { m.set_moce({enabled, bonus, protect}); },
            nb::arg("enabled"), nb::arg("bonus") = 2.0f, nb::arg("protect") = 2,
            "Cache-aware routing (MoCE) of a qwen3moe model's experts.")
        .def("config", &dense_config_dict)
        .def_prop_ro("backend", [](const DenseModel& m) { return std::string(m.backend().name()); })
        .def(
            "new_window",
            [](const DenseModel& m, int64_t max_ctx, const std::string& kv) {
                auto w = m.new_window(max_ctx, kv_type(kv));
                w->submit();  // its state's initial writes
                return w;
            },
            nb::arg("max_ctx"), nb::arg("kv_type") = "f16", nb::keep_alive<0, 1>(),
            "A window of up to max_ctx tokens; kv_type 'f16' (llama.cpp's default cache), 'f32', 'q8_0' or "
            "'i8'.")
        .def(
            "check_kv_type",
            [](const DenseModel& m, const std::string& kv) {
                regolith::KvCache(m.backend(), 1, m.config().head_dim, 1, kv_type(kv));
            },
            nb::arg("kv_type"),
            "Raises where this model's windows cannot have caches of kv_type on its backend.");
}
