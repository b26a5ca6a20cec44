// Autocast (automatic mixed precision): while an AutocastGuard is alive on a thread, the
// convolutions and linear layers of that thread compute in bfloat16 (or float16 on CUDA) and
// everything else stays float32. Named after PyTorch's torch.amp.autocast:
//
//   {
//     amp::AutocastGuard autocast(kCPU, kBFloat16);  // with torch.autocast("cpu", torch.bfloat16):
//     Tensor loss = F::cross_entropy(model(images), labels);
//   }
//   loss.backward();  // outside the guard, as in PyTorch: backward follows what forward recorded
//   opt.step();
//
// Note [Autocast]
// ~~~~~~~~~~~~~~~
// Why: a bfloat16 number is half the bytes of a float32 one, and CPUs with AVX512-BF16 (and
// GPUs' tensor cores) multiply pairs of them at twice the rate (and more). Convolutions and
// matrix products spend almost all of a CNN's time in multiply-adds, so running only them in 16
// bits gets most of the speed-up.
//
// What runs in which type (the policy):
//   * conv2d and linear: their float32 input and weight are rounded to bfloat16, the products
//     accumulate in float32, and the output is written in float32. So nothing downstream ever
//     sees a 16-bit tensor. (conv2d: oneDNN converts while it reorders the operands into its
//     blocked layout, which it does anyway, so the rounding costs no extra pass; linear: bfloat16
//     copies (`ops::to`) feed a bfloat16 x bfloat16 -> float32 GEMM.)
//   * everything else (BatchNorm, ReLU, pooling, softmax, the losses, sums and means): float32,
//     untouched. These are the ops whose results 16 bits would spoil: a sum over a batch or a
//     variance loses the small terms (bfloat16 keeps 8 significant bits: 256 + 1 == 256), and
//     exp/log in softmax amplify rounding. They are cheap, so nothing is lost by keeping them
//     in float32.
//   * parameters stay float32 (master weights). SGD adds lr * grad, often a 1000x smaller
//     number, to each weight; in bfloat16 most such updates would round away and training would
//     stall. So the weights live in float32 and only their bfloat16 copy, made afresh in every
//     forward, enters the product.
//   * backward: the op's node (recorded in forward) rounds the incoming float32 gradient to
//     bfloat16 for the products too, and writes the input, weight and bias gradients in
//     float32. So every gradient reaching a parameter is float32, and the optimizer never sees
//     a 16-bit number.
//
// Only float32 operands are cast: float64 (gradcheck) and integer tensors run as they are.
//
// bfloat16 rather than float16 on the CPU: bfloat16 has float32's 8 exponent bits, so gradients
// as small as 1e-38 survive; float16 has 5 (gradients below ~6e-8 flush to zero), so it needs
// loss scaling, and its CPU kernels need AVX512-FP16.
//
// Where it applies:
//   * the CPU, bfloat16: oneDNN's bfloat16 kernels, which need AVX-512 (fastest with
//     avx512_bf16). float16 on the CPU is refused (see above).
//   * CUDA, float16 or bfloat16 (bfloat16 from compute capability 8.0, Ampere): cuBLAS reads the
//     16-bit copies and writes float32 directly, as oneDNN does; cuDNN wants one type per call,
//     so its convolutions round their operands to 16 bits, run on the tensor cores, and widen
//     the result to float32 (nn/cudnn_conv.cpp). float16 gradients underflow: pair it with
//     loss scaling (optim/grad_scaler.h).
// Asking for what cannot run is an error at the guard, never a silent no-op or a crash later.
#pragma once

#include <optional>

#include "tensor/device.h"
#include "tensor/dtype.h"

namespace ddplab {
class Tensor;
}

namespace ddplab::amp {

// Turns autocast on (or, with enabled = false, off) for tensors on `device`'s type, on this
// thread, until it is destroyed; then the previous state comes back, so guards nest.
// Throws (with what to do instead) when `dtype` cannot run on that device: see
// check_autocast_supported.
class AutocastGuard {
 public:
  AutocastGuard(Device device, DType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType type_;
  std::optional<DType> prev_;
};

// The dtype autocast computes in on this thread for tensors on `device`'s type; empty when off.
std::optional<DType> autocast_dtype(Device device);
bool is_autocast_enabled(Device device);

// The dtype an op under the policy should run `t` in: the autocast dtype when autocast is on for
// t's device and t is float32 or already of that dtype; empty otherwise (run as is).
std::optional<DType> autocast_dtype_for(const Tensor& t);

// Throws an error that says why and what to use instead unless autocast to `dtype` can run on
// `device` (bfloat16 on a CPU with AVX-512). examples/train calls it before training starts.
void check_autocast_supported(Device device, DType dtype);

}  // namespace ddplab::amp
