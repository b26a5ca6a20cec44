// Small helpers shared by the CPU kernels of nn/functional*.cpp, conv, pooling and losses.
#pragma once

#include "tensor/dtype.h"
#include "tensor/error.h"

// Runs the body with `scalar_t` bound to float or double: the dtypes the nn kernels support on
// the CPU (float32 for training, float64 for gradcheck). Other dtypes get an error naming `what`.
#define DDP_NN_DISPATCH(dtype, what, ...)                                \
  switch (dtype) {                                                       \
    case ::ddplab::DType::Float32: {                                     \
      using scalar_t = float;                                            \
      __VA_ARGS__;                                                       \
      break;                                                             \
    }                                                                    \
    case ::ddplab::DType::Float64: {                                     \
      using scalar_t = double;                                           \
      __VA_ARGS__;                                                       \
      break;                                                             \
    }                                                                    \
    default:                                                             \
      DDP_FAIL(what << ": supports float32 and float64 on the CPU, got " \
                    << ::ddplab::dtype_name(dtype));                     \
  }
