// log_softmax, cross_entropy (fused log-softmax + NLL with label smoothing) and accuracy.
//
// Both softmax kernels subtract the row maximum before exponentiating (so exp never overflows)
// and sum in double. cross_entropy never materializes log-probabilities: per row it keeps only
// logsumexp, and the backward rebuilds softmax from the saved logits, which is cheaper in memory
// than saving an [N, C] matrix of probabilities.
#include <cmath>
#include <vector>

#include "autograd/function_node.h"
#include "autograd/functions.h"
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

#if defined(DDP_CUDA)
// The CUDA paths: the same maths composed from ops:: calls, which all run on CUDA (no kernels of
// their own). Sums accumulate in the reduction kernels' precision rather than in double.

void check_cuda_dtype(const Tensor& x, const char* what) {
  DDP_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64,
            what << ": supports float32 and float64 on CUDA, got " << dtype_name(x.dtype()));
}

// logsumexp over `dim`, kept as a size-1 dim: max + log(sum(exp(x - max))).
Tensor logsumexp_keepdim(const Tensor& x, int64_t dim) {
  Tensor mx = ops::amax(x, {dim}, true);
  return ops::add(ops::log(ops::sum(ops::exp(ops::sub(x, mx)), {dim}, true)), mx);
}

Tensor log_softmax_cuda(const Tensor& x_in, int64_t dim) {
  check_cuda_dtype(x_in, "log_softmax");
  Tensor y = ops::sub(x_in, logsumexp_keepdim(x_in, dim));
  if (!autograd::needs_grad({x_in})) return y;
  return autograd::record(
      "LogSoftmaxBackward", y, {x_in}, {y},
      [dim](const Tensor& grad, const autograd::Saved& s, const autograd::Needs&) {
        // dx = dy - softmax * sum(dy), with softmax = exp(y).
        Tensor dx = ops::sub(grad, ops::mul(ops::exp(s[0]), ops::sum(grad, {dim}, true)));
        return autograd::Grads{dx};
      });
}

Tensor cross_entropy_cuda(const Tensor& logits, const Tensor& target, Reduction reduction,
                          double eps) {
  check_cuda_dtype(logits, "cross_entropy");
  DDP_CHECK(target.device() == logits.device(), "cross_entropy: target is on "
                                                    << target.device() << " but the logits on "
                                                    << logits.device());
  const int64_t rows = logits.size(0), c = logits.size(1);
  Tensor t = ops::reshape(target, {rows, 1});
  if (rows > 0) {
    // One small device-to-host copy (it waits for the stream) to reject bad class indices.
    std::vector<int64_t> range =
        ops::to(ops::stack({ops::amin(target), ops::amax(target)}), kCPU).to_vector<int64_t>();
    DDP_CHECK(range[0] >= 0 && range[1] < c,
              "cross_entropy: targets range over ["
                  << range[0] << ", " << range[1] << "], out of range for " << c
                  << " classes (logits " << shape_str(logits.shape()) << ")");
  }
  // loss_r = (1 - eps) * (lse_r - x[r, t_r]) + eps * (lse_r - mean_c x[r, c]).
  Tensor lse = logsumexp_keepdim(logits, 1);  // [N, 1]
  Tensor loss = ops::mul(ops::sub(lse, ops::gather(logits, 1, t)), 1 - eps);
  if (eps > 0) loss = ops::add(loss, ops::mul(ops::sub(lse, ops::mean(logits, {1}, true)), eps));
  loss = ops::reshape(loss, {rows});
  Tensor out = reduction == Reduction::None  ? loss
               : reduction == Reduction::Sum ? ops::sum(loss)
                                             : ops::mean(loss);
  if (!autograd::needs_grad({logits})) return out;
  const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(rows) : 1.0;
  const bool scalar_grad = reduction != Reduction::None;
  return autograd::record(
      "CrossEntropyBackward", out, {logits}, {logits, t, lse},
      [rows, c, scale, scalar_grad, eps](const Tensor& grad, const autograd::Saved& s,
                                         const autograd::Needs&) {
        const Tensor& x = s[0];
        // d loss_r / d x[r, k] = softmax_k - (1 - eps) * [k == t_r] - eps / C, times the row's
        // weight; the one-hot matrix compares a row of class indices with the column of targets.
        Tensor d = ops::exp(ops::sub(x, s[2]));
        Tensor classes = ops::reshape(
            ops::arange(0, static_cast<double>(c), 1, TensorOptions(kInt64, x.device())), {1, c});
        ops::sub_(d, ops::to(ops::eq(classes, s[1]), x.dtype()), 1 - eps);
        if (eps > 0) ops::add_(d, -eps / static_cast<double>(c));
        ops::mul_(d, ops::reshape(grad, {scalar_grad ? 1 : rows, 1}));
        if (scale != 1.0) ops::mul_(d, scale);
        return autograd::Grads{d};
      });
}
#endif  // DDP_CUDA

}  // namespace

Tensor log_softmax(const Tensor& x_in, int64_t dim) {
  DDP_CHECK(x_in.defined() && x_in.dim() >= 1,
            "log_softmax: expected a tensor with at least 1 dim");
#if !defined(DDP_CUDA)
  DDP_CHECK(!x_in.is_cuda(), "log_softmax: not implemented on CUDA yet; run it on the CPU");
#endif
  dim = wrap_dim(dim, x_in.dim(), "log_softmax");
#if defined(DDP_CUDA)
  if (x_in.is_cuda()) return log_softmax_cuda(x_in, dim);
#endif
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
#if !defined(DDP_CUDA)
  DDP_CHECK(!logits.is_cuda(), "cross_entropy: not implemented on CUDA yet; run it on the CPU");
#endif
  DDP_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
            "cross_entropy: label_smoothing must be in [0, 1], got " << label_smoothing);
#if defined(DDP_CUDA)
  if (logits.is_cuda()) return cross_entropy_cuda(logits, target, reduction, label_smoothing);
#endif
  // bfloat16 logits (autocast's activations) are widened first: the loss runs in float32, as in
  // PyTorch's autocast, because exp and log amplify rounding (Note [Autocast]).
  if (logits.dtype() == kBFloat16) {
    return cross_entropy(ddplab::to(logits, kFloat32), target, reduction, label_smoothing);
  }
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
