// The NEON kernels compiled with the ARMv8.2 dot-product extension (CMake gives *_neondot.cpp
// -march=armv8.2-a+dotprod): sdot sums four byte products per int32 lane where the baseline build pairs
// int16 products, so the two sets' lanes group the products differently and their float results differ
// in rounding (each is checked against the reference). Used when the CPU reports the extension.
#define RG_NEON_TABLE kernels_neondot
#include "cpu/matmul_neon.cpp"
