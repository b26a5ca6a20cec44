// The CUDA backend: runs ddplab's ops on NVIDIA GPUs (see docs/cuda.md).
#pragma once

#include "tensor/backend.h"

namespace ddplab {

// The backend for cuda:`device`; throws an Error naming the device (and why, e.g. "no usable GPU:
// cudaGetDeviceCount failed with CUDA error 35 ...") when it does not exist.
// tensor/backend.cpp's backend_for(Device) calls it for CUDA devices.
Backend& cuda_backend(int device);

}  // namespace ddplab
