// Bindings of the token sampler (regolith.sampling wraps them).
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include <utility>
#include <vector>

#include "bindings.h"
#include "core/sampler.h"
#include "numpy_out.h"

using regolith::Sampler;
using regolith::SamplerParams;

namespace {

using Logits = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Ids = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Probs = nb::ndarray<nb::numpy, double, nb::ndim<1>>;

}  // namespace

void init_sampler(nb::module_& m) {
    nb::class_<Sampler>(m, "Sampler", "Token sampler: logits -> id (pipeline order in core/sampler.h).")
        .def(
            "__init__",
            [](Sampler* self, int64_t n_vocab, double temperature, int64_t top_k, double top_p, double min_p,
               double repeat_penalty, double presence_penalty, double frequency_penalty,
               int64_t penalty_last_n, std::vector<std::pair<int32_t, float>> logit_bias, uint64_t seed) {
                SamplerParams p;
                p.temperature = temperature;
                p.top_k = top_k;
                p.top_p = top_p;
                p.min_p = min_p;
                p.repeat_penalty = repeat_penalty;
                p.presence_penalty = presence_penalty;
                p.frequency_penalty = frequency_penalty;
                p.penalty_last_n = penalty_last_n;
                p.logit_bias = std::move(logit_bias);
                p.seed = seed;
                new (self) Sampler(std::move(p), n_vocab);
            },
            nb::arg("n_vocab"), nb::arg("temperature"), nb::arg("top_k"), nb::arg("top_p"), nb::arg("min_p"),
            nb::arg("repeat_penalty"), nb::arg("presence_penalty"), nb::arg("frequency_penalty"),
            nb::arg("penalty_last_n"), nb::arg("logit_bias"), nb::arg("seed"))
        .def(
            "sample",
            [](Sampler& s, Logits logits, Ids banned) {
                return s.sample(logits.data(), int64_t(logits.shape(0)), banned.data(),
                                int64_t(banned.shape(0)));
            },
            nb::arg("logits"), nb::arg("banned"),
            "A token id drawn from float32 logits (n_vocab,); int32 `banned` ids are excluded at this step.")
        .def(
            "probabilities",
            [](Sampler& s, Logits logits, Ids banned) {
                double* out = nullptr;
                Probs result = new_array({size_t(s.n_vocab())}, &out);
                s.probabilities(logits.data(), int64_t(logits.shape(0)), banned.data(),
                                int64_t(banned.shape(0)), out);
                return result;
            },
            nb::arg("logits"), nb::arg("banned"), "The float64 distribution (n_vocab,) sample() draws from.")
        .def("accept", &Sampler::accept, nb::arg("id"), "Append a token to the penalty history.")
        .def(
            "set_history", [](Sampler& s, Ids ids) { s.set_history(ids.data(), int64_t(ids.shape(0))); },
            nb::arg("ids"), "Replace the penalty history with int32 ids.")
        .def("reseed", &Sampler::reseed, nb::arg("seed"))
        .def_prop_ro("n_vocab", &Sampler::n_vocab);
}
