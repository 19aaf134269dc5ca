#include "model/hyper_connection.h"

#include <vector>

#include "model/nn.h"

namespace regolith {

HyperConnection HyperConnection::load(const ModelWeights& w, const std::string& prefix, int64_t hidden, int64_t hc,
                                      int64_t rank, float eps, bool with_inject) {
    HyperConnection h;
    h.hidden = hidden;
    h.hc = hc;
    h.rank = rank;
    h.eps = eps;
    const int64_t width = hc * hidden;
    h.norm = w.f32(prefix + "_norm.weight", width);
    h.down = w.matrix(prefix + "_down.weight", rank, width);
    h.up = w.matrix(prefix + "_up.weight", width, rank);
    if (with_inject) h.inject = w.matrix(prefix + "_inject.weight", hc, width);
    return h;
}

void HyperConnection::read(Backend& be, const float* streams, int64_t ntok, float* mixed, float* inject_w) const {
    const int64_t width = hc * hidden;
    std::vector<float> xn(size_t(ntok * width));  // [ntok][hc * hidden] normalised per stream
    for (int64_t t = 0; t < ntok; ++t)
        for (int64_t s = 0; s < hc; ++s) {
            const int64_t o = t * width + s * hidden;
            nn::rms_norm(streams + o, hidden, norm + s * hidden, eps, xn.data() + o);
        }
    std::vector<float> low(size_t(ntok * rank));  // [ntok][rank]
    const MatmulJob in[] = {{down, xn.data(), ntok, low.data()}, {inject, xn.data(), ntok, inject_w}};
    be.matmul_batch(in, inject.rows == 0 ? 1 : 2);
    for (float& v : low) v = nn::silu(v / float(hc));
    std::vector<float> gate(size_t(ntok * width));  // [ntok][hc * hidden]
    be.matmul(up, low.data(), ntok, gate.data());
    for (int64_t t = 0; t < ntok; ++t)
        for (int64_t i = 0; i < hidden; ++i) {
            float acc = 0.0f;
            for (int64_t s = 0; s < hc; ++s) {
                const int64_t o = t * width + s * hidden + i;
                acc += nn::sigmoid(gate[o]) * xn[o];
            }
            mixed[t * hidden + i] = acc / float(hc);
        }
    if (inject.rows == 0) return;
    for (int64_t i = 0; i < ntok * hc; ++i) inject_w[i] = 2.0f * nn::sigmoid(inject_w[i] / float(hc));
}

void HyperConnection::write(const float* block_out, const float* inject_w, int64_t ntok, float* streams) const {
    for (int64_t t = 0; t < ntok; ++t)
        for (int64_t s = 0; s < hc; ++s) {
            const float w = inject_w[t * hc + s];
            float* dst = streams + (t * hc + s) * hidden;
            for (int64_t i = 0; i < hidden; ++i) dst[i] += w * block_out[t * hidden + i];
        }
}

}  // namespace regolith
