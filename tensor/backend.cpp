// The registry of device backends.
#include "tensor/backend.h"

#include <array>

#if defined(DDP_CUDA)
#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_backend.h"
#endif

namespace ddplab {

namespace cpu {
Backend& cpu_backend();  // tensor/cpu/cpu_backend.cpp
}

void Backend::copy_across_devices(const Tensor& dst, const Tensor& src, bool /*non_blocking*/) {
  DDP_FAIL("copy from " << src.device() << " to " << dst.device() << " is not supported");
}

Backend& backend_for(Device d) {
  if (d.is_cpu()) return cpu::cpu_backend();
#if defined(DDP_CUDA)
  return cuda_backend(d.index);
#else
  DDP_FAIL(
      "device " << d
                << " requested, but ddplab was built without CUDA (configure with -Dcuda=enabled)");
#endif
}

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
#if defined(DDP_CUDA)
  return cuda_allocator(d.index);
#else
  DDP_FAIL(
      "device " << d
                << " requested, but ddplab was built without CUDA (configure with -Dcuda=enabled)");
#endif
}

#if !defined(DDP_CUDA)
bool cuda_is_available() {
  return false;
}
int cuda_device_count() {
  return 0;
}
#endif

}  // namespace ddplab
