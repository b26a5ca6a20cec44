// max_pool2d / avg_pool2d (and adaptive_avg_pool2d when the windows tile the input) on CUDA
// through cuDNN pooling (nn/cudnn.h).
//
// Max: CUDNN_POOLING_MAX_DETERMINISTIC, NaN propagating. Average:
// CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, whose divisor is always kH * kW; the CPU kernel's
// divisor clips windows hanging past the padding, but with floor-mode output sizes no window does,
// so the two agree. Backward (cudnnPoolingBackward) reads the forward's input and output, which
// the node saves.
#include <cudnn.h>

#include "autograd/function_node.h"
#include "nn/cudnn.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"

namespace ddplab::nn::cudnn {

using functional::Pair;

Tensor pool2d(PoolMode mode, const char* name, const Tensor& x_in, Pair kernel, Pair stride,
              Pair padding, int64_t oh, int64_t ow) {
  check_dtype(x_in, name);
  Tensor x = ops::contiguous(x_in);
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const DType dt = x.dtype();
  Tensor y = ops::empty({n, c, oh, ow}, x.options());
  {
    const int dev = x.device().index;
    gpu::DeviceGuard guard(dev);
    cudnnHandle_t hd = handle(dev);
    PoolDesc pd(mode, kernel, stride, padding);
    TensorDesc xd(dt, n, c, h, w), yd(dt, n, c, oh, ow);
    const Blend b(dt);
    DDP_CUDNN_CHECK(cudnnPoolingForward(hd, pd.get(), b.one(), xd.get(), x.raw_data(), b.zero(),
                                        yd.get(), y.raw_data()));
  }
  if (!autograd::needs_grad({x_in})) return y;
  return autograd::record(
      mode == PoolMode::Max ? "MaxPool2DBackward(cuDNN)" : "AvgPool2DBackward(cuDNN)", y, {x_in},
      {x, y},
      [mode, kernel, stride, padding](const Tensor& grad, const autograd::Saved& s,
                                      const autograd::Needs&) {
        const Tensor& x = s[0];
        const Tensor& y = s[1];
        Tensor gy = ops::contiguous(grad);
        Tensor gx = ops::empty(x.shape(), x.options());
        const DType dt = x.dtype();
        const int dev = x.device().index;
        gpu::DeviceGuard guard(dev);
        cudnnHandle_t hd = handle(dev);
        PoolDesc pd(mode, kernel, stride, padding);
        TensorDesc xd(dt, x.size(0), x.size(1), x.size(2), x.size(3));
        TensorDesc yd(dt, y.size(0), y.size(1), y.size(2), y.size(3));
        const Blend b(dt);
        DDP_CUDNN_CHECK(cudnnPoolingBackward(hd, pd.get(), b.one(), yd.get(), y.raw_data(),
                                             yd.get(), gy.raw_data(), xd.get(), x.raw_data(),
                                             b.zero(), xd.get(), gx.raw_data()));
        return autograd::Grads{gx};
      });
}

}  // namespace ddplab::nn::cudnn
