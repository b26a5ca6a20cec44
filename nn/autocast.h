// Autocast (automatic mixed precision): while an AutocastGuard is alive on a thread, the
// convolutions and linear layers of that thread compute in bfloat16 (or float16 on CUDA); on the
// CPU the activations between layers stay bfloat16 too, while statistics, losses and parameters
// stay float32. Named after PyTorch's torch.amp.autocast:
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
// matrix products spend most of a CNN's time in multiply-adds, so running them in 16 bits gets
// most of the speed-up; the rest of the step (BatchNorm, ReLU, residual adds and their backward)
// is passes over memory, which get faster only if the tensors they pass over are 16-bit too.
//
// What runs in which type on the CPU (the policy; PyTorch's CPU autocast does the same):
//   * conv2d: the input (bfloat16, or float32 for the first layer, which reads the images) and
//     the float32 weight enter oneDNN's products as bfloat16, the products accumulate in float32,
//     and the output is written in bfloat16 for the next layer. The conversions happen in the
//     reorders into oneDNN's blocked layout, which run anyway. Backward reads the bfloat16 output
//     gradient and writes the input gradient in the input's dtype, the weight and bias gradients
//     in float32.
//   * batch_norm and batch_norm_relu: bfloat16 in, bfloat16 out, with float32 weight, bias and
//     running statistics. The per-channel sums (mean and variance forward, the two sums of
//     backward) are accumulated in double from the bfloat16 values, as for float32 input, and
//     the per-element arithmetic is float32's; only each result is rounded to bfloat16. Backward:
//     bfloat16 input gradient, float32 weight and bias gradients.
//   * relu, add_relu (a residual block's end) and pooling: bfloat16 in, bfloat16 out (sums and
//     averages computed in float32, then rounded).
//   * linear: bfloat16 products as conv2d's, but a float32 output: in a CNN it makes the logits,
//     and the loss wants them in float32.
//   * cross_entropy and log_softmax: float32 (bfloat16 logits are widened first): exp and log
//     amplify rounding. SyncBatchNorm runs its float32 path on a widened copy.
//   * parameters stay float32 (master weights). SGD adds lr * grad, often a 1000x smaller
//     number, to each weight; in bfloat16 most such updates would round away and training would
//     stall. So the weights live in float32, only their bfloat16 copy enters the products, and
//     every gradient reaching a parameter is float32: the optimizer never sees a 16-bit number.
//   * the gradients flowing back through the activations are bfloat16, like the activations.
//     Where an activation feeds two layers (a residual block's input), the autograd engine adds
//     the two bfloat16 gradients (in float32, rounded once, as ops::add does for bfloat16).
//
// Why that is safe: the 16-bit values are activations and their gradients, each rounded once per
// layer to 8 significant bits (relative error at most 2^-9, about 0.2%). What loses small terms
// in 8 bits - a sum over a batch, a variance (256 + 1 == 256 in bfloat16), a weight update - runs
// in double or float32 as before. What it costs: the activations' rounding reaches the
// gradients. On a conv-bn-relu block (tests/nn/test_autocast.cpp) the weight gradients of the
// first convolutions differ from float32's by up to ~8% of their largest entry (two batch norms'
// backward subtract nearly equal terms, which magnifies relative error), the rest by 0.1-2%;
// PyTorch's CPU autocast on the same block: 3.6-6.4% and 0.2-1.5%. On a resnet20 step
// (tests/models/check_resnet20_amp.py) ddplab's gradients are as far from float64 as PyTorch's
// autocast's (median ratio of the errors 1.00 against PyTorch 1.13 and 2.15). The bfloat16
// training tests keep their bounds (amp_bf16_fmnist: within 1 point of float32's accuracy;
// amp_bf16_resnet20_cifar: the loss falls).
//
// Only float32 operands are cast (and bfloat16 ones read as they are): float64 (gradcheck) and
// integer tensors run as they are.
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
//     the result to float32 (nn/cudnn_conv.cpp), so there the activations between layers stay
//     float32 (the 16-bit activations above are the CPU's). float16 gradients underflow: pair
//     it with loss scaling (optim/grad_scaler.h).
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
