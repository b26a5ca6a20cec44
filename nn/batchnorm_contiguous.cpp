// batch_norm's reference kernels: x contiguous, viewed as [N, C, S] rows (a row is one sample's
// plane of one channel). They are tested against finite differences and PyTorch's formulas
// (tests/nn/test_functional.cpp: "batch_norm: gradcheck in training mode (4-D and 2-D), input,
// weight and bias", "batch_norm: gradcheck in eval mode uses the running statistics", "batch_norm:
// running statistics update like PyTorch (momentum, unbiased variance)"), and their relu form
// against relu(batch_norm(...)) bit for bit ("batch_norm_relu, add_relu: bit for bit
// relu(batch_norm) and relu(a + b) in float32"). Every other form is tested equal to these.
//
// Every per-channel sum is accumulated in double, and the variance is taken in two passes per row
// (mean first, then squared deviations, the second from cache), which stays exact where the
// one-pass E[x^2] - E[x]^2 would cancel catastrophically. Channels are independent, so the
// parallel loops run over channels.
#include <cstdint>
#include <vector>

#include "nn/batchnorm_internal.h"
#include "tensor/dtype.h"
#include "tensor/macros.h"
#include "tensor/threads.h"

namespace ddplab::nn::batchnorm_detail {

namespace {

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

}  // namespace

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

// y = x * scale + shift per channel; with kRelu, also y = relu_clamp(y) in the same pass
// (batch_norm_relu).
template <class T, bool kRelu>
DDP_CPU_CLONES void normalize(const T* x, const BnShape& d, const double* mean,
                              const double* invstd, const compute_t<T>* weight,
                              const compute_t<T>* bias, T* y) {
  using P = compute_t<T>;
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    P sc, sh;
    scale_shift(mean, invstd, weight, bias, c, sc, sh);
    for (int64_t n = 0; n < d.n; ++n) {
      const T* p = x + (n * d.c + c) * d.s;
      T* q = y + (n * d.c + c) * d.s;
      if constexpr (kRelu) {
        for (int64_t i = 0; i < d.s; ++i) {
          q[i] = static_cast<T>(relu_clamp(static_cast<P>(p[i]) * sc + sh));
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

namespace {

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

}  // namespace

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

// The dtypes batch_norm dispatches to (DDP_NN_DISPATCH_BF16 in nn/batchnorm_kernels.cpp), and for
// the SyncBatchNorm steps those of DDP_NN_DISPATCH (nn/batchnorm_steps.cpp).
#define DDP_BN_INSTANTIATE(T)                                                               \
  template void batch_moments<T>(const T*, const BnShape&, double*, double*);               \
  template void normalize<T, false>(const T*, const BnShape&, const double*, const double*, \
                                    const compute_t<T>*, const compute_t<T>*, T*);          \
  template void normalize<T, true>(const T*, const BnShape&, const double*, const double*,  \
                                   const compute_t<T>*, const compute_t<T>*, T*);           \
  template void backward<T>(const T*, const T*, const T*, const BnShape&, const double*,    \
                            const double*, const compute_t<T>*, bool, T*, compute_t<T>*,    \
                            compute_t<T>*);
DDP_BN_INSTANTIATE(float)
DDP_BN_INSTANTIATE(double)
DDP_BN_INSTANTIATE(BFloat16)
#undef DDP_BN_INSTANTIATE

#define DDP_BN_INSTANTIATE_STEPS(T)                                                             \
  template void grad_sums<T>(const T*, const T*, const BnShape&, const double*, double*);       \
  template void input_grad<T>(const T*, const T*, const BnShape&, const double*, const double*, \
                              const T*, const double*, double, T*);
DDP_BN_INSTANTIATE_STEPS(float)
DDP_BN_INSTANTIATE_STEPS(double)
#undef DDP_BN_INSTANTIATE_STEPS

}  // namespace ddplab::nn::batchnorm_detail
