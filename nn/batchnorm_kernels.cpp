// batch_norm: the CPU kernels (forward in training and eval mode, closed-form backward).
//
// The input is viewed as [N, C, S] (S = H*W for 4-D input, 1 for 2-D [N, C]); statistics are per
// channel, over N*S values. Every per-channel sum is accumulated in double, and the variance is
// taken in two passes per row (mean first, then squared deviations, the second from cache), which
// stays exact where the one-pass E[x^2] - E[x]^2 would cancel catastrophically. Channels are
// independent, so the parallel loops run over channels.
//
// PyTorch's conventions, which we match exactly:
//   * normalization uses the biased batch variance (divide by M = N*S);
//   * running_var is updated with the unbiased one (divide by M - 1);
//   * running = (1 - momentum) * running + momentum * batch_stat.
//
// The end of the file exposes the steps of the training path one by one (nn/batchnorm_kernels.h)
// for SyncBatchNorm, which runs a collective between them; they share the per-channel loops.
//
// Element types: float64 (gradcheck), float32, and bfloat16 activations with float32 weight and
// bias (autocast, Note [Autocast] in nn/autocast.h). The kernels are templates over the
// activation type T; weight, bias, their gradients and the per-element arithmetic are
// compute_t<T> (float for bfloat16, which is only a storage type here), and the statistics are
// double whatever T is. So a bfloat16 batch norm is the float32 one applied to the bfloat16
// values, each output rounded to bfloat16 once.
#include <cmath>
#include <vector>

#include "nn/batchnorm_kernels.h"

#include "autograd/function_node.h"
#include "nn/functional.h"
#include "nn/functional_util.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

#if defined(DDP_CUDA)
#include "nn/cudnn.h"
#endif

namespace ddplab::nn::functional {

namespace {

struct BnShape {
  int64_t n, c, s;
  int64_t count() const { return n * s; }
};

BnShape bn_shape(const Tensor& x) {
  BnShape d{x.size(0), x.size(1), 1};
  for (int64_t k = 2; k < x.dim(); ++k) d.s *= x.size(k);
  return d;
}

// Row sums in double with eight independent accumulators: a single running sum is one long
// dependency chain (and may not be reordered without -ffast-math); eight chains keep the adders
// busy and let the compiler use vector lanes, several times faster on long rows.
template <class T, class F>
DDP_CPU_CLONES double row_sum(int64_t s, F term) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= s; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += term(i + k);
  }
  for (; i < s; ++i) acc[0] += term(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Per-channel mean and M2 = sum((x - mean)^2) of x viewed as [n, c, s] (d.count() > 0), reading
// x from memory once. Each row (one sample's plane of the channel, a few KB) gets its own mean and
// M2 in two passes, the second of which finds the row still in L1 cache; the rows then merge
// exactly: the channel's M2 is the rows' M2 plus s * sum((row_mean - mean)^2), the spread of the
// row means. As accurate as two passes over the whole channel, at the memory traffic of one.
template <class T>
DDP_CPU_CLONES void batch_moments(const T* x, const BnShape& d, double* mean, double* m2) {
  const double s = static_cast<double>(d.s);
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    std::vector<double> row_mean(static_cast<size_t>(d.n));
    double mean_sum = 0, rows_m2 = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      const T* p = x + (n * d.c + c) * d.s;
      const double rm = row_sum<T>(d.s, [p](int64_t i) { return static_cast<double>(p[i]); }) / s;
      rows_m2 += row_sum<T>(d.s, [p, rm](int64_t i) {
        const double dx = static_cast<double>(p[i]) - rm;
        return dx * dx;
      });
      row_mean[static_cast<size_t>(n)] = rm;
      mean_sum += rm;
    }
    const double m = mean_sum / static_cast<double>(d.n);
    double spread = 0;
    for (double rm : row_mean) spread += (rm - m) * (rm - m);
    mean[c] = m;
    m2[c] = rows_m2 + s * spread;
  }
}

