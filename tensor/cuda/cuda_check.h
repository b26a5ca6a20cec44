// Check macros for the CUDA libraries: every failing call becomes a ddplab::Error.
//
// The message names the call, where it was made (file:line) and the library's own error string:
//   DDP_CUDA_CHECK(cudaMalloc(&p, n));
//   -> "CUDA error 2 (cudaErrorMemoryAllocation: out of memory) in cudaMalloc(&p, n) at
//       tensor/cuda/cuda_allocator.cpp:88"
//
// This header includes no CUDA header at all: each macro only compares the status with 0 and
// hands it to a function in cuda_check.cpp, which is the one file that includes cuBLAS, cuDNN and
// NCCL to look up their error strings (those headers cost 6-9 s of compile time each).
#pragma once

#include "tensor/error.h"

namespace ddplab::gpu::detail {
[[noreturn]] void throw_cuda_error(int status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);
[[noreturn]] void throw_cudnn_error(int status, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(int status, const char* call, const char* file, int line);
}  // namespace ddplab::gpu::detail

// All four libraries use 0 for success (cudaSuccess, CUBLAS_STATUS_SUCCESS, ...).
#define DDP_LIBRARY_CHECK_(thrower, expr)                                  \
  do {                                                                     \
    const int ddp_status_ = static_cast<int>(expr);                        \
    if (ddp_status_ != 0) thrower(ddp_status_, #expr, __FILE__, __LINE__); \
  } while (0)

#define DDP_CUDA_CHECK(expr) DDP_LIBRARY_CHECK_(::ddplab::gpu::detail::throw_cuda_error, expr)
#define DDP_CUBLAS_CHECK(expr) DDP_LIBRARY_CHECK_(::ddplab::gpu::detail::throw_cublas_error, expr)
#define DDP_CUDNN_CHECK(expr) DDP_LIBRARY_CHECK_(::ddplab::gpu::detail::throw_cudnn_error, expr)
#define DDP_NCCL_CHECK(expr) DDP_LIBRARY_CHECK_(::ddplab::gpu::detail::throw_nccl_error, expr)
