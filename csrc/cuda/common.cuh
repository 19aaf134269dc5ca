// What every CUDA kernel file shares: error checks, tensor views as kernels see them, launch arithmetic and
// warp / block reductions.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include <cfloat>
#include <cstdint>

#include "core/backend.h"
#include "core/errors.h"
#include "core/half.h"
#include "core/types.h"

namespace regolith::cuda {

// Throws regolith::Error naming `what` when e is not cudaSuccess.
void check(cudaError_t e, const char* what);
#define RG_CUDA(call) ::regolith::cuda::check((call), #call)
// After a launch: the launch's own error (bad configuration), as an Error.
#define RG_LAUNCHED(name) ::regolith::cuda::check(cudaGetLastError(), name)

// A tensor in device memory: rows of cols elements, row r at base + r * stride bytes.
struct View {
    uint8_t* base = nullptr;
    int64_t rows = 0, cols = 0, stride = 0;
    uint32_t type = 0;

    template <class T = float>
    __host__ __device__ T* row(int64_t r) const {
        return reinterpret_cast<T*>(base + r * stride);
    }
    __host__ __device__ explicit operator bool() const { return base != nullptr; }
};

// The device view of t, checked to lie inside its buffer (Error otherwise); an empty View for an empty tensor.
View view(const Tensor& t);

// Allows `kernel` `bytes` of dynamic shared memory; with max_carveout, as much shared memory per SM as it can
// have (less L1): left to the driver, an H200 SM ran 3 decode blocks of 43 KB where it has room for 5. Not
// for kernels that read the quantization tables many times (prefill's expert products): they need the L1.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, bool max_carveout = false) {
    RG_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    if (max_carveout)
        RG_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
}

// Programmatic dependent launch (sm_90 and newer): kernels are launched with launch(), which lets a kernel's
// blocks be scheduled while the kernel before it on the stream finishes; every kernel begins with
// pdl_begin(), which waits until that kernel has completed and its writes are visible, then lets the next
// kernel be launched. So the gap between dependent kernels (launch and ramp-up) overlaps the previous one's
// tail. Off where the device is older (there pdl_begin compiles to nothing) or REGOLITH_CUDA_PDL=0.
__device__ inline void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
bool pdl_enabled();

// Launches kernel(args...) on s as the triple-chevron launch would, with programmatic dependent launch where
// pdl_enabled(); a launch error is left for the caller's RG_LAUNCHED.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 blocks, dim3 threads, size_t smem, cudaStream_t s, Args&&... args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = blocks, cfg.blockDim = threads, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = &attr, cfg.numAttrs = pdl_enabled() ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

inline unsigned grid(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A reduction over the block's threads (blockDim.x a multiple of 32, at most 1024) by warp_op (a warp-wide
// reduction), `identity` for the missing warps; every thread gets the result.
template <class T, class WarpOp>
__device__ T block_reduce(T v, WarpOp warp_op, T identity) {
    __shared__ T part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = blockDim.x >> 5;
    v = warp_op(v);
    __syncthreads();  // part[] may still be read by an earlier call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    return warp_op(lane < n ? part[lane] : identity);
}

template <class T>
__device__ T block_sum(T v) {
    return block_reduce(v, [](T x) { return warp_sum(x); }, T(0));
}

__device__ inline float block_max(float v) {
    return block_reduce(v, [](float x) { return warp_max(x); }, -FLT_MAX);
}

// F32, F16 and BF16: the weight types products take as floats (the rest are block-quantized).
inline bool float_type(uint32_t t) { return t == RG_TYPE_F32 || t == RG_TYPE_F16 || t == RG_TYPE_BF16; }

// Element c of a row of F32, F16 or BF16 values, as f32.
__device__ inline float load_float(const uint8_t* row, int64_t c, uint32_t type) {
    if (type == RG_TYPE_F32) return reinterpret_cast<const float*>(row)[c];
    const uint16_t h = reinterpret_cast<const uint16_t*>(row)[c];
    return type == RG_TYPE_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

__device__ inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ inline float siluf_(float x) { return x / (1.0f + expf(-x)); }
// gpt-oss's clamped SwiGLU (Glu::SwigluOai), in the CPU's order of operations.
__device__ inline float swiglu_oai_(float g, float u) {
    const float c = fminf(g, 7.0f), v = fmaxf(fminf(u, 7.0f), -7.0f);
    return (v + 1.0f) * (c * sigmoidf_(c * 1.702f));
}

}  // namespace regolith::cuda
