// Rotary embeddings: the (cos, sin) table of every position and rotary pair (precise sinf / cosf, as the
// CPU's libm), then the NEOX rotation of each row's pairs (j, j + half), one thread per pair.
#include "cuda/kernels.cuh"

namespace regolith::cuda {

namespace {

__global__ void rope_table_k(View pos, View freq, View axis, View table) {
    pdl_begin();
    const int64_t half = freq.cols;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= pos.rows * half) return;
    const int64_t r = i / half, j = i % half;
    const float angle = float(pos.row<const int64_t>(r)[axis.row<const int32_t>(0)[j]]) * freq.row(0)[j];
    float sn, cs;
    sincosf(angle, &sn, &cs);
    table.row(r)[j] = cs;
    table.row(r)[half + j] = sn;
}

__global__ void rope_k(View x, View table, int64_t rows_per_pos) {
    pdl_begin();
    const int64_t half = table.cols / 2;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= x.rows * half) return;
    const int64_t r = i / half, j = i % half;
    const float* c = table.row(r / rows_per_pos);
    float* row = x.row(r);
    const float a = row[j], b = row[j + half], cs = c[j], sn = c[half + j];
    row[j] = a * cs - b * sn;
    row[j + half] = b * cs + a * sn;
}

}  // namespace

void rope_table(cudaStream_t s, const View& pos, const View& freq, const View& axis, const View& table) {
    if (pos.rows == 0 || freq.cols == 0) return;
    launch(rope_table_k, grid(pos.rows * freq.cols, 256), 256, 0, s, pos, freq, axis, table);
    RG_LAUNCHED("rope_table");
}

void rope(cudaStream_t s, const View& x, const View& table, int64_t rows_per_pos) {
    if (x.rows == 0 || table.cols == 0) return;
    launch(rope_k, grid(x.rows * (table.cols / 2), 256), 256, 0, s, x, table, rows_per_pos);
    RG_LAUNCHED("rope");
}

}  // namespace regolith::cuda
