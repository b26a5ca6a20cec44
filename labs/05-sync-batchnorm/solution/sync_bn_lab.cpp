// Lab 5, the reference solution (contracts in ../sync_bn_lab.h). Plain loops over the float64
// buffers, one collective per function, the formulas of nn/sync_batchnorm.cpp's Note.
#include <algorithm>
#include <cmath>
#include <vector>

#include "sync_bn_lab.h"
#include "tensor/ops.h"

namespace lab5 {

using namespace ddplab;

BatchStats global_batch_stats(const Tensor& x, const Tensor& shift, ProcessGroup& pg) {
  const int64_t n = x.size(0), c = x.size(1), s = spatial_size(x);
  // One buffer for the one collective: [count, sum(x - K) per channel, sum((x - K)^2) per
  // channel]. All three are sums, so SUM over ranks gives the global ones, whatever each rank's
  // batch size (an empty rank adds zeros). The count travels as a double: exact below 2^53.
  Tensor buffer = ops::zeros({1 + 2 * c}, kFloat64);
  double* count = buffer.data_ptr<double>();
  double* sum = count + 1;
  double* sum_sq = sum + c;
  const double* px = x.data_ptr<double>();
  const double* k = shift.data_ptr<double>();
  *count = static_cast<double>(n * s);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      const double* v = px + (i * c + ch) * s;
      for (int64_t j = 0; j < s; ++j) {
        const double d = v[j] - k[ch];
        sum[ch] += d;
        sum_sq[ch] += d * d;
      }
    }
  }
  pg.all_reduce(buffer, distributed::ReduceOp::Sum)->wait();

  BatchStats stats{ops::zeros({c}, kFloat64), ops::zeros({c}, kFloat64),
                   static_cast<int64_t>(*count)};
  if (stats.count == 0) return stats;  // nothing anywhere: the layer reports it
  double* mean = stats.mean.data_ptr<double>();
  double* var = stats.var.data_ptr<double>();
  for (int64_t ch = 0; ch < c; ++ch) {
    // The shift cancels exactly in the variance: Var(x) = Var(x - K) = E[(x-K)^2] - E[x-K]^2.
    // With K near the mean both terms are small, so their difference loses no digits.
    const double shifted_mean = sum[ch] / *count;
    mean[ch] = k[ch] + shifted_mean;
    // Rounding can leave a tiny negative difference where the true variance is 0.
    var[ch] = std::max(0.0, sum_sq[ch] / *count - shifted_mean * shifted_mean);
  }
  return stats;
}

Tensor normalize(const Tensor& x, const BatchStats& stats, const Tensor& weight, const Tensor& bias,
                 double eps) {
  const int64_t n = x.size(0), c = x.size(1), s = spatial_size(x);
  Tensor y = ops::empty(x.shape(), kFloat64);
  const double *px = x.data_ptr<double>(), *mean = stats.mean.data_ptr<double>(),
               *var = stats.var.data_ptr<double>(), *w = weight.data_ptr<double>(),
               *b = bias.data_ptr<double>();
  double* py = y.data_ptr<double>();
  for (int64_t ch = 0; ch < c; ++ch) {
    // Folded into one multiply-add per value: y = x * scale + offset.
    const double scale = w[ch] / std::sqrt(var[ch] + eps);
    const double offset = b[ch] - mean[ch] * scale;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = (i * c + ch) * s;
      for (int64_t j = 0; j < s; ++j) py[at + j] = px[at + j] * scale + offset;
    }
  }
  return y;
}

void update_running_stats(const Tensor& running_mean, const Tensor& running_var,
                          const BatchStats& stats, double momentum) {
  const int64_t c = running_mean.numel();
  double *rm = running_mean.data_ptr<double>(), *rv = running_var.data_ptr<double>();
  const double *mean = stats.mean.data_ptr<double>(), *var = stats.var.data_ptr<double>();
  // The running variance estimates the population's, so it takes Bessel's correction; the
  // normalisation itself uses the biased variance (that of the values it normalises).
  const double bessel = static_cast<double>(stats.count) / static_cast<double>(stats.count - 1);
  for (int64_t ch = 0; ch < c; ++ch) {
    rm[ch] = (1 - momentum) * rm[ch] + momentum * mean[ch];
    rv[ch] = (1 - momentum) * rv[ch] + momentum * var[ch] * bessel;
  }
}

BackwardResult sync_batch_norm_backward(const Tensor& dy, const Tensor& x, const BatchStats& stats,
                                        const Tensor& weight, double eps, ProcessGroup& pg) {
  const int64_t n = x.size(0), c = x.size(1), s = spatial_size(x);
  const double *px = x.data_ptr<double>(), *pdy = dy.data_ptr<double>(),
               *mean = stats.mean.data_ptr<double>(), *var = stats.var.data_ptr<double>(),
               *w = weight.data_ptr<double>();
  std::vector<double> invstd(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) invstd[ch] = 1 / std::sqrt(var[ch] + eps);

  // One buffer for the one collective: [sum(dy) per channel, sum(dy * xhat) per channel].
  Tensor sums = ops::zeros({2 * c}, kFloat64);
  double* sum_dy = sums.data_ptr<double>();
  double* sum_dy_xhat = sum_dy + c;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t at = (i * c + ch) * s;
      for (int64_t j = 0; j < s; ++j) {
        sum_dy[ch] += pdy[at + j];
        sum_dy_xhat[ch] += pdy[at + j] * (px[at + j] - mean[ch]) * invstd[ch];
      }
    }
  }
  // The parameter gradients are the LOCAL sums: copy them out before the all-reduce overwrites
  // the buffer with the global ones.
  BackwardResult r;
  r.dbias = ops::clone(ops::narrow(sums, 0, 0, c));
  r.dweight = ops::clone(ops::narrow(sums, 0, c, c));
  pg.all_reduce(sums, distributed::ReduceOp::Sum)->wait();

  r.dx = ops::empty(x.shape(), kFloat64);
  double* pdx = r.dx.data_ptr<double>();
  const auto m = static_cast<double>(stats.count);
  for (int64_t ch = 0; ch < c; ++ch) {
    const double mean_dy = sum_dy[ch] / m, mean_dy_xhat = sum_dy_xhat[ch] / m;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = (i * c + ch) * s;
      for (int64_t j = 0; j < s; ++j) {
        const double xhat = (px[at + j] - mean[ch]) * invstd[ch];
        // dy minus its projections on the two directions the normalisation removed: a constant
        // shift (the mean) and a scaling along xhat (the variance).
        pdx[at + j] = w[ch] * invstd[ch] * (pdy[at + j] - mean_dy - xhat * mean_dy_xhat);
      }
    }
  }
  return r;
}

}  // namespace lab5
