#include "model/hyper_connection.h"

namespace regolith {

HyperConnection HyperConnection::load(const ModelWeights& w, const std::string& prefix, int64_t hidden, int64_t hc,
                                      int64_t rank, float eps, bool with_inject) {
    HyperConnection h;
    h.hidden = hidden;
    h.hc = hc;
    h.rank = rank;
    h.eps = eps;
    const int64_t width = hc * hidden;
    h.norm = w.f32(prefix + "_norm.weight", width).reshaped(hc, hidden);
    h.down = w.matrix(prefix + "_down.weight", rank, width);
    h.up = w.matrix(prefix + "_up.weight", width, rank);
    if (with_inject) h.inject = w.matrix(prefix + "_inject.weight", hc, width);
    return h;
}

HyperConnection HyperConnection::pre_norm(const ModelWeights& w, const std::string& name, int64_t hidden, float eps) {
    HyperConnection h;
    h.hidden = hidden;
    h.hc = 1;
    h.eps = eps;
    h.norm = w.f32_vector(name, hidden);
    return h;
}

void HyperConnection::read(Workspace& ws, const Tensor& streams, const Tensor& mixed, const Tensor& inject_w) const {
    Backend& be = ws.backend();
    if (!down) {
        be.rms_norm(streams, norm, eps, mixed);
        return;
    }
    Workspace::Scope scope(ws);
    const int64_t ntok = streams.rows, width = hc * hidden;
    const Tensor xn = ws.f32(ntok, width);  // [ntok][hc * hidden] normalised per stream
    be.rms_norm(streams.reshaped(ntok * hc, hidden), norm, eps, xn.reshaped(ntok * hc, hidden));
    const Tensor low = ws.f32(ntok, rank);  // [ntok][rank]
    const MatmulJob in[] = {{down, xn, low}, {inject, xn, inject_w}};
    be.matmul(in, inject ? 2 : 1);
    be.unary(low, Unary::SiluDiv, float(hc), low);
    const Tensor gate = ws.f32(ntok, width);  // [ntok][hc * hidden]
    be.matmul(up, low, gate);
    be.hc_mix(gate, xn, hc, mixed);
    if (inject) be.unary(inject_w, Unary::TwoSigmoidDiv, float(hc), inject_w);
}

void HyperConnection::write(Backend& be, const Tensor& block_out, const Tensor& inject_w, const Tensor& streams) const {
    if (!down)
        be.add(streams, block_out, streams);
    else
        be.hc_write(block_out, inject_w, hc, streams);
}

}  // namespace regolith
