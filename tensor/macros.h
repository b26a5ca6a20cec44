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
