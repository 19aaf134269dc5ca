// Dispatches over several sequences (gdn.cpp, ple.cpp): up to RG_MAX_SEQS sequences per dispatch, their
// per-sequence tensors (metal/args.h RgSeqTensor) reached through the buffers they lie in, bound at offset 0
// after the op's other buffers, at most RG_SEQ_BINDINGS distinct ones (sequences whose states share a buffer,
// as rows of one state set do, share a binding).
#pragma once

#include <algorithm>

#include "metal/metal_backend.h"

namespace regolith::metal {

// The buffers of one dispatch's per-sequence tensors.
class SeqBindings {
  public:
    // Whether the tensors of views v (empty ones need nothing) fit the bindings left.
    bool fits(std::initializer_list<const View*> vs) const {
        int added = 0;
        const DeviceBuffer* seen[RG_SEQ_BINDINGS];
        for (const View* v : vs) {
            if (!*v || find(v->arg.buffer) >= 0) continue;
            bool dup = false;
            for (int i = 0; i < added; ++i) dup = dup || seen[i] == v->arg.buffer;
            if (dup) continue;
            if (n_ + added == RG_SEQ_BINDINGS) return false;
            seen[added++] = v->arg.buffer;
        }
        return true;
    }
    // v's place (binding RG_SEQ_BINDINGS for an empty view); v must fit.
    RgSeqTensor place(const View& v) {
        RgSeqTensor t{0, 0, RG_SEQ_BINDINGS, 0};
        if (!v) return t;
        int i = find(v.arg.buffer);
        if (i < 0) {
            i = n_++;
            buffers_[i] = v.arg.buffer;
        }
        t.off = v.arg.offset, t.stride = v.shape.stride, t.bind = uint32_t(i);
        return t;
    }
    // Binding i, or `unused` where none is (Metal wants every buffer argument bound).
    KernelArg arg(int i, const KernelArg& unused) const {
        return i < n_ ? KernelArg{buffers_[i], 0, nullptr, 0} : unused;
    }
    void clear() { n_ = 0; }

  private:
    int find(const DeviceBuffer* b) const {
        for (int i = 0; i < n_; ++i)
            if (buffers_[i] == b) return i;
        return -1;
    }
    DeviceBuffer* buffers_[RG_SEQ_BINDINGS] = {};
    int n_ = 0;
};

// The causal depthwise convs (gdn.metal rg_ssm_conv, ple.metal rg_ple_conv; `a` has the shapes and taps
// set): a work item per block of a.block tokens of a sequence (y) and threadgroups of up to 256 channels (x).
// after(seq) is the view of a sequence's per-token states (empty: none).
template <class Seq, class After>
void launch_conv(MetalBackend& be, const char* kernel, RgConvArgs& a, const View& x, const View& w,
                 const View& out, const Seq* seqs, int64_t n_seqs, After after) {
    const int64_t cols = x.shape.cols;
    const uint32_t threads = simd_threads(cols);
    SeqBindings sb;
    int64_t items = 0;
    const auto flush = [&] {
        if (a.n_seqs == 0) return;
        be.launch(kernel, uint32_t((cols + threads - 1) / threads), uint32_t(items), threads, 0,
                  {MetalBackend::bytes(a), x.arg, w.arg, out.arg, sb.arg(0, x.arg), sb.arg(1, x.arg),
                   sb.arg(2, x.arg), sb.arg(3, x.arg), sb.arg(4, x.arg), sb.arg(5, x.arg), sb.arg(6, x.arg),
                   sb.arg(7, x.arg)});
        a.n_seqs = 0, items = 0;
        sb.clear();
    };
    for (int64_t i = 0; i < n_seqs; ++i) {
        const Seq& s = seqs[i];
        if (s.ntok == 0) continue;
        const View st = a.hist > 0 ? be.view(s.state) : View{}, af = a.hist > 0 ? after(s) : View{};
        if (a.n_seqs == RG_MAX_SEQS || !sb.fits({&st, &af})) flush();
        RgSeqSlot& q = a.seqs[a.n_seqs++];
        q.t0 = s.t0, q.ntok = s.ntok, q.first = items;
        q.state = sb.place(st), q.after = sb.place(af);
        items += (s.ntok + a.block - 1) / a.block;
    }
    flush();
}

}  // namespace regolith::metal
