// The thread-local autocast state and its checks (Note [Autocast] in nn/autocast.h).
#include "nn/autocast.h"

#include "nn/onednn.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

#if defined(DDP_CUDA)
#include "tensor/cuda/cuda_runtime.h"
#endif

namespace ddplab::amp {

namespace {

// One slot per device type: autocast on the CPU and on CUDA are independent, as in PyTorch.
// Thread-local like grad mode: a guard on one thread (say, a DataLoader worker) changes nothing
// on another.
thread_local std::optional<DType> state[2];

std::optional<DType>& slot(DeviceType t) {
  return state[t == DeviceType::CUDA ? 1 : 0];
}

}  // namespace

void check_autocast_supported(Device device, DType dtype) {
  DDP_CHECK(dtype == kBFloat16 || dtype == kFloat16,
            "autocast: the dtype must be bfloat16 or float16, got " << dtype_name(dtype));
  if (device.is_cuda()) {
#if defined(DDP_CUDA)
    // cuDNN and cuBLAS run float16 on every GPU ddplab builds for; bfloat16 tensor cores came
    // with Ampere. Without a GPU there is nothing to ask: the first CUDA tensor says so.
    if (dtype == kBFloat16 && gpu::is_available() && device.index < gpu::device_count()) {
      const auto [major, minor] = gpu::compute_capability(device.index);
      DDP_CHECK(major >= 8, "autocast to bfloat16 on " << device << " needs compute capability 8.0 "
                                                       << "(Ampere) or newer; this GPU has "
                                                       << major << "." << minor
                                                       << ". Use float16 (--amp fp16)");
    }
    return;
#else
    DDP_FAIL(
        "autocast on CUDA: this build of ddplab has no CUDA backend (configure with "
        "-Dcuda=enabled on a machine with the CUDA toolkit), so there is nothing to "
        "autocast; autocast to bfloat16 on the CPU instead");
#endif
  }
  DDP_CHECK(dtype == kBFloat16,
            "autocast to float16 is not supported on the CPU: oneDNN's float16 kernels need "
            "the AVX512-FP16 instructions (avx512_fp16: Intel Sapphire Rapids and newer), and "
            "ddplab has no float16 CPU path; use bfloat16 (--amp bf16), which needs no loss "
            "scaling either");
  DDP_CHECK(nn::onednn::cpu_has_bf16_kernels(),
            "autocast to bfloat16 on the CPU needs AVX-512 (oneDNN's bfloat16 kernels); this "
            "CPU offers "
                << nn::onednn::cpu_isa_name() << ". Train in float32 (no --amp)");
}

AutocastGuard::AutocastGuard(Device device, DType dtype, bool enabled)
    : type_(device.type), prev_(slot(device.type)) {
  if (enabled) {
    check_autocast_supported(device, dtype);
    slot(type_) = dtype;
  } else {
    slot(type_).reset();
  }
}

AutocastGuard::~AutocastGuard() {
  slot(type_) = prev_;
}

std::optional<DType> autocast_dtype(Device device) {
  return slot(device.type);
}

bool is_autocast_enabled(Device device) {
  return slot(device.type).has_value();
}

std::optional<DType> autocast_dtype_for(const Tensor& t) {
  if (!t.defined()) return std::nullopt;
  const std::optional<DType> amp = slot(t.device().type);
  // Float32 gets cast; a tensor already in the autocast dtype (the activations a layer under
  // autocast wrote) is read as it is.
  if (!amp || (t.dtype() != kFloat32 && t.dtype() != *amp)) return std::nullopt;
  return amp;
}

}  // namespace ddplab::amp
