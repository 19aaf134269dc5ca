// Copies and zero fills of row ranges as kernels rather than memcpy / memset nodes: captured into a graph,
// a kernel node's arguments update in place from one step to the next whatever they are, where a copy
// node's may not (cudaGraphExecUpdate refuses changed 2-D copy and fill parameters).
#include <algorithm>

#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

// Rows of `width` bytes: dst row r at dst + r * dpitch, src row r at src + r * spitch; elements of T when every
// address, pitch and the width are multiples of sizeof(T). A null src fills with zeros.
template <class T>
__global__ void copy_2d_k(uint8_t* dst, size_t dpitch, const uint8_t* src, size_t spitch, size_t width, size_t height) {
    pdl_begin();
    const size_t per_row = width / sizeof(T), n = per_row * height;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / per_row, c = (i % per_row) * sizeof(T);
        T v{};
        if (src) v = *reinterpret_cast<const T*>(src + r * spitch + c);
        *reinterpret_cast<T*>(dst + r * dpitch + c) = v;
    }
}

void launch_copy(cudaStream_t s, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
    if (width == 0 || height == 0) return;
    const auto aligned = [&](size_t a) {
        return (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | dpitch | (src ? spitch : 0) |
                width) % a == 0;
    };
    auto* d = static_cast<uint8_t*>(dst);
    const auto* sp = static_cast<const uint8_t*>(src);
    const size_t unit = aligned(16) ? 16 : aligned(4) ? 4 : 1;
    const size_t n = width / unit * height;
    const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, 4096));
    if (unit == 16)
        launch(copy_2d_k<uint4>, blocks, 256, 0, s, d, dpitch, sp, spitch, width, height);
    else if (unit == 4)
        launch(copy_2d_k<uint32_t>, blocks, 256, 0, s, d, dpitch, sp, spitch, width, height);
    else
        launch(copy_2d_k<uint8_t>, blocks, 256, 0, s, d, dpitch, sp, spitch, width, height);
    RG_LAUNCHED("copy");
}

}  // namespace

void copy_2d(cudaStream_t s, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
    launch_copy(s, dst, dpitch, src, spitch, width, height);
}

void zero_2d(cudaStream_t s, void* dst, size_t dpitch, size_t width, size_t height) {
    launch_copy(s, dst, dpitch, nullptr, 0, width, height);
}

}  // namespace regolith::cuda
