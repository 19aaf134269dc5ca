// The part of the Metal Shading Language standard library regolith's kernels use, in C++, for running
// metal/*.metal on the host (the Metal emulator, threadgroup.h). Kernel files are compiled inside this
// namespace, so these names hide the C library's (abs, exp, min ...) as `using namespace metal` does on
// Metal.
//
// What differs from a GPU, on purpose: SIMD-group functions wait for the whole SIMD-group (threadgroup.h);
// a simdgroup_matrix is held whole by every lane, which computes all of it (the same values a SIMD-group
// computes together); half is the host's IEEE binary16 (_Float16). Math functions are the host's: within the
// few ulp Metal's precise functions allow of the exact value, not the same bits.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "metal/emu/threadgroup.h"

namespace regolith::metal_emu::msl {

// ---- scalar types ----------------------------------------------------------------------------------------
using uchar = uint8_t;
using ushort = uint16_t;
using uint = uint32_t;
using ulong = uint64_t;
#if defined(__aarch64__) && !defined(__clang__) && __GNUC__ < 13
using half = __fp16;  // GCC before 13 has no _Float16 in C++ on arm64; __fp16 computes in float
#else
using half = _Float16;
#endif

// ---- vectors ---------------------------------------------------------------------------------------------
template <class T, int N>
struct vec;
template <class T>
struct vec<T, 2> {
    T x, y;
    vec() : x(), y() {}
    explicit vec(T v) : x(v), y(v) {}
    vec(T x_, T y_) : x(x_), y(y_) {}
    T& operator[](int i) { return (&x)[i]; }
    const T& operator[](int i) const { return (&x)[i]; }
};
template <class T>
struct vec<T, 3> {
    T x, y, z;
    vec() : x(), y(), z() {}
    explicit vec(T v) : x(v), y(v), z(v) {}
    vec(T x_, T y_, T z_) : x(x_), y(y_), z(z_) {}
    T& operator[](int i) { return (&x)[i]; }
    const T& operator[](int i) const { return (&x)[i]; }
};
template <class T>
struct vec<T, 4> {
    T x, y, z, w;
    vec() : x(), y(), z(), w() {}
    explicit vec(T v) : x(v), y(v), z(v), w(v) {}
    vec(T x_, T y_, T z_, T w_) : x(x_), y(y_), z(z_), w(w_) {}
    T& operator[](int i) { return (&x)[i]; }
    const T& operator[](int i) const { return (&x)[i]; }
};

#define RG_EMU_VEC_OP(op)                                            \
    template <class T, int N>                                        \
    vec<T, N> operator op(const vec<T, N>& a, const vec<T, N>& b) {  \
        vec<T, N> r;                                                 \
        for (int i = 0; i < N; ++i) r[i] = a[i] op b[i];             \
        return r;                                                    \
    }                                                                \
    template <class T, int N>                                        \
    vec<T, N> operator op(const vec<T, N>& a, T b) {                 \
        vec<T, N> r;                                                 \
        for (int i = 0; i < N; ++i) r[i] = a[i] op b;                \
        return r;                                                    \
    }                                                                \
    template <class T, int N>                                        \
    vec<T, N>& operator op## = (vec<T, N> & a, const vec<T, N>& b) { \
        for (int i = 0; i < N; ++i) a[i] = a[i] op b[i];             \
        return a;                                                    \
    }
RG_EMU_VEC_OP(+)
RG_EMU_VEC_OP(-)
RG_EMU_VEC_OP(*)
RG_EMU_VEC_OP(/)
#undef RG_EMU_VEC_OP

using float2 = vec<float, 2>;
using float3 = vec<float, 3>;
using float4 = vec<float, 4>;
using half2 = vec<half, 2>;
using half4 = vec<half, 4>;
using int2 = vec<int, 2>;
using int4 = vec<int, 4>;
using uint2 = vec<uint, 2>;
using uint3 = vec<uint, 3>;
using uint4 = vec<uint, 4>;
using ulong2 = vec<ulong, 2>;

