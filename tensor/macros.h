// Portability macros shared by host code and CUDA kernels.
//
// DDP_HD marks a function that both executors run: the CPU loop (compiled by g++) and the CUDA
// kernel (compiled by nvcc). Writing an op once as a DDP_HD functor is what keeps the two
// backends numerically in step.
#pragma once

#if defined(__CUDACC__)
#define DDP_HD __host__ __device__ __forceinline__
#else
#define DDP_HD inline
#endif

// Marks a CPU kernel to be compiled three times: for the baseline the build targets (x86-64-v2:
// SSE4.2), for x86-64-v3 (AVX2) and for x86-64-v4 (AVX-512); the widest copy the CPU runs is picked
// when the process starts (GCC's target_clones: an ifunc chooses once). The kernels it marks spend
// their time in per-element arithmetic that the compiler vectorizes: AVX-512 does 8 doubles or 16
// floats per instruction, AVX2 4 or 8, SSE 2 or 4. Every copy computes the same operations in the
// same order, and the build forbids fusing a multiply and an add (-ffp-contract=off in
// meson.build, which also keeps AVX2's FMA instructions out), hence the same bits.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__)
#define DDP_CPU_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define DDP_CPU_CLONES
#endif

// For the small loop helpers that such kernels call: a helper the compiler chose not to inline
// would be compiled once, for the baseline, and the AVX-512 copy of the kernel would run its
// loop in SSE (batch norm's block walkers: resnet20's batch norm took 1.5-2x as long).
#if defined(__GNUC__)
#define DDP_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define DDP_ALWAYS_INLINE inline
#endif