// y = (x - mean) * invstd * weight + bias, as y = x * scale + shift per channel; with kRelu, also
// y = max(y, 0) in the same pass (batch_norm_relu), the clamp written as ReluOp writes it so that
// NaN stays NaN.
template <class T, bool kRelu = false>
DDP_CPU_CLONES void normalize(const T* x, const BnShape& d, const double* mean,
                              const double* invstd, const compute_t<T>* weight,
                              const compute_t<T>* bias, T* y) {
  using P = compute_t<T>;
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    const double g = weight ? static_cast<double>(weight[c]) : 1.0;
    const double scale = g * invstd[c];
    const double shift = (bias ? static_cast<double>(bias[c]) : 0.0) - mean[c] * scale;
    const P sc = static_cast<P>(scale), sh = static_cast<P>(shift);
    for (int64_t n = 0; n < d.n; ++n) {
      const T* p = x + (n * d.c + c) * d.s;
      T* q = y + (n * d.c + c) * d.s;
      if constexpr (kRelu) {
        for (int64_t i = 0; i < d.s; ++i) {
          const P v = static_cast<P>(p[i]) * sc + sh;
          q[i] = static_cast<T>(v <= P(0) ? P(0) : v);
        }
      } else {
        for (int64_t i = 0; i < d.s; ++i) q[i] = static_cast<T>(static_cast<P>(p[i]) * sc + sh);
      }
    }
  }
}

// Backward. With xhat = (x - mean) * invstd and per-channel sums sum_dy = sum(dy),
// sum_dy_xhat = sum(dy * xhat):
//   dweight = sum_dy_xhat, dbias = sum_dy,
//   training: dx = weight * invstd / M * (M * dy - sum_dy - xhat * sum_dy_xhat)
//             (the batch statistics depend on x, hence the two correction terms);
//   eval:     dx = weight * invstd * dy (the running statistics are constants).
// The two steps are separate functions because SyncBatchNorm all-reduces the sums between them.

// The rows of the gradient that reaches batch norm's output. For batch_norm: dy itself. For
// batch_norm_relu, whose backward folds relu's in: dy where the fused output y is > 0 and 0
// elsewhere, exactly what relu_backward would have written into a tensor of its own. Here it is
// written one row at a time into a buffer that stays in L1 cache: no full-size tensor, one pass
// over memory fewer, and the sums below keep loops without a condition, which the compiler
// vectorizes (with the condition inside, it does not).
template <class T>
class GradRows {
 public:
  // y: the fused output, or nullptr (no relu); s: the length of a row.
  GradRows(const T* dy, const T* y, int64_t s) : dy_(dy), y_(y), buf_(y ? s : 0) {}
  // The row that starts at `offset` (s values).
  const T* row(int64_t offset, int64_t s) {
    if (y_ == nullptr) return dy_ + offset;
    const T *g = dy_ + offset, *out = y_ + offset;
    for (int64_t i = 0; i < s; ++i) {
      const T gi = g[i];  // loaded whatever the sign: a load under the condition stays scalar
      buf_[i] = static_cast<compute_t<T>>(out[i]) > 0 ? gi : T(0);
    }
    return buf_.data();
  }

 private:
  const T *dy_, *y_;
  std::vector<T> buf_;
};

// sum(dy) and sum(dy * (x - mu)) over channel c.
template <class T>
DDP_CPU_CLONES void channel_grad_sums(const T* x, GradRows<T>& dy, const BnShape& d, int64_t c,
                                      double mu, double& sum_dy, double& sum_dy_xmu) {
  sum_dy = 0;
  sum_dy_xmu = 0;
  for (int64_t n = 0; n < d.n; ++n) {
    const int64_t row = (n * d.c + c) * d.s;
    const T *px = x + row, *pg = dy.row(row, d.s);
    sum_dy += row_sum<T>(d.s, [pg](int64_t i) { return static_cast<double>(pg[i]); });
    sum_dy_xmu += row_sum<T>(d.s, [pg, px, mu](int64_t i) {
      return static_cast<double>(pg[i]) * (static_cast<double>(px[i]) - mu);
    });
  }
}

// Training-mode dx over channel c from the sums over all `count` values of the channel:
// dx = k * (dy - mean_dy - (x - mu) * proj), k = weight * invstd, proj = sum_dy_xhat * invstd / M.
// In double even for float32: the three terms can nearly cancel, and in float32 the rounding of
// each (~1e-7 of it) is then a large part of dx; over a few steps that moved DDP with
// SyncBatchNorm away from single-process training by 5e-4 (tests/distributed, ddp_train_syncbn).
template <class T>
DDP_CPU_CLONES void channel_input_grad(const T* x, GradRows<T>& dy, const BnShape& d, int64_t c,
                                       double mu, double is, double g, double sum_dy,
                                       double sum_dy_xmu, double count, T* dx) {
  const double k = g * is;
  const double mean_dy = sum_dy / count;
  const double proj = sum_dy_xmu * is * is / count;
  for (int64_t n = 0; n < d.n; ++n) {
    const int64_t row = (n * d.c + c) * d.s;
    const T *px = x + row, *pg = dy.row(row, d.s);
    T* q = dx + row;
    for (int64_t i = 0; i < d.s; ++i) {
      const double dy = static_cast<double>(pg[i]), xmu = static_cast<double>(px[i]) - mu;
      q[i] = static_cast<T>(k * (dy - mean_dy - xmu * proj));
    }
  }
}

