// batch_norm, batch_norm_relu and batch_norm_add_relu (nn/functional.h) on the CPU: the argument
// checks, the running statistics, the kernels x's layout picks, and the autograd node around them.
// The fused forms equal the separate calls bit for bit, forward and backward
// (tests/nn/test_functional.cpp, "batch_norm_relu, add_relu: bit for bit relu(batch_norm) and
// relu(a + b) in float32"; tests/nn/test_batchnorm_channels_last.cpp, "batch_norm_add_relu: bit for
// bit add_relu(batch_norm(...)), forward and backward").
//
// The kernels have files of their own, one idea each, declared in nn/batchnorm_internal.h:
//   nn/batchnorm_contiguous.cpp              the reference kernels, the others' yardstick
//   nn/batchnorm_nhwc_walk.h                 how the channels-last and blocked loops walk x
//   nn/batchnorm_channels_last.cpp           those loops' forward
//   nn/batchnorm_channels_last_backward.cpp  their backward
//   nn/batchnorm_steps.cpp                   the training path step by step, for SyncBatchNorm
//
// The input is viewed as [N, C, S] (S = H*W for 4-D input, 1 for 2-D [N, C]); statistics are per
// channel, over N*S values.
//
// A channels-last input (Note [Channels last] in tensor/ops_create.cpp) runs loops of its own,
// over the pixels in memory order (nn/batchnorm_nhwc_walk.h). Their per-value arithmetic is in
// the activation's compute type (float for float32), their sums in float within small blocks and
// in double across them (see there for why, and how a mean far from zero stays accurate). The
// output and input gradient are channels-last too, so the convolutions around them read and write
// NHWC without a reorder. A blocked input (oneDNN's nChw16c, Note [Blocked activations] in
// tensor/blocked.cpp) runs the same loops over the same blocks of pixels, the same bits, and its
// output and gradients are blocked too. Any other layout is made contiguous first.
//
// PyTorch's conventions, which we match exactly:
//   * normalization uses the biased batch variance (divide by M = N*S);
//   * running_var is updated with the unbiased one (divide by M - 1);
//   * running = (1 - momentum) * running + momentum * batch_stat.
//
// Element types: float64 (gradcheck), float32, and bfloat16 activations with float32 weight and
// bias (autocast, Note [Autocast] in nn/autocast.h). The kernels are templates over the
// activation type T; weight, bias, their gradients and the per-element arithmetic are
// compute_t<T> (float for bfloat16, which is only a storage type here), and the statistics are
// double whatever T is. So a bfloat16 batch norm is the float32 one applied to the bfloat16
// values, each output rounded to bfloat16 once.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "autograd/function_node.h"
#include "nn/batchnorm_internal.h"
#include "nn/functional.h"
#include "nn/functional_util.h"
#include "tensor/blocked.h"
#include "tensor/ops.h"

#if defined(DDP_CUDA)
#include "nn/cudnn.h"
#endif

namespace ddplab::nn::batchnorm_detail {

// The dtype of weight and bias (and their gradients) for input x: x's, except that bfloat16
// activations take float32 ones (the master weights of autocast).
DType param_dtype(const Tensor& x) {
  return x.dtype() == kBFloat16 ? kFloat32 : x.dtype();
}

// A defined [C] tensor as a contiguous one of param_dtype(x) (or undefined).
Tensor param_or_none(const Tensor& t, const Tensor& x, int64_t c, const char* name) {
  if (!t.defined()) return t;
  DDP_CHECK(t.dim() == 1 && t.size(0) == c,
            "batch_norm: " << name << " has shape " << shape_str(t.shape()) << " but input "
                           << shape_str(x.shape()) << " has " << c << " channels");
  DDP_CHECK(t.dtype() == param_dtype(x),
            "batch_norm: " << name << " is " << dtype_name(t.dtype()) << " but the input is "
                           << dtype_name(x.dtype()) << " (expected a " << name << " of "
                           << dtype_name(param_dtype(x)) << ")");
  DDP_CHECK(t.device() == x.device(), "batch_norm: " << name << " is on " << t.device()
                                                     << " but the input on " << x.device());
  return ops::contiguous(t);
}

}  // namespace ddplab::nn::batchnorm_detail

