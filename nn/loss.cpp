// log_softmax, cross_entropy (fused log-softmax + NLL with label smoothing) and accuracy.
//
// Both softmax kernels subtract the row maximum before exponentiating (so exp never overflows)
// and sum in double. cross_entropy never materializes log-probabilities: per row it keeps only
// logsumexp, and the backward rebuilds softmax from the saved logits, which is cheaper in memory
// than saving an [N, C] matrix of probabilities.
#include <cmath>
#include <vector>

#include "autograd/function_node.h"
#include "nn/functional.h"
#include "nn/functional_util.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

namespace ddplab::nn::functional {

namespace {

// A contiguous tensor viewed as [outer, n, inner] around dimension `dim`.
struct Axis {
  int64_t outer = 1, n = 1, inner = 1;
};
Axis axis_of(const Shape& shape, int64_t dim) {
  Axis a;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < dim)
      a.outer *= shape[i];
    else if (i == dim)
      a.n = shape[i];
    else
      a.inner *= shape[i];
  }
  return a;
}

// y[o, :, i] = x[o, :, i] - logsumexp(x[o, :, i]).
template <class T>
void log_softmax_forward(const T* x, const Axis& a, T* y) {
#pragma omp parallel for if (a.outer * a.n * a.inner > kParallelGrain)
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      const T* px = x + o * a.n * a.inner + i;
      T* py = y + o * a.n * a.inner + i;
      double mx = -INFINITY;
      for (int64_t k = 0; k < a.n; ++k) mx = std::max<double>(mx, px[k * a.inner]);
      double s = 0;
      for (int64_t k = 0; k < a.n; ++k) s += std::exp(px[k * a.inner] - mx);
      const double lse = mx + std::log(s);
      for (int64_t k = 0; k < a.n; ++k) py[k * a.inner] = static_cast<T>(px[k * a.inner] - lse);
    }
  }
}

// dx = dy - softmax * sum(dy), with softmax = exp(y).
template <class T>
void log_softmax_backward(const T* dy, const T* y, const Axis& a, T* dx) {
#pragma omp parallel for if (a.outer * a.n * a.inner > kParallelGrain)
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t i = 0; i < a.inner; ++i) {
      const int64_t base = o * a.n * a.inner + i;
      double s = 0;
      for (int64_t k = 0; k < a.n; ++k) s += dy[base + k * a.inner];
      for (int64_t k = 0; k < a.n; ++k) {
        const int64_t j = base + k * a.inner;
        dx[j] = static_cast<T>(dy[j] - std::exp(static_cast<double>(y[j])) * s);
      }
    }
  }
}

// Per-row loss of cross-entropy with label smoothing eps over C classes:
//   loss_r = (1 - eps) * (lse_r - x[r, t_r]) + eps * mean_c(lse_r - x[r, c]).
template <class T>
void cross_entropy_forward(const T* x, const int64_t* t, int64_t rows, int64_t c, double eps,
                           double* lse_out, double* loss) {
#pragma omp parallel for if (rows * c > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* px = x + r * c;
    double mx = -INFINITY, sum_x = 0;
    for (int64_t k = 0; k < c; ++k) {
      mx = std::max<double>(mx, px[k]);
      sum_x += px[k];
    }
    double s = 0;
    for (int64_t k = 0; k < c; ++k) s += std::exp(px[k] - mx);
    const double lse = mx + std::log(s);
    lse_out[r] = lse;
    loss[r] = (1 - eps) * (lse - px[t[r]]) + eps * (lse - sum_x / static_cast<double>(c));
  }
}

// d loss_r / d x[r, k] = softmax_k - (1 - eps) * [k == t_r] - eps / C, times the row's weight.
template <class T>
void cross_entropy_backward(const T* x, const int64_t* t, const double* lse, const T* g_row,
                            bool scalar_grad, double scale, int64_t rows, int64_t c, double eps,
                            T* dx) {
#pragma omp parallel for if (rows * c > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const double w =
        (scalar_grad ? static_cast<double>(g_row[0]) : static_cast<double>(g_row[r])) * scale;
    const T* px = x + r * c;
    T* q = dx + r * c;
    const double smooth = eps / static_cast<double>(c);
    for (int64_t k = 0; k < c; ++k) {
      double d = std::exp(px[k] - lse[r]) - smooth;
      if (k == t[r]) d -= 1 - eps;
      q[k] = static_cast<T>(w * d);
    }
  }
}

}  // namespace

