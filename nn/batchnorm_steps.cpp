// The steps of batch_norm's training path one by one (nn/batchnorm_kernels.h), for SyncBatchNorm,
// which runs a collective between them: first in generic tensor ops (any device; what CUDA runs),
// then as the CPU kernels batch_norm itself runs (the NHWC ones for a channels-last or blocked x,
// whose results keep its layout). Tested against batch_norm (tests/nn/test_sync_batchnorm.cpp,
// "sync_batch_norm without a group: equals batch_norm; gradcheck in float64";
// tests/nn/test_batchnorm_channels_last.cpp, "sync_batch_norm without a group, channels-last: its
// steps keep the layout"), the CPU kernels against the generic ops ("batch_norm steps: the CPU
// kernels and the generic-op versions (CUDA's) agree"), and on blocked x against channels-last x
// bit for bit (tests/nn/test_blocked_activations.cpp, "SyncBatchNorm's steps on blocked x: the
// channels-last bits, results blocked").
#include <cstdint>
#include <vector>

#include "nn/batchnorm_internal.h"
#include "nn/batchnorm_kernels.h"
#include "nn/functional_util.h"
#include "tensor/blocked.h"
#include "tensor/ops.h"

namespace ddplab::nn::functional {

using batchnorm_detail::batch_moments;
using batchnorm_detail::batch_moments_nhwc;
using batchnorm_detail::bn_shape;
using batchnorm_detail::BnShape;
using batchnorm_detail::grad_sums;
using batchnorm_detail::grad_sums_nhwc;
using batchnorm_detail::input_grad;
using batchnorm_detail::input_grad_nhwc;
using batchnorm_detail::like;
using batchnorm_detail::normalize;
using batchnorm_detail::normalize_nhwc;
using batchnorm_detail::param_or_none;
using batchnorm_detail::stored;

namespace {

// [1, C, 1, 1] (for a 4-D x): a per-channel vector shaped to broadcast against x.
Tensor per_channel(const Tensor& v, const Tensor& x) {
  Shape shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  return ops::reshape(v, shape);
}

// Every dim but the channel dim: what the statistics sum over.
std::vector<int64_t> reduced_dims(const Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t k = 2; k < x.dim(); ++k) dims.push_back(k);
  return dims;
}

BatchNormMoments moments_generic(const Tensor& x) {
  DDP_CHECK(x.numel() > 0, "batch_norm_moments: empty input " << shape_str(x.shape()));
  Tensor x64 = ops::to(x, kFloat64);
  Tensor mean = ops::mean(x64, reduced_dims(x), /*keepdim=*/true);
  Tensor m2 = ops::sum(ops::square(ops::sub(x64, mean)), reduced_dims(x));
  return {ops::reshape(mean, {x.size(1)}), m2};
}

Tensor normalize_generic(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                         const Tensor& weight, const Tensor& bias) {
  // y = x * scale + shift, with scale and shift rounded to x's dtype once (as the kernel does).
  Tensor scale = weight.defined() ? ops::mul(ops::to(weight, kFloat64), invstd) : invstd;
  Tensor shift = ops::neg(ops::mul(mean, scale));
  if (bias.defined()) shift = ops::add(shift, ops::to(bias, kFloat64));
  return ops::add(ops::mul(x, per_channel(ops::to(scale, x.dtype()), x)),
                  per_channel(ops::to(shift, x.dtype()), x));
}

Tensor grad_sums_generic(const Tensor& x, const Tensor& dy, const Tensor& mean) {
  Tensor dy64 = ops::to(dy, kFloat64);
  Tensor xmu = ops::sub(ops::to(x, kFloat64), per_channel(mean, x));
  return ops::cat(
      {ops::sum(dy64, reduced_dims(x)), ops::sum(ops::mul(dy64, xmu), reduced_dims(x))});
}

Tensor input_grad_generic(const Tensor& x, const Tensor& dy, const Tensor& mean,
                          const Tensor& invstd, const Tensor& weight, const Tensor& sums,
                          double count) {
  const int64_t c = x.size(1);
  Tensor xmu = ops::sub(ops::to(x, kFloat64), per_channel(mean, x));
  Tensor mean_dy = per_channel(ops::div(ops::narrow(sums, 0, 0, c), count), x);
  Tensor proj =
      per_channel(ops::div(ops::mul(ops::narrow(sums, 0, c, c), ops::square(invstd)), count), x);
  Tensor k = weight.defined() ? ops::mul(invstd, ops::to(weight, kFloat64)) : invstd;
  // dx = k * (dy - mean_dy - (x - mean) * proj), in float64, then x's dtype.
  Tensor dx = ops::sub(ops::sub(ops::to(dy, kFloat64), mean_dy), ops::mul(xmu, proj));
  return ops::to(ops::mul(dx, per_channel(k, x)), x.dtype());
}

const double* doubles(const Tensor& t) {
  return t.data_ptr<double>();
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace

BatchNormMoments batch_norm_moments(const Tensor& x_in, bool generic) {
  if (generic || x_in.is_cuda()) return moments_generic(x_in);
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;  // as batch_norm_impl
  const BnShape d = bn_shape(x);
  DDP_CHECK(d.count() > 0, "batch_norm_moments: empty input " << shape_str(x.shape()));
  BatchNormMoments out{ops::empty({d.c}, kFloat64), ops::empty({d.c}, kFloat64)};
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_moments", {
    if (nhwc) {
      batch_moments_nhwc(stored<scalar_t>(x, block), d, out.mean.data_ptr<double>(),
                         out.m2.data_ptr<double>(), block);
    } else {
      batch_moments(x.data_ptr<scalar_t>(), d, out.mean.data_ptr<double>(),
                    out.m2.data_ptr<double>());
    }
  });
  return out;
}

