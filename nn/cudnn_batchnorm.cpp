// batch_norm on CUDA through cuDNN (nn/cudnn.h).
//
// The input is described to cuDNN as [N, C, S, 1] (S = the product of the spatial dims, 1 for
// [N, C]) and normalized in CUDNN_BATCHNORM_SPATIAL mode: statistics per channel over N*S values,
// which is batch_norm's definition for every input rank (PER_ACTIVATION would normalize each
// feature of [N, C] separately, over N only: the same for S = 1, but SPATIAL is the general one).
//
// cuDNN follows PyTorch's conventions: normalization with the biased batch variance, running
// variance updated with the unbiased one, `exponentialAverageFactor` = momentum. The training
// forward saves the batch mean and inverse standard deviation, which its backward reuses.
// Eval mode with running statistics uses cudnnBatchNormalizationForwardInference; its backward
// (the statistics are constants there) is a few ordinary ops.
#include <cudnn.h>

#include <vector>

#include "autograd/function_node.h"
#include "nn/cudnn.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"

namespace ddplab::nn::cudnn {

namespace {

// A per-channel tensor as cuDNN wants it: contiguous, on x's device, in x's dtype (the running
// statistics of a float32 model could be kept in another dtype). Returns t itself when it is.
Tensor as_param(const Tensor& t, const Tensor& x) {
  Tensor r = t;
  if (r.dtype() != x.dtype()) r = ops::to(r, x.dtype());
  return ops::contiguous(r);
}

}  // namespace

Tensor batch_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight_in, const Tensor& bias_in, const Tensor& weight,
                  const Tensor& bias, bool training, bool use_batch_stats, double momentum,
                  double eps) {
  check_dtype(x_in, "batch_norm");
  DDP_CHECK(eps >= CUDNN_BN_MIN_EPSILON,
            "batch_norm: cuDNN needs eps >= " << CUDNN_BN_MIN_EPSILON << ", got " << eps);
  if (running_mean.defined()) {
    DDP_CHECK(running_mean.device() == x_in.device() && running_var.device() == x_in.device(),
              "batch_norm: running statistics are on " << running_mean.device()
                                                       << " but the input on " << x_in.device());
  }
  const int64_t n = x_in.size(0), c = x_in.size(1), s = x_in.numel() / (n * c > 0 ? n * c : 1);
  const DType dt = x_in.dtype();
  const Device dev = x_in.device();
  Tensor x = ops::contiguous(x_in);
  Tensor y = ops::empty(x.shape(), x.options());
  Tensor scale = weight.defined() ? weight : ops::ones({c}, x.options());
  Tensor shift = bias.defined() ? bias : ops::zeros({c}, x.options());
  Tensor save_mean, save_invstd;  // training: from cuDNN; eval: running mean, 1/sqrt(var + eps)
  {
    gpu::DeviceGuard guard(dev.index);
    cudnnHandle_t h = handle(dev.index);
    TensorDesc xd(dt, n, c, s, 1), pd(dt, 1, c, 1, 1);
    const Blend b(dt);
    if (use_batch_stats) {
      save_mean = ops::empty({c}, x.options());
      save_invstd = ops::empty({c}, x.options());
      const bool update = training && running_mean.defined();
      Tensor rm = update ? as_param(running_mean, x) : Tensor();
      Tensor rv = update ? as_param(running_var, x) : Tensor();
      DDP_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
          h, CUDNN_BATCHNORM_SPATIAL, b.one(), b.zero(), xd.get(), x.raw_data(), xd.get(),
          y.raw_data(), pd.get(), scale.raw_data(), shift.raw_data(), momentum,
          update ? rm.raw_data() : nullptr, update ? rv.raw_data() : nullptr, eps,
          save_mean.raw_data(), save_invstd.raw_data()));
      // Written back when cuDNN had to work on a converted or contiguous copy.
      if (update && !rm.is_same(running_mean)) ops::copy_(running_mean, rm);
      if (update && !rv.is_same(running_var)) ops::copy_(running_var, rv);
    } else {
      Tensor rm = as_param(running_mean, x), rv = as_param(running_var, x);
      DDP_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
          h, CUDNN_BATCHNORM_SPATIAL, b.one(), b.zero(), xd.get(), x.raw_data(), xd.get(),
          y.raw_data(), pd.get(), scale.raw_data(), shift.raw_data(), rm.raw_data(), rv.raw_data(),
          eps));
    }
  }

  std::vector<Tensor> inputs{x_in};
  if (weight.defined()) inputs.push_back(weight_in);
  if (bias.defined()) inputs.push_back(bias_in);
  if (!autograd::needs_grad(inputs)) return y;
  if (!use_batch_stats) {
    // Constants of the eval-mode backward, taken now (the buffers may change later).
    save_mean = ops::clone(as_param(running_mean, x));
    save_invstd = ops::rsqrt(ops::add(as_param(running_var, x), eps));
  }
  const bool has_w = weight.defined(), has_b = bias.defined();
  return autograd::record(
      "NativeBatchNormBackward(cuDNN)", y, inputs, {x, scale, save_mean, save_invstd},
      [n, c, s, eps, use_batch_stats, has_w, has_b](const Tensor& grad, const autograd::Saved& sv,
                                                    const autograd::Needs& needs) {
        const Tensor& x = sv[0];
        const Tensor& scale = sv[1];
        const Tensor& mean = sv[2];
        const Tensor& invstd = sv[3];
        Tensor dy = ops::contiguous(grad);
        autograd::Grads g(needs.size());
        const size_t iw = 1, ib = has_w ? 2 : 1;
        Tensor dx, dw, db;
        if (use_batch_stats) {
          dx = ops::empty(x.shape(), x.options());
          dw = ops::empty({c}, x.options());
          db = ops::empty({c}, x.options());
          const DType dt = x.dtype();
          const int dev = x.device().index;
          gpu::DeviceGuard guard(dev);
          cudnnHandle_t h = handle(dev);
          TensorDesc xd(dt, n, c, s, 1), pd(dt, 1, c, 1, 1);
          const Blend b(dt);
          DDP_CUDNN_CHECK(cudnnBatchNormalizationBackward(
              h, CUDNN_BATCHNORM_SPATIAL, b.one(), b.zero(), b.one(), b.zero(), xd.get(),
              x.raw_data(), xd.get(), dy.raw_data(), xd.get(), dx.raw_data(), pd.get(),
              scale.raw_data(), dw.raw_data(), db.raw_data(), eps, mean.raw_data(),
              invstd.raw_data()));
        } else {
          // y = (x - mean) * invstd * weight + bias with constant mean and invstd.
          Tensor dy3 = ops::reshape(dy, {n, c, s});
          Tensor k = ops::reshape(ops::mul(scale, invstd), {1, c, 1});
          if (needs[0]) dx = ops::reshape(ops::mul(dy3, k), x.shape());
          if (has_w && needs[iw]) {
            Tensor xhat =
                ops::mul(ops::sub(ops::reshape(x, {n, c, s}), ops::reshape(mean, {1, c, 1})),
                         ops::reshape(invstd, {1, c, 1}));
            dw = ops::sum(ops::mul(dy3, xhat), {0, 2});
          }
          if (has_b && needs[ib]) db = ops::sum(dy3, {0, 2});
        }
        if (needs[0]) g[0] = dx;
        if (has_w && needs[iw]) g[iw] = dw;
        if (has_b && needs[ib]) g[ib] = db;
        return g;
      });
}

}  // namespace ddplab::nn::cudnn
