// Backend::store_rows on CUDA: a warp per row (cache.cuh's cache_store_row).
#include "cuda/cache.cuh"
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

constexpr int kRowsPerBlock = 4;  // warps per block

__global__ void store_rows_k(View x, View dst, View scale) {
    pdl_begin();
    const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    if (r < x.rows) cache_store_row(x.row(r), dst, scale, r);
}

}  // namespace

void store_rows(cudaStream_t s, const View& x, const View& dst, const View& scale) {
    if (x.rows == 0) return;
    launch(store_rows_k, grid(x.rows, kRowsPerBlock), 32 * kRowsPerBlock, 0, s, x, dst, scale);
    RG_LAUNCHED("store_rows");
}

}  // namespace regolith::cuda