Tensor batch_norm_normalize(const Tensor& x_in, const Tensor& mean, const Tensor& invstd,
                            const Tensor& weight_in, const Tensor& bias_in, bool generic) {
  if (generic || x_in.is_cuda()) return normalize_generic(x_in, mean, invstd, weight_in, bias_in);
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;
  const BnShape d = bn_shape(x);
  Tensor weight = param_or_none(weight_in, x, d.c, "weight");
  Tensor bias = param_or_none(bias_in, x, d.c, "bias");
  Tensor y = like(x, block, format);
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_normalize", {
    const scalar_t *w = data_or_null<scalar_t>(weight), *b = data_or_null<scalar_t>(bias);
    if (nhwc) {
      normalize_nhwc(stored<scalar_t>(x, block), d, doubles(mean), doubles(invstd), w, b,
                     stored<scalar_t>(y, block), block);
    } else {
      normalize(x.data_ptr<scalar_t>(), d, doubles(mean), doubles(invstd), w, b,
                y.data_ptr<scalar_t>());
    }
  });
  return y;
}

Tensor batch_norm_grad_sums(const Tensor& x_in, const Tensor& dy_in, const Tensor& mean,
                            bool generic) {
  if (generic || x_in.is_cuda()) return grad_sums_generic(x_in, dy_in, mean);
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format), dy = ops::contiguous(dy_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;
  if (block != 0) dy = ops::to_blocked(dy, block);
  const BnShape d = bn_shape(x);
  Tensor sums = ops::empty({2 * d.c}, kFloat64);
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_grad_sums", {
    const scalar_t *px = stored<scalar_t>(x, block), *pdy = stored<scalar_t>(dy, block);
    if (nhwc) {
      grad_sums_nhwc<scalar_t>(px, pdy, d, doubles(mean), sums.data_ptr<double>(), block);
    } else {
      grad_sums(px, pdy, d, doubles(mean), sums.data_ptr<double>());
    }
  });
  return sums;
}

Tensor batch_norm_input_grad(const Tensor& x_in, const Tensor& dy_in, const Tensor& mean,
                             const Tensor& invstd, const Tensor& weight_in, const Tensor& sums,
                             double count, bool generic) {
  if (generic || x_in.is_cuda()) {
    return input_grad_generic(x_in, dy_in, mean, invstd, weight_in, sums, count);
  }
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format), dy = ops::contiguous(dy_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;
  if (block != 0) dy = ops::to_blocked(dy, block);
  const BnShape d = bn_shape(x);
  Tensor weight = param_or_none(weight_in, x, d.c, "weight");
  Tensor dx = like(x, block, format);
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_input_grad", {
    const scalar_t *px = stored<scalar_t>(x, block), *pdy = stored<scalar_t>(dy, block);
    if (nhwc) {
      input_grad_nhwc<scalar_t>(px, pdy, d, doubles(mean), doubles(invstd),
                                data_or_null<scalar_t>(weight), doubles(sums), count,
                                stored<scalar_t>(dx, block), block);
    } else {
      input_grad(px, pdy, d, doubles(mean), doubles(invstd), data_or_null<scalar_t>(weight),
                 doubles(sums), count, dx.data_ptr<scalar_t>());
    }
  });
  return dx;
}

}  // namespace ddplab::nn::functional
