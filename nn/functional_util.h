// Small helpers shared by the CPU kernels of nn/functional*.cpp, conv, pooling and losses.
#pragma once

#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/macros.h"

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