template <class T, int N>
T dot(const vec<T, N>& a, const vec<T, N>& b) {
    T s = a[0] * b[0];
    for (int i = 1; i < N; ++i) s += a[i] * b[i];
    return s;
}

// ---- conversions and math --------------------------------------------------------------------------------
template <class To, class From>
To as_type(const From& v) {
    static_assert(sizeof(To) == sizeof(From), "as_type between types of one size");
    To r;
    std::memcpy(&r, &v, sizeof(To));
    return r;
}

template <class T>
T min(T a, T b) {
    return b < a ? b : a;
}
template <class T>
T max(T a, T b) {
    return a < b ? b : a;
}
template <class T>
T clamp(T x, T lo, T hi) {
    return min(max(x, lo), hi);
}
template <class T>
T select(T a, T b, bool c) {
    return c ? b : a;
}
inline int abs(int x) { return x < 0 ? -x : x; }
inline float abs(float x) { return std::fabs(x); }
inline float fabs(float x) { return std::fabs(x); }
inline float fmin(float a, float b) { return std::fmin(a, b); }
inline float fmax(float a, float b) { return std::fmax(a, b); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float sqrt(float x) { return std::sqrt(x); }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float exp(float x) { return std::exp(x); }
inline float exp2(float x) { return std::exp2(x); }
inline float log(float x) { return std::log(x); }
inline float log2(float x) { return std::log2(x); }
inline float pow(float x, float y) { return std::pow(x, y); }
inline float powr(float x, float y) { return std::pow(x, y); }
inline float tanh(float x) { return std::tanh(x); }
inline float sin(float x) { return std::sin(x); }
inline float cos(float x) { return std::cos(x); }
inline float floor(float x) { return std::floor(x); }
inline float ceil(float x) { return std::ceil(x); }
inline float round(float x) { return std::round(x); }
inline float rint(float x) { return std::rint(x); }
inline float trunc(float x) { return std::trunc(x); }
inline float copysign(float x, float y) { return std::copysign(x, y); }
inline bool isnan(float x) { return std::isnan(x); }
inline bool isinf(float x) { return std::isinf(x); }
inline bool isfinite(float x) { return std::isfinite(x); }
// Metal's precise:: and fast:: variants are the same functions here.
namespace precise {
using msl::cos;
using msl::exp;
using msl::log;
using msl::pow;
using msl::rsqrt;
using msl::sin;
using msl::sqrt;
using msl::tanh;
}  // namespace precise

// FLT_MAX and INFINITY are the C library's macros, as in Metal.
constexpr float M_PI_F = 3.14159265358979323846f;

// ---- synchronisation -------------------------------------------------------------------------------------
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline void threadgroup_barrier(mem_flags) { wait_at_barrier(); }

// A SIMD-group function: every active lane's `out` from all their `in` (and `arg`).
template <class T>
T lane_in(const Lane* l) {
    T v;
    std::memcpy(&v, l->in, sizeof(T));
    return v;
}
template <class T>
void lane_out(Lane* l, T v) {
    std::memcpy(l->out, &v, sizeof(T));
}
// The call site of a SIMD-group function in the kernel: its file and line (default arguments).
#define RG_EMU_SITE const char *file = __builtin_FILE(), uint line = __builtin_LINE()
template <class T>
T simd_call(T v, uint arg, void (*resolve)(Lane* const*, uint32_t), const char* file, uint line) {
    static_assert(sizeof(T) <= 16, "SIMD-group values of at most 16 bytes");
    Lane& l = current_lane();
    std::memcpy(l.in, &v, sizeof(T));
    l.arg = arg;
    l.resolve = resolve;
    l.site_file = file;
    l.site_line = line;
    wait_at_simd();
    T r;
    std::memcpy(&r, l.out, sizeof(T));
    return r;
}

template <class T>
void resolve_sum(Lane* const* ls, uint32_t n) {
    T s = lane_in<T>(ls[0]);  // in lane order
    for (uint32_t i = 1; i < n; ++i) s = s + lane_in<T>(ls[i]);
    for (uint32_t i = 0; i < n; ++i) lane_out(ls[i], s);
}
template <class T>
void resolve_max(Lane* const* ls, uint32_t n) {
    T m = lane_in<T>(ls[0]);
    for (uint32_t i = 1; i < n; ++i) m = max(m, lane_in<T>(ls[i]));
    for (uint32_t i = 0; i < n; ++i) lane_out(ls[i], m);
}
template <class T>
void resolve_min(Lane* const* ls, uint32_t n) {
    T m = lane_in<T>(ls[0]);
    for (uint32_t i = 1; i < n; ++i) m = min(m, lane_in<T>(ls[i]));
    for (uint32_t i = 0; i < n; ++i) lane_out(ls[i], m);
}
// The value of lane src(l) for each lane l; an inactive or out-of-range source lane gives poison bits.
template <class T, uint (*src)(uint lane, uint arg)>
void resolve_shuffle(Lane* const* ls, uint32_t n) {
    const Lane* by_index[kSimdWidth] = {};
    const uint base = ls[0]->index / kSimdWidth * kSimdWidth;
    for (uint32_t i = 0; i < n; ++i) by_index[ls[i]->index - base] = ls[i];
    for (uint32_t i = 0; i < n; ++i) {
        const uint s = src(ls[i]->index - base, ls[i]->arg);
        if (s < kSimdWidth && by_index[s]) {
            std::memcpy(ls[i]->out, by_index[s]->in, sizeof(T));
        } else {
            std::memset(ls[i]->out, 0xff, sizeof(T));
        }
    }
}
inline uint src_lane(uint, uint arg) { return arg; }
inline uint src_xor(uint lane, uint arg) { return lane ^ arg; }
inline uint src_down(uint lane, uint arg) { return lane + arg; }
inline uint src_up(uint lane, uint arg) { return lane >= arg ? lane - arg : kSimdWidth; }
template <class T>
void resolve_prefix_exclusive_sum(Lane* const* ls, uint32_t n) {
    T s = T(0);
    for (uint32_t i = 0; i < n; ++i) {
        const T v = lane_in<T>(ls[i]);
        lane_out(ls[i], s);
        s = s + v;
    }
}
template <class T>
void resolve_prefix_inclusive_sum(Lane* const* ls, uint32_t n) {
    T s = T(0);
    for (uint32_t i = 0; i < n; ++i) {
        s = s + lane_in<T>(ls[i]);
        lane_out(ls[i], s);
    }
}
inline void resolve_barrier(Lane* const*, uint32_t) {}

template <class T>
T simd_sum(T v, RG_EMU_SITE) {
    return simd_call(v, 0, &resolve_sum<T>, file, line);
}
template <class T>
T simd_max(T v, RG_EMU_SITE) {
    return simd_call(v, 0, &resolve_max<T>, file, line);
}
template <class T>
T simd_min(T v, RG_EMU_SITE) {
    return simd_call(v, 0, &resolve_min<T>, file, line);
}
template <class T>
T simd_shuffle(T v, ushort lane, RG_EMU_SITE) {
    return simd_call(v, lane, &resolve_shuffle<T, &src_lane>, file, line);
}
template <class T>
T simd_broadcast(T v, ushort lane, RG_EMU_SITE) {
    return simd_call(v, lane, &resolve_shuffle<T, &src_lane>, file, line);
}
template <class T>
T simd_shuffle_xor(T v, ushort mask, RG_EMU_SITE) {
    return simd_call(v, mask, &resolve_shuffle<T, &src_xor>, file, line);
}
template <class T>
T simd_shuffle_down(T v, ushort delta, RG_EMU_SITE) {
    return simd_call(v, delta, &resolve_shuffle<T, &src_down>, file, line);
}
template <class T>
T simd_shuffle_up(T v, ushort delta, RG_EMU_SITE) {
    return simd_call(v, delta, &resolve_shuffle<T, &src_up>, file, line);
}
template <class T>
T simd_prefix_exclusive_sum(T v, RG_EMU_SITE) {
    return simd_call(v, 0, &resolve_prefix_exclusive_sum<T>, file, line);
}
template <class T>
T simd_prefix_inclusive_sum(T v, RG_EMU_SITE) {
    return simd_call(v, 0, &resolve_prefix_inclusive_sum<T>, file, line);
}
inline void simdgroup_barrier(mem_flags, RG_EMU_SITE) { simd_call(0, 0, &resolve_barrier, file, line); }

// ---- atomics ---------------------------------------------------------------------------------------------
enum memory_order { memory_order_relaxed = __ATOMIC_RELAXED };
template <class T>
struct atomic {
    T value;
};
using atomic_int = atomic<int>;
using atomic_uint = atomic<uint>;

template <class T>
T atomic_load_explicit(const atomic<T>* p, memory_order o) {
    return __atomic_load_n(&p->value, o);
}
template <class T, class U>
void atomic_store_explicit(atomic<T>* p, U v, memory_order o) {
    __atomic_store_n(&p->value, T(v), o);
}
template <class T, class U>
T atomic_fetch_add_explicit(atomic<T>* p, U v, memory_order o) {
    return __atomic_fetch_add(&p->value, T(v), o);
}
template <class T, class U>
T atomic_fetch_sub_explicit(atomic<T>* p, U v, memory_order o) {
    return __atomic_fetch_sub(&p->value, T(v), o);
}
template <class T, class U>
T atomic_fetch_max_explicit(atomic<T>* p, U v, memory_order o) {
    T cur = __atomic_load_n(&p->value, o);
    while (cur < T(v) && !__atomic_compare_exchange_n(&p->value, &cur, T(v), true, o, o)) {
    }
    return cur;
}
template <class T, class U>
T atomic_exchange_explicit(atomic<T>* p, U v, memory_order o) {
    return __atomic_exchange_n(&p->value, T(v), o);
}

// ---- SIMD-group matrices ---------------------------------------------------------------------------------
// An 8x8 matrix a SIMD-group holds together; here every lane holds all of it (the same values), and
// multiplies are computed by each lane alone, as registers need no synchronisation.
template <class T, int R, int C>
struct simdgroup_matrix {
    static_assert(R == 8 && C == 8, "8x8 SIMD-group matrices");
    T e[8][8];
    simdgroup_matrix() = default;
    explicit simdgroup_matrix(T v) {
        for (auto& row : e)
            for (T& x : row) x = v;
    }
};
using simdgroup_float8x8 = simdgroup_matrix<float, 8, 8>;
using simdgroup_half8x8 = simdgroup_matrix<half, 8, 8>;

template <class T, int R, int C>
simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v) {
    return simdgroup_matrix<T, R, C>(v);
}
// simdgroup_store is a SIMD-group function: every lane waits for the others, and the store happens once for
// all of them, from the first lane's matrix; all lanes must name the same memory.
template <class M, class P>
struct MatrixAccess {
    M* m;  // the calling lane's matrix
    P p;
    ulong elements_per_row;
    ulong2 origin;
    bool transpose;
    bool same(const MatrixAccess& o) const {
        return p == o.p && elements_per_row == o.elements_per_row && origin.x == o.origin.x &&
               origin.y == o.origin.y && transpose == o.transpose;
    }
    // element (i, j) of the matrix in memory
    auto& at(int i, int j) const {
        const ulong r = origin.y + ulong(transpose ? j : i), c = origin.x + ulong(transpose ? i : j);
        return p[r * elements_per_row + c];
    }
};
// Marks non-uniform accesses: a lane whose request differs from the first lane's gets no result (the kernel's
// bug shows as poison, and the emulator's lane check catches most as divergence).
template <class A>
bool uniform_access(Lane* const* ls, uint32_t n) {
    const A* first = lane_in<const A*>(ls[0]);
    for (uint32_t i = 1; i < n; ++i)
        if (!first->same(*lane_in<const A*>(ls[i]))) return false;
    return true;
}
template <class T, class D>
void resolve_matrix_store(Lane* const* ls, uint32_t n) {
    using A = MatrixAccess<const simdgroup_matrix<T, 8, 8>, D*>;
    const A* first = lane_in<const A*>(ls[0]);
    if (!uniform_access<A>(ls, n)) return;
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) first->at(i, j) = D(first->m->e[i][j]);
}