namespace ddplab::nn::functional {

using batchnorm_detail::backward;
using batchnorm_detail::backward_nhwc;
using batchnorm_detail::batch_moments;
using batchnorm_detail::batch_moments_nhwc;
using batchnorm_detail::bn_shape;
using batchnorm_detail::BnShape;
using batchnorm_detail::like;
using batchnorm_detail::normalize;
using batchnorm_detail::normalize_add_relu_nhwc;
using batchnorm_detail::normalize_nhwc;
using batchnorm_detail::param_dtype;
using batchnorm_detail::param_or_none;
using batchnorm_detail::stored;

namespace {

std::vector<double> to_doubles(const Tensor& t) {
  return t.to_vector<double>();
}

// batch_norm, and with fuse_relu batch_norm_relu: relu(batch_norm(...)) with the clamp in the
// normalize pass and relu's backward folded into batch norm's (GradRows in
// nn/batchnorm_contiguous.cpp). With a residual as well, batch_norm_add_relu: relu(batch_norm(...)
// + residual), x channels-last and the residual of x's shape and dtype (the caller checks).
Tensor batch_norm_impl(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight_in, const Tensor& bias_in, bool training,
                       double momentum, double eps, bool fuse_relu,
                       const Tensor& residual_in = Tensor()) {
  DDP_CHECK(x_in.defined(), "batch_norm: input is undefined");
  DDP_CHECK(x_in.dim() == 2 || x_in.dim() == 4 || x_in.dim() == 3,
            "batch_norm: expected input [N, C], [N, C, L] or [N, C, H, W], got shape "
                << shape_str(x_in.shape()));
#if !defined(DDP_CUDA)
  DDP_CHECK(!x_in.is_cuda(), "batch_norm: not implemented on CUDA yet; run it on the CPU");
#endif
  DDP_CHECK(x_in.dtype() == kFloat32 || x_in.dtype() == kFloat64 || x_in.dtype() == kBFloat16,
            "batch_norm: supports float32, float64 and bfloat16, got " << dtype_name(x_in.dtype()));
  const BnShape d = bn_shape(x_in);
  Tensor weight = param_or_none(weight_in, x_in, d.c, "weight");
  Tensor bias = param_or_none(bias_in, x_in, d.c, "bias");
  DDP_CHECK(running_mean.defined() == running_var.defined(),
            "batch_norm: pass both running_mean and running_var, or neither");
  if (running_mean.defined()) {
    for (const Tensor* r : {&running_mean, &running_var}) {
      DDP_CHECK(r->numel() == d.c, "batch_norm: running statistics of shape "
                                       << shape_str(r->shape()) << " do not match input "
                                       << shape_str(x_in.shape()) << " (" << d.c << " channels)");
    }
  }
  // Without running statistics, eval mode normalizes with the batch's own (as PyTorch).
  const bool use_batch_stats = training || !running_mean.defined();
  if (use_batch_stats) {
    DDP_CHECK(d.count() > 1,
              "batch_norm: expected more than 1 value per channel when training, "
              "got input of shape "
                  << shape_str(x_in.shape()));
  }

#if defined(DDP_CUDA)
  if (x_in.is_cuda()) {
    Tensor y = cudnn::batch_norm(x_in, running_mean, running_var, weight_in, bias_in, weight, bias,
                                 training, use_batch_stats, momentum, eps);
    return fuse_relu ? relu(y) : y;  // cuDNN's own fused mode is not wired up: two kernels
  }
#endif

  // A channels-last x stays so and runs the NHWC loops; anything else is made contiguous. A
  // blocked x (Note [Blocked activations] in tensor/blocked.cpp) runs them too (NhwcBlocks in
  // nn/batchnorm_nhwc_walk.h), and its output, residual and gradients are blocked alike.
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;
  const bool add = residual_in.defined();
  Tensor residual = add ? ops::contiguous(residual_in, format) : Tensor();
  if (add && block != 0) residual = ops::to_blocked(residual, block);
  std::vector<double> mean(static_cast<size_t>(d.c)), var(static_cast<size_t>(d.c));
  if (use_batch_stats) {
    DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm", {
      if (nhwc) {
        batch_moments_nhwc(stored<scalar_t>(x, block), d, mean.data(), var.data(), block);
      } else {
        batch_moments(x.data_ptr<scalar_t>(), d, mean.data(), var.data());
      }
    });
    for (double& v : var) v /= static_cast<double>(d.count());  // M2 -> biased variance
  } else {
    mean = to_doubles(running_mean);
    var = to_doubles(running_var);
  }
  std::vector<double> invstd(mean.size());
  for (size_t c = 0; c < mean.size(); ++c) invstd[c] = 1.0 / std::sqrt(var[c] + eps);

