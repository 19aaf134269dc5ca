// Header-defined inline code (half conversions, block decoders) is compiled both into the portable core
// and into ISA-specific kernel files built with -mavx2, -mavx512f and the like. Wrapping it in an ISA-named inline
// namespace makes those copies distinct symbols, so the linker can never hand an AVX2-compiled copy of an
// inline function to portable code (which would crash on CPUs without AVX2). Callers just write
// regolith::name; the inline namespace is invisible to them.
#pragma once

// Header-defined code that CUDA kernels share (half conversions, block decoders) is RG_HD: in CUDA files
// device code only (their tables are __device__ there), elsewhere plain C++.
#if defined(__CUDACC__)
#define RG_HD __device__
#else
#define RG_HD
#endif

#if defined(__CUDACC__)
#define RG_ISA_NS isa_cuda
#elif defined(__AVX512F__)
#define RG_ISA_NS isa_avx512
#elif defined(__AVXVNNI__)
#define RG_ISA_NS isa_avxvnni
#elif defined(__AVX2__)
#define RG_ISA_NS isa_avx2
#elif defined(__SSSE3__)
#define RG_ISA_NS isa_ssse3
#elif defined(__ARM_FEATURE_DOTPROD)
#define RG_ISA_NS isa_neondot
#elif defined(__ARM_NEON)
#define RG_ISA_NS isa_neon
#else
#define RG_ISA_NS isa_generic
#endif