// m[i][j] = src[i * elements_per_row + j] (transposed: src[j * elements_per_row + i]), origin (column, row).
// Each lane loads on its own, as soon as it gets there: since a store waits for the whole SIMD-group, no
// lane can store over a matrix before the others have loaded it from the same point of the kernel; a lane
// that loads memory another lane writes with a plain store before any barrier sees the write where the GPU,
// running the SIMD-group in lockstep, might not: the emulator is stricter there.
template <class T, class S>
void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, const S* src, ulong elements_per_row = 8,
                    ulong2 origin = ulong2(0), bool transpose = false) {
    src += origin.y * elements_per_row + origin.x;
    for (int r = 0; r < 8; ++r) {
        const S* row = src + r * elements_per_row;
        for (int c = 0; c < 8; ++c) (transpose ? m.e[c][r] : m.e[r][c]) = T(row[c]);
    }
}
template <class T, class D>
void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, D* dst, ulong elements_per_row = 8,
                     ulong2 origin = ulong2(0), bool transpose = false, RG_EMU_SITE) {
    const MatrixAccess<const simdgroup_matrix<T, 8, 8>, D*> a{&m, dst, elements_per_row, origin, transpose};
    simd_call(&a, 0, &resolve_matrix_store<T, D>, file, line);
}
// d = a * b + c: each element's products a[i][k] b[k][j] added to c[i][j] in order of k, each product and
// sum rounded to float (a GPU may fuse them; the order per element is what the kernels' contract needs, and
// it does not depend on the other elements). The columns of a row go together, so the compiler vectorises.
template <class TD, class TA, class TB, class TC>
void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                   const simdgroup_matrix<TB, 8, 8>& b, const simdgroup_matrix<TC, 8, 8>& c) {
    float bf[8][8], r[8][8];
    for (int k = 0; k < 8; ++k)
        for (int j = 0; j < 8; ++j) bf[k][j] = float(b.e[k][j]);
    for (int i = 0; i < 8; ++i) {
        for (int j = 0; j < 8; ++j) r[i][j] = float(c.e[i][j]);
        for (int k = 0; k < 8; ++k) {
            const float aik = float(a.e[i][k]);
            for (int j = 0; j < 8; ++j) r[i][j] += aik * bf[k][j];
        }
    }
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) d.e[i][j] = TD(r[i][j]);
}
// The same for float matrices (the products'), a row's 8 columns as two 4-wide vectors (SSE2 / NEON
// registers, which every host has).
inline void simdgroup_multiply_accumulate(simdgroup_float8x8& d, const simdgroup_float8x8& a,
                                          const simdgroup_float8x8& b, const simdgroup_float8x8& c) {
    typedef float col4 __attribute__((vector_size(16)));
    col4 lo[8], hi[8], r[16];
    for (int k = 0; k < 8; ++k) {
        std::memcpy(&lo[k], &b.e[k][0], sizeof(col4));
        std::memcpy(&hi[k], &b.e[k][4], sizeof(col4));
    }
    for (int i = 0; i < 8; ++i) {
        col4 acc_lo, acc_hi;
        std::memcpy(&acc_lo, &c.e[i][0], sizeof(col4));
        std::memcpy(&acc_hi, &c.e[i][4], sizeof(col4));
        for (int k = 0; k < 8; ++k) {
            acc_lo += a.e[i][k] * lo[k];
            acc_hi += a.e[i][k] * hi[k];
        }
        r[2 * i] = acc_lo, r[2 * i + 1] = acc_hi;
    }
    std::memcpy(d.e, r, sizeof r);
}
template <class TD, class TA, class TB>
void simdgroup_multiply(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                        const simdgroup_matrix<TB, 8, 8>& b) {
    simdgroup_multiply_accumulate(d, a, b, simdgroup_matrix<TD, 8, 8>(TD(0)));
}

#undef RG_EMU_SITE

}  // namespace regolith::metal_emu::msl