// batch_norm's backward, one channel at a time (the channel's x and dy are still in cache when
// dx is written). y: batch_norm_relu's output, whose sign masks dy, or nullptr for batch_norm.
template <class T>
DDP_CPU_CLONES void backward(const T* x, const T* dy_in, const T* y, const BnShape& d,
                             const double* mean, const double* invstd, const compute_t<T>* weight,
                             bool training, T* dx, compute_t<T>* dweight, compute_t<T>* dbias) {
  using P = compute_t<T>;
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    GradRows<T> dy(dy_in, y, d.s);
    const double mu = mean[c], is = invstd[c];
    double sum_dy = 0, sum_dy_xmu = 0;
    channel_grad_sums(x, dy, d, c, mu, sum_dy, sum_dy_xmu);
    if (dweight) dweight[c] = static_cast<P>(sum_dy_xmu * is);
    if (dbias) dbias[c] = static_cast<P>(sum_dy);
    if (!dx) continue;
    const double g = weight ? static_cast<double>(weight[c]) : 1.0;
    if (training) {
      channel_input_grad(x, dy, d, c, mu, is, g, sum_dy, sum_dy_xmu, static_cast<double>(d.count()),
                         dx);
    } else {
      const P k = static_cast<P>(g * is);
      for (int64_t n = 0; n < d.n; ++n) {
        const int64_t row = (n * d.c + c) * d.s;
        const T* pg = dy.row(row, d.s);
        T* q = dx + row;
        for (int64_t i = 0; i < d.s; ++i) q[i] = static_cast<T>(static_cast<P>(pg[i]) * k);
      }
    }
  }
}

// The two backward steps over all channels, for SyncBatchNorm (sums: [sum_dy (C), sum_dy_xmu (C)]).
template <class T>
void grad_sums(const T* x, const T* dy, const BnShape& d, const double* mean, double* sums) {
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    GradRows<T> rows(dy, nullptr, d.s);
    channel_grad_sums(x, rows, d, c, mean[c], sums[c], sums[d.c + c]);
  }
}

template <class T>
void input_grad(const T* x, const T* dy, const BnShape& d, const double* mean, const double* invstd,
                const T* weight, const double* sums, double count, T* dx) {
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    const double g = weight ? static_cast<double>(weight[c]) : 1.0;
    GradRows<T> rows(dy, nullptr, d.s);
    channel_input_grad(x, rows, d, c, mean[c], invstd[c], g, sums[c], sums[d.c + c], count, dx);
  }
}

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

std::vector<double> to_doubles(const Tensor& t) {
  return t.to_vector<double>();
}

