// One value head's delta-rule scan, written once on GCC/Clang vector types and included by one file per
// instruction set (gdn_scan.h). Lanes never interact and no multiply-add is fused (-ffp-contract=off), so
// every output element goes through the same float multiplies and adds, in the same order, at any vector
// width: each set's result is the portable one bit for bit.
//
// One token at a time (transformers' torch_recurrent_gated_delta_rule), S: [k_dim][v_dim]:
//   S <- exp(g) S;  delta = (v - S^T k) beta;  S <- S + k delta^T;  o = S^T q
// In chunks of C tokens (torch_chunk_gated_delta_rule, WY/UT form): with cum = cumsum(g) and
// T = I + strict_lower(beta_i k_i.k_j exp(cum_i - cum_j)),
//   U = T^-1 (beta v),  W = T^-1 (beta exp(cum) k),  v_new = U - W S
//   o_i = exp(cum_i) q_i S + sum_{j<=i} (q_i.k_j) exp(cum_i - cum_j) v_new_j
//   S  <- exp(cum_last) S + sum_j exp(cum_last - cum_j) k_j v_new_j^T
// Both are sums of products accumulated in a fixed order per element; the products below are register-
// blocked (rows x vectors of columns) instead of one row at a time, which changes the order of the loads,
// not of any element's additions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/isa_namespace.h"
#include "cpu/gdn_scan.h"