Tensor log_softmax(const Tensor& x_in, int64_t dim) {
  DDP_CHECK(x_in.defined() && x_in.dim() >= 1,
            "log_softmax: expected a tensor with at least 1 dim");
  DDP_CHECK(!x_in.is_cuda(), "log_softmax: not implemented on CUDA yet; run it on the CPU");
  dim = wrap_dim(dim, x_in.dim(), "log_softmax");
  Tensor x = ops::contiguous(x_in);
  Axis a = axis_of(x.shape(), dim);
  Tensor y = ops::empty(x.shape(), x.options());
  DDP_NN_DISPATCH(x.dtype(), "log_softmax",
                  log_softmax_forward(x.data_ptr<scalar_t>(), a, y.data_ptr<scalar_t>()));
  if (!autograd::needs_grad({x_in})) return y;
  return autograd::record(
      "LogSoftmaxBackward", y, {x_in}, {y},
      [a](const Tensor& grad, const autograd::Saved& s, const autograd::Needs&) {
        Tensor dy = ops::contiguous(grad);
        Tensor dx = ops::empty(dy.shape(), dy.options());
        DDP_NN_DISPATCH(dy.dtype(), "log_softmax backward",
                        log_softmax_backward(dy.data_ptr<scalar_t>(), s[0].data_ptr<scalar_t>(), a,
                                             dx.data_ptr<scalar_t>()));
        return autograd::Grads{dx};
      });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction,
                     double label_smoothing) {
  DDP_CHECK(logits.defined() && target.defined(), "cross_entropy: undefined argument");
  DDP_CHECK(logits.dim() == 2, "cross_entropy: expected logits [N, C], got shape "
                                   << shape_str(logits.shape()) << " (target "
                                   << shape_str(target.shape()) << ")");
  DDP_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
            "cross_entropy: target " << shape_str(target.shape()) << " does not match logits "
                                     << shape_str(logits.shape()) << " (expected ["
                                     << logits.size(0) << "])");
  DDP_CHECK(target.dtype() == kInt64, "cross_entropy: target must be int64 class indices, got "
                                          << dtype_name(target.dtype()));
  DDP_CHECK(!logits.is_cuda(), "cross_entropy: not implemented on CUDA yet; run it on the CPU");
  DDP_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
            "cross_entropy: label_smoothing must be in [0, 1], got " << label_smoothing);
  const int64_t rows = logits.size(0), c = logits.size(1);
  Tensor x = ops::contiguous(logits);
  Tensor t = ops::contiguous(target);
  const int64_t* tp = t.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    DDP_CHECK(tp[r] >= 0 && tp[r] < c,
              "cross_entropy: target " << tp[r] << " at row " << r << " is out of range for " << c
                                       << " classes (logits " << shape_str(logits.shape()) << ")");
  }
  std::vector<double> lse(static_cast<size_t>(rows)), loss(static_cast<size_t>(rows));
  DDP_NN_DISPATCH(x.dtype(), "cross_entropy",
                  cross_entropy_forward(x.data_ptr<scalar_t>(), tp, rows, c, label_smoothing,
                                        lse.data(), loss.data()));
  Tensor out;
  if (reduction == Reduction::None) {
    out = ops::from_vector(loss, {rows}, x.options());
  } else {
    double total = 0;
    for (double v : loss) total += v;
    if (reduction == Reduction::Mean) total /= static_cast<double>(rows);
    out = ops::scalar_tensor(total, x.options());
  }
  if (!autograd::needs_grad({logits})) return out;
  Tensor lse_t = ops::from_vector(lse, {rows}, kFloat64);
  const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(rows) : 1.0;
  const bool scalar_grad = reduction != Reduction::None;
  return autograd::record(
      "CrossEntropyBackward", out, {logits}, {x, t, lse_t},
      [rows, c, scale, scalar_grad, label_smoothing](const Tensor& grad, const autograd::Saved& s,
                                                     const autograd::Needs&) {
        Tensor g = ops::contiguous(grad);
        Tensor dx = ops::empty(s[0].shape(), s[0].options());
        DDP_NN_DISPATCH(
            s[0].dtype(), "cross_entropy backward",
            cross_entropy_backward(s[0].data_ptr<scalar_t>(), s[1].data_ptr<int64_t>(),
                                   s[2].data_ptr<double>(), g.data_ptr<scalar_t>(), scalar_grad,
                                   scale, rows, c, label_smoothing, dx.data_ptr<scalar_t>()));
        return autograd::Grads{dx};
      });
}

double accuracy(const Tensor& logits, const Tensor& target) {
  DDP_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
            "accuracy: expected logits [N, C] and target [N], got "
                << shape_str(logits.shape()) << " and " << shape_str(target.shape()));
  if (logits.size(0) == 0) return 0.0;
  std::vector<int64_t> pred = ops::argmax(logits, 1).to_vector<int64_t>();
  std::vector<int64_t> t = target.to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == t[i] ? 1 : 0;
  return static_cast<double>(correct) / static_cast<double>(pred.size());
}

}  // namespace ddplab::nn::functional