// batch_norm, and with fuse_relu batch_norm_relu: relu(batch_norm(...)) with the clamp in the
// normalize pass and relu's backward folded into batch norm's (GradRows above).
Tensor batch_norm_impl(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight_in, const Tensor& bias_in, bool training,
                       double momentum, double eps, bool fuse_relu) {
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

  Tensor x = ops::contiguous(x_in);
  std::vector<double> mean(static_cast<size_t>(d.c)), var(static_cast<size_t>(d.c));
  if (use_batch_stats) {
    DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm",
                         batch_moments(x.data_ptr<scalar_t>(), d, mean.data(), var.data()));
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

  Tensor y = ops::empty(x.shape(), x.options());
  DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm", {
    using param_t = compute_t<scalar_t>;
    const param_t* w = weight.defined() ? weight.data_ptr<param_t>() : nullptr;
    const param_t* b = bias.defined() ? bias.data_ptr<param_t>() : nullptr;
    if (fuse_relu) {
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
  if (!autograd::needs_grad(inputs)) return y;
  Tensor stats = ops::from_vector(mean, {d.c}, kFloat64);
  Tensor stats_invstd = ops::from_vector(invstd, {d.c}, kFloat64);
  const bool has_w = weight.defined(), has_b = bias.defined();
  autograd::Saved saved{x, stats, stats_invstd};
  if (has_w) saved.push_back(weight);
  // The fused op's mask is its own output's sign (as relu's backward, which saves its output).
  const size_t iy = saved.size();
  if (fuse_relu) saved.push_back(y);
  return autograd::record(
      fuse_relu ? "NativeBatchNormReluBackward" : "NativeBatchNormBackward", y, inputs,
      std::move(saved),
      [d, use_batch_stats, has_w, has_b, fuse_relu, iy](
          const Tensor& grad, const autograd::Saved& s, const autograd::Needs& needs) {
        const Tensor& x = s[0];
        // dy in the output's dtype, x's (a float32 consumer of a bfloat16 output sends float32).
        Tensor dy = ops::contiguous(ops::to(grad, x.dtype()));
        autograd::Grads g(needs.size());
        Tensor dx = needs[0] ? ops::empty(x.shape(), x.options()) : Tensor();
        const size_t iw = 1, ib = has_w ? 2 : 1;
        const TensorOptions param_options = x.options().with_dtype(param_dtype(x));
        Tensor dw = has_w && needs[iw] ? ops::empty({d.c}, param_options) : Tensor();
        Tensor db = has_b && needs[ib] ? ops::empty({d.c}, param_options) : Tensor();
        const double* mean = s[1].data_ptr<double>();
        const double* invstd = s[2].data_ptr<double>();
        DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm backward", {
          using param_t = compute_t<scalar_t>;
          backward(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                   fuse_relu ? s[iy].data_ptr<scalar_t>() : nullptr, d, mean, invstd,
                   has_w ? s[3].data_ptr<param_t>() : nullptr, use_batch_stats,
                   dx.defined() ? dx.data_ptr<scalar_t>() : nullptr,
                   dw.defined() ? dw.data_ptr<param_t>() : nullptr,
                   db.defined() ? db.data_ptr<param_t>() : nullptr);
        });
        g[0] = dx;
        if (has_w) g[iw] = dw;
        if (has_b) g[ib] = db;
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

// --- the steps, for SyncBatchNorm (nn/batchnorm_kernels.h) --------------------------------------
//
// First in generic tensor ops (any device; what CUDA runs), then the CPU kernels.

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
  Tensor x = ops::contiguous(x_in);
  const BnShape d = bn_shape(x);
  DDP_CHECK(d.count() > 0, "batch_norm_moments: empty input " << shape_str(x.shape()));
  BatchNormMoments out{ops::empty({d.c}, kFloat64), ops::empty({d.c}, kFloat64)};
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_moments",
                  batch_moments(x.data_ptr<scalar_t>(), d, out.mean.data_ptr<double>(),
                                out.m2.data_ptr<double>()));
  return out;
}

Tensor batch_norm_normalize(const Tensor& x_in, const Tensor& mean, const Tensor& invstd,
                            const Tensor& weight_in, const Tensor& bias_in, bool generic) {
  if (generic || x_in.is_cuda()) return normalize_generic(x_in, mean, invstd, weight_in, bias_in);
  Tensor x = ops::contiguous(x_in);
  const BnShape d = bn_shape(x);
  Tensor weight = param_or_none(weight_in, x, d.c, "weight");
  Tensor bias = param_or_none(bias_in, x, d.c, "bias");
  Tensor y = ops::empty(x.shape(), x.options());
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_normalize",
                  normalize(x.data_ptr<scalar_t>(), d, doubles(mean), doubles(invstd),
                            data_or_null<scalar_t>(weight), data_or_null<scalar_t>(bias),
                            y.data_ptr<scalar_t>()));
  return y;
}

Tensor batch_norm_grad_sums(const Tensor& x_in, const Tensor& dy_in, const Tensor& mean,
                            bool generic) {
  if (generic || x_in.is_cuda()) return grad_sums_generic(x_in, dy_in, mean);
  Tensor x = ops::contiguous(x_in), dy = ops::contiguous(dy_in);
  const BnShape d = bn_shape(x);
  Tensor sums = ops::empty({2 * d.c}, kFloat64);
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_grad_sums",
                  grad_sums(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), d, doubles(mean),
                            sums.data_ptr<double>()));
  return sums;
}

Tensor batch_norm_input_grad(const Tensor& x_in, const Tensor& dy_in, const Tensor& mean,
                             const Tensor& invstd, const Tensor& weight_in, const Tensor& sums,
                             double count, bool generic) {
  if (generic || x_in.is_cuda()) {
    return input_grad_generic(x_in, dy_in, mean, invstd, weight_in, sums, count);
  }
  Tensor x = ops::contiguous(x_in), dy = ops::contiguous(dy_in);
  const BnShape d = bn_shape(x);
  Tensor weight = param_or_none(weight_in, x, d.c, "weight");
  Tensor dx = ops::empty(x.shape(), x.options());
  DDP_NN_DISPATCH(
      x.dtype(), "batch_norm_input_grad",
      input_grad(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), d, doubles(mean), doubles(invstd),
                 data_or_null<scalar_t>(weight), doubles(sums), count, dx.data_ptr<scalar_t>()));
  return dx;
}

}  // namespace ddplab::nn::functional
