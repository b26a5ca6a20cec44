// Small helpers shared by the CPU kernels of nn/functional*.cpp, conv, pooling and losses.
#pragma once

#include "tensor/dtype.h"
#include "tensor/error.h"

// The float32 and float64 cases of the dispatch macros below (DDP_DTYPE_CASE: tensor/dtype.h).
#define DDP_NN_FLOAT_CASES(...)               \
  DDP_DTYPE_CASE(Float32, float, __VA_ARGS__) \
  DDP_DTYPE_CASE(Float64, double, __VA_ARGS__)

// Runs the body with `scalar_t` bound to float or double: the dtypes the nn kernels support on
// the CPU (float32 for training, float64 for gradcheck). Other dtypes get an error naming `what`.
#define DDP_NN_DISPATCH(dtype, what, ...)                                \
  switch (dtype) {                                                       \
    DDP_NN_FLOAT_CASES(__VA_ARGS__)                                      \
    default:                                                             \
      DDP_FAIL(what << ": supports float32 and float64 on the CPU, got " \
                    << ::ddplab::dtype_name(dtype));                     \
  }

// DDP_NN_DISPATCH plus bfloat16, for the kernels that carry autocast's bfloat16 activations
// between layers on the CPU (Note [Autocast] in nn/autocast.h): batch norm, add_relu. With
// bfloat16, `scalar_t` is ddplab::BFloat16, a storage type: the kernels compute in
// compute_t<scalar_t> (float) and round each result once.
#define DDP_NN_DISPATCH_BF16(dtype, what, ...)                                     \
  switch (dtype) {                                                                 \
    DDP_NN_FLOAT_CASES(__VA_ARGS__)                                                \
    DDP_DTYPE_CASE(BFloat16, ::ddplab::BFloat16, __VA_ARGS__)                      \
    default:                                                                       \
      DDP_FAIL(what << ": supports float32, float64 and bfloat16 on the CPU, got " \
                    << ::ddplab::dtype_name(dtype));                               \
  }

// Marks a CPU kernel to be compiled twice: for the baseline the build targets (x86-64-v2: SSE4.2)
// and for x86-64-v4 (AVX-512), the copy picked when the process starts on a CPU that has it (GCC's
// target_clones: an ifunc chooses once). The kernels it marks spend their time in per-element
// arithmetic that the compiler vectorizes: AVX-512 does 8 doubles or 16 floats per instruction
// where SSE does 2 or 4. Both copies compute the same operations in the same order, and the build
// forbids fusing a multiply and an add (-ffp-contract=off in meson.build), hence the same bits.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DDP_CPU_CLONES __attribute__((target_clones("default", "arch=x86-64-v4")))
#else
#define DDP_CPU_CLONES
#endif