namespace regolith::cpu {
inline namespace RG_ISA_NS {
namespace gdn_impl {

#if defined(__AVX512F__)
constexpr int kLanes = 16, kVecs = 4;  // 32 zmm: 4 rows x 4 vectors of accumulators
#elif defined(__AVX__)
constexpr int kLanes = 8, kVecs = 2;  // 16 ymm: 4 rows x 2
#else
constexpr int kLanes = 4, kVecs = 2;  // 16 xmm (SSE2, NEON)
#endif
constexpr int kRows = 4;

using Vec = float __attribute__((vector_size(4 * kLanes)));

template <class T>
inline T load(const float* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
template <class T>
inline void store(float* p, T v) {
    std::memcpy(p, &v, sizeof(T));
}
template <class T>
constexpr int64_t kWidth = int64_t(sizeof(T) / sizeof(float));

// nn::dot's order: 8 partial sums, folded ((p0+p4)+(p1+p5))+((p2+p6)+(p3+p7)), then the tail in order.
// (A copy, not nn::dot itself: an inline function compiled here with wider instructions must not be the
// copy the linker gives the portable code.)
inline float dot(const float* a, const float* b, int64_t n) {
    float p[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) p[l] += a[i + l] * b[i + l];
    float s = ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

// Rows r < R of C (row r at C + r * ldc), columns [c0, c0 + NV * width): start from zero or from C, then for
// k = 0 .. kend[r] - 1 in order, C[r][c] += B[k][c] * a[r * lda + k] (or -=).
template <int R, int NV, bool Sub, class T>
inline void mac_block(const float* a, int64_t lda, const int64_t* kend, const float* B, int64_t ldb, float* C,
                      int64_t ldc, bool zero, int64_t c0) {
    constexpr int64_t w = kWidth<T>;
    T acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = zero ? T{} : load<T>(C + r * ldc + c0 + v * w);
    int64_t kmin = kend[0], kmax = kend[0];
    for (int r = 1; r < R; ++r) {
        kmin = std::min(kmin, kend[r]);
        kmax = std::max(kmax, kend[r]);
    }
    for (int64_t k = 0; k < kmax; ++k) {
        T b[NV];
        for (int v = 0; v < NV; ++v) b[v] = load<T>(B + k * ldb + c0 + v * w);
        for (int r = 0; r < R; ++r) {
            if (k >= kmin && k >= kend[r]) continue;
            const float s = a[r * lda + k];
            for (int v = 0; v < NV; ++v) acc[r][v] = Sub ? acc[r][v] - b[v] * s : acc[r][v] + b[v] * s;
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) store<T>(C + r * ldc + c0 + v * w, acc[r][v]);
}

template <int R, bool Sub>
inline void mac_rows(const float* a, int64_t lda, const int64_t* kend, const float* B, int64_t ldb, float* C,
                     int64_t ldc, int64_t n, bool zero) {
    int64_t c = 0;
    for (; c + kVecs * kLanes <= n; c += kVecs * kLanes)
        mac_block<R, kVecs, Sub, Vec>(a, lda, kend, B, ldb, C, ldc, zero, c);
    for (; c + kLanes <= n; c += kLanes) mac_block<R, 1, Sub, Vec>(a, lda, kend, B, ldb, C, ldc, zero, c);
    for (; c < n; ++c) mac_block<R, 1, Sub, float>(a, lda, kend, B, ldb, C, ldc, zero, c);
}

// C[r][:n] (r < rows) = (zero ? 0 : C[r]) then, for k < kend[r] in order, +/- B[k][:n] * a[r][k].
// kend null: every row runs k < K.
template <bool Sub>
void mac(int64_t rows, const float* a, int64_t lda, int64_t K, const int64_t* kend, const float* B, int64_t ldb,
         float* C, int64_t ldc, int64_t n, bool zero) {
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        int64_t ke[kRows];
        for (int r = 0; r < kRows; ++r) ke[r] = kend ? kend[std::min(r0 + r, rows - 1)] : K;
        const float* ar = a + r0 * lda;
        float* cr = C + r0 * ldc;
        switch (std::min<int64_t>(kRows, rows - r0)) {
            case 4:
                mac_rows<4, Sub>(ar, lda, ke, B, ldb, cr, ldc, n, zero);
                break;
            case 3:
                mac_rows<3, Sub>(ar, lda, ke, B, ldb, cr, ldc, n, zero);
                break;
            case 2:
                mac_rows<2, Sub>(ar, lda, ke, B, ldb, cr, ldc, n, zero);
                break;
            default:
                mac_rows<1, Sub>(ar, lda, ke, B, ldb, cr, ldc, n, zero);
        }
    }
}

// One token's update of columns [c0, c0 + NV * width) of S (both passes over those columns while they are
// in cache): S <- decay S and kv = S^T k; delta = (v - kv) b; S <- S + k delta^T and o = S^T q.
template <int NV, class T>
inline void step_cols(const float* q, const float* k, const float* v, float decay, float b, int64_t dk,
                      int64_t dv, float* S, float* o, int64_t c0) {
    constexpr int64_t w = kWidth<T>;
    T acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = T{};
    for (int64_t i = 0; i < dk; ++i)
        for (int j = 0; j < NV; ++j) {
            float* p = S + i * dv + c0 + j * w;
            const T s = load<T>(p) * decay;
            store<T>(p, s);
            acc[j] = acc[j] + s * k[i];
        }
    T delta[NV];
    for (int j = 0; j < NV; ++j) {
        delta[j] = (load<T>(v + c0 + j * w) - acc[j]) * b;
        acc[j] = T{};
    }
    for (int64_t i = 0; i < dk; ++i)
        for (int j = 0; j < NV; ++j) {
            float* p = S + i * dv + c0 + j * w;
            const T s = load<T>(p) + delta[j] * k[i];
            store<T>(p, s);
            acc[j] = acc[j] + s * q[i];
        }
    for (int j = 0; j < NV; ++j) store<T>(o + c0 + j * w, acc[j]);
}

inline void recurrent_step(const GdnHead& in, int64_t t, int64_t dk, int64_t dv, float* S, float* o) {
    const float* q = in.q + t * in.stride;
    const float* k = in.k + t * in.stride;
    const float* v = in.v + t * in.stride;
    const float decay = std::exp(in.g[t * in.gstride]), b = in.beta[t * in.gstride];
    int64_t c = 0;
    for (; c + kVecs * kLanes <= dv; c += kVecs * kLanes) step_cols<kVecs, Vec>(q, k, v, decay, b, dk, dv, S, o, c);
    for (; c + kLanes <= dv; c += kLanes) step_cols<1, Vec>(q, k, v, decay, b, dk, dv, S, o, c);
    for (; c < dv; ++c) step_cols<1, float>(q, k, v, decay, b, dk, dv, S, o, c);
}

struct ChunkScratch {
    std::vector<float> cum, E, A, P, U, W, Qd, KdT, dS;
    std::vector<int64_t> kend;
    ChunkScratch(int64_t C, int64_t dk, int64_t dv)
        : cum(size_t(C)), E(size_t(C * C)), A(size_t(C * C)), P(size_t(C * C)), U(size_t(C * dv)),
          W(size_t(C * dk)), Qd(size_t(C * dk)), KdT(size_t(dk * C)), dS(size_t(dk * dv)), kend(size_t(C)) {}
};

inline void chunked_scan(const GdnHead& in, int64_t ntok, int64_t dk, int64_t dv, int64_t C, float* S, float* out,
                         int64_t ostride) {
    ChunkScratch x(C, dk, dv);
    for (int64_t c0 = 0; c0 < ntok; c0 += C) {
        const int64_t L = std::min(C, ntok - c0);
        auto q = [&](int64_t i) { return in.q + (c0 + i) * in.stride; };
        auto k = [&](int64_t i) { return in.k + (c0 + i) * in.stride; };
        auto v = [&](int64_t i) { return in.v + (c0 + i) * in.stride; };
        auto beta = [&](int64_t i) { return in.beta[(c0 + i) * in.gstride]; };
        float acc = 0.0f;
        for (int64_t i = 0; i < L; ++i) x.cum[size_t(i)] = acc += in.g[(c0 + i) * in.gstride];
        for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j <= i; ++j) x.E[size_t(i * C + j)] = std::exp(x.cum[size_t(i)] - x.cum[size_t(j)]);

        for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < i; ++j)
                x.A[size_t(i * C + j)] = beta(i) * dot(k(i), k(j), dk) * x.E[size_t(i * C + j)];

        // Forward substitution: X_i = B_i - sum_{j<i} A_ij X_j, row after row.
        for (int64_t i = 0; i < L; ++i) {
            float* u = &x.U[size_t(i * dv)];
            float* w = &x.W[size_t(i * dk)];
            const float bi = beta(i), bdi = beta(i) * std::exp(x.cum[size_t(i)]);
            for (int64_t j = 0; j < dv; ++j) u[j] = v(i)[j] * bi;
            for (int64_t j = 0; j < dk; ++j) w[j] = k(i)[j] * bdi;
            mac<true>(1, &x.A[size_t(i * C)], C, i, nullptr, x.U.data(), dv, u, dv, dv, false);
            mac<true>(1, &x.A[size_t(i * C)], C, i, nullptr, x.W.data(), dk, w, dk, dk, false);
        }
        // v_new = U - W S (the state before this chunk).
        mac<true>(L, x.W.data(), dk, dk, nullptr, S, dv, x.U.data(), dv, dv, false);

        // o_i = (q_i exp(cum_i)) S, then + sum_{j<=i} (q_i.k_j) E_ij v_new_j.
        for (int64_t i = 0; i < L; ++i) {
            const float di = std::exp(x.cum[size_t(i)]);
            for (int64_t m = 0; m < dk; ++m) x.Qd[size_t(i * dk + m)] = q(i)[m] * di;
            for (int64_t j = 0; j <= i; ++j) x.P[size_t(i * C + j)] = dot(q(i), k(j), dk) * x.E[size_t(i * C + j)];
            x.kend[size_t(i)] = i + 1;
        }
        float* o = out + c0 * ostride;
        mac<false>(L, x.Qd.data(), dk, dk, nullptr, S, dv, o, ostride, dv, true);
        mac<false>(L, x.P.data(), C, 0, x.kend.data(), x.U.data(), dv, o, ostride, dv, false);

        // S <- exp(cum_last) S + sum_j (k_j exp(cum_last - cum_j)) v_new_j^T.
        const float last = x.cum[size_t(L - 1)], dlast = std::exp(last);
        for (int64_t j = 0; j < L; ++j) {
            const float dj = std::exp(last - x.cum[size_t(j)]);
            for (int64_t m = 0; m < dk; ++m) x.KdT[size_t(m * C + j)] = k(j)[m] * dj;
        }
        mac<false>(dk, x.KdT.data(), C, L, nullptr, x.U.data(), dv, x.dS.data(), dv, dv, true);
        for (int64_t i = 0; i < dk * dv; ++i) S[i] = S[i] * dlast + x.dS[size_t(i)];
    }
}

inline void head_scan(const GdnHead& in, int64_t ntok, int64_t dk, int64_t dv, int64_t chunk, const GdnHeadOut& o) {
    if (o.after) {
        for (int64_t t = 0; t < ntok; ++t) {
            recurrent_step(in, t, dk, dv, o.S, o.out + t * o.ostride);
            std::memcpy(o.after + t * o.astride, o.S, size_t(dk * dv) * sizeof(float));
        }
    } else if (ntok == 1) {
        recurrent_step(in, 0, dk, dv, o.S, o.out);
    } else {
        chunked_scan(in, ntok, dk, dv, chunk, o.S, o.out, o.ostride);
    }
}

}  // namespace gdn_impl
}  // namespace RG_ISA_NS
}  // namespace regolith::cpu