  if (training && running_mean.defined()) {
    // In place, outside the graph: running statistics are buffers, not parameters.
    std::vector<double> rm = to_doubles(running_mean), rv = to_doubles(running_var);
    const double unbias = static_cast<double>(d.count()) / static_cast<double>(d.count() - 1);
    for (size_t c = 0; c < rm.size(); ++c) {
      rm[c] = (1 - momentum) * rm[c] + momentum * mean[c];
      rv[c] = (1 - momentum) * rv[c] + momentum * var[c] * unbias;
    }
    ops::copy_(running_mean, ops::from_vector(rm, running_mean.shape()));
    ops::copy_(running_var, ops::from_vector(rv, running_var.shape()));
  }

  Tensor y = like(x, block, format);
  DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm", {
    using param_t = compute_t<scalar_t>;
    const param_t* w = weight.defined() ? weight.data_ptr<param_t>() : nullptr;
    const param_t* b = bias.defined() ? bias.data_ptr<param_t>() : nullptr;
    const scalar_t* px = stored<scalar_t>(x, block);
    scalar_t* py = stored<scalar_t>(y, block);
    if (add) {
      normalize_add_relu_nhwc(px, stored<scalar_t>(residual, block), d, mean.data(), invstd.data(),
                              w, b, py, block);
    } else if (nhwc && fuse_relu) {
      normalize_nhwc<scalar_t, true>(px, d, mean.data(), invstd.data(), w, b, py, block);
    } else if (nhwc) {
      normalize_nhwc(px, d, mean.data(), invstd.data(), w, b, py, block);
    } else if (fuse_relu) {
      normalize<scalar_t, true>(x.data_ptr<scalar_t>(), d, mean.data(), invstd.data(), w, b,
                                y.data_ptr<scalar_t>());
    } else {
      normalize(x.data_ptr<scalar_t>(), d, mean.data(), invstd.data(), w, b,
                y.data_ptr<scalar_t>());
    }
  });

  std::vector<Tensor> inputs{x_in};
  if (weight.defined()) inputs.push_back(weight_in);
  if (bias.defined()) inputs.push_back(bias_in);
  if (add) inputs.push_back(residual_in);
  if (!autograd::needs_grad(inputs)) return y;
  Tensor stats = ops::from_vector(mean, {d.c}, kFloat64);
  Tensor stats_invstd = ops::from_vector(invstd, {d.c}, kFloat64);
  const bool has_w = weight.defined(), has_b = bias.defined();
  autograd::Saved saved{x, stats, stats_invstd};
  if (has_w) saved.push_back(weight);
  // The fused op's mask is its own output's sign (as relu's backward, which saves its output).
  // For channels-last x, the backward recomputes the mask from x, with the bias (masked_grad in
  // nn/batchnorm_channels_last_backward.cpp), except with a residual, which the mask depends on
  // too.
  const size_t iy = saved.size();
  if (fuse_relu && (!nhwc || add)) saved.push_back(y);
  if (fuse_relu && nhwc && !add && has_b) saved.push_back(bias);
  const char* name = add         ? "NativeBatchNormAddReluBackward"
                     : fuse_relu ? "NativeBatchNormReluBackward"
                                 : "NativeBatchNormBackward";
  return autograd::record(
      name, y, inputs, std::move(saved),
      [d, use_batch_stats, has_w, has_b, fuse_relu, add, iy, format, nhwc](
          const Tensor& grad, const autograd::Saved& s, const autograd::Needs& needs) {
        const Tensor& x = s[0];
        // dy in the output's dtype, x's (a float32 consumer of a bfloat16 output sends float32).
        Tensor dy = ops::contiguous(ops::to(grad, x.dtype()), format);
        // x may have been rearranged since the forward (by a reader unaware of the blocked
        // layout); if it is still blocked, dy (and y) are brought to its layout.
        const int64_t block = nhwc ? ops::blocked_block(x) : 0;
        if (block != 0) dy = ops::to_blocked(dy, block);
        const Tensor y_saved = add && block != 0 ? ops::to_blocked(s[iy], block)
                               : add             ? s[iy]
                                                 : Tensor();
        // With a residual, relu's masked gradient is what both batch norm and the residual get
        // (add_relu's backward); backward_nhwc computes it.
        Tensor dy_masked = add ? like(x, block, format) : Tensor();
        const bool relu_in_bn = fuse_relu && !add;
        autograd::Grads g(needs.size());
        Tensor dx = needs[0] ? like(x, block, format) : Tensor();
        const size_t iw = 1, ib = has_w ? 2 : 1;
        const TensorOptions param_options = x.options().with_dtype(param_dtype(x));
        Tensor dw = has_w && needs[iw] ? ops::empty({d.c}, param_options) : Tensor();
        Tensor db = has_b && needs[ib] ? ops::empty({d.c}, param_options) : Tensor();
        const double* mean = s[1].data_ptr<double>();
        const double* invstd = s[2].data_ptr<double>();
        DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm backward", {
          using param_t = compute_t<scalar_t>;
          const param_t* w = has_w ? s[3].data_ptr<param_t>() : nullptr;
          scalar_t* pdx = dx.defined() ? stored<scalar_t>(dx, block) : nullptr;
          param_t* pdw = dw.defined() ? dw.data_ptr<param_t>() : nullptr;
          param_t* pdb = db.defined() ? db.data_ptr<param_t>() : nullptr;
          if (nhwc) {
            const param_t* b = relu_in_bn && has_b ? s[iy].data_ptr<param_t>() : nullptr;
            const scalar_t* y = add ? stored<scalar_t>(y_saved, block) : nullptr;
            scalar_t* pmasked = add ? stored<scalar_t>(dy_masked, block) : nullptr;
            backward_nhwc(stored<scalar_t>(x, block), stored<scalar_t>(dy, block), relu_in_bn, b, y,
                          pmasked, d, mean, invstd, w, use_batch_stats, pdx, pdw, pdb, block);
          } else {
            backward(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                     relu_in_bn ? s[iy].data_ptr<scalar_t>() : nullptr, d, mean, invstd, w,
                     use_batch_stats, pdx, pdw, pdb);
          }
        });
        g[0] = dx;
        if (has_w) g[iw] = dw;
        if (has_b) g[ib] = db;
        if (add) g[ib + (has_b ? 1 : 0)] = dy_masked;
        return g;
      });
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         /*fuse_relu=*/false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum,
                       double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         /*fuse_relu=*/true);
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                           bool training, double momentum, double eps) {
  DDP_CHECK(x.defined() && residual.defined(),
            "batch_norm_add_relu: input and residual must be defined");
  // One pass for what the NHWC loops serve; anything else takes the separate calls.
  const bool fusable = !x.is_cuda() && x.dim() == 4 && residual.shape() == x.shape() &&
                       residual.dtype() == x.dtype() && residual.device() == x.device() &&
                       ops::suggest_memory_format(x) == ops::MemoryFormat::ChannelsLast &&
                       (x.dtype() == kFloat32 || x.dtype() == kFloat64 || x.dtype() == kBFloat16);
  if (!fusable) {
    return add_relu(batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps),
                    residual);
  }
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         /*fuse_relu=*/true, residual);
}

}  // namespace ddplab::nn::functional
