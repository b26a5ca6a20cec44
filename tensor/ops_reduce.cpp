// Reductions. The reduced dims are permuted to the end and made contiguous, so every backend
// only ever reduces the rows of a [rows, cols] matrix.
#include <algorithm>
#include <cmath>

#include "tensor/backend.h"
#include "tensor/ops.h"

namespace ddplab::ops {

namespace {

struct ReducePlan {
  std::vector<int64_t> reduced;  // sorted, unique
  Shape kept_shape;              // output shape without keepdim
  Shape keepdim_shape;           // output shape with keepdim
  int64_t rows = 1, cols = 1;
  Tensor matrix;  // the input as contiguous [rows, cols]
};

ReducePlan plan_reduction(const Tensor& t, const std::vector<int64_t>& dims, const char* what) {
  ReducePlan p;
  std::vector<bool> is_reduced(static_cast<size_t>(t.dim()), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, t.dim(), what);
    DDP_CHECK(!is_reduced[w], what << ": dim " << w << " appears twice in " << shape_str(dims));
    is_reduced[w] = true;
  }
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (is_reduced[d]) {
      p.keepdim_shape.push_back(1);
      p.cols *= t.shape()[d];
    } else {
      perm.push_back(d);
      p.kept_shape.push_back(t.shape()[d]);
      p.keepdim_shape.push_back(t.shape()[d]);
      p.rows *= t.shape()[d];
    }
  }
  for (int64_t d = 0; d < t.dim(); ++d)
    if (is_reduced[d]) {
      perm.push_back(d);
      p.reduced.push_back(d);
    }
  p.matrix = contiguous(permute(t, perm));
  return p;
}

Tensor reduce(RowReduceOp op, const Tensor& t, const std::vector<int64_t>& dims, bool keepdim,
              const char* what) {
  ReducePlan p = plan_reduction(t, dims, what);
  DType out_dtype = t.dtype();
  if (op == RowReduceOp::Sum && !is_floating(t.dtype())) out_dtype = kInt64;  // as PyTorch
  if (op != RowReduceOp::Sum)
    DDP_CHECK(p.cols > 0 || p.rows == 0,
              what << ": cannot reduce over an empty dimension of shape " << shape_str(t.shape()));
  Tensor out = empty({p.rows}, {out_dtype, t.device()});
  if (p.rows > 0) backend_for(t.device()).reduce(op, out, p.matrix, p.rows, p.cols);
  return view(out, keepdim ? p.keepdim_shape : p.kept_shape);
}

ValuesIndices arg_reduce(bool is_max, const Tensor& t, int64_t dim, bool keepdim,
                         const char* what) {
  int64_t d = wrap_dim(dim, t.dim(), what);
  ReducePlan p = plan_reduction(t, {d}, what);
  DDP_CHECK(p.cols > 0,
            what << ": cannot reduce over an empty dimension of shape " << shape_str(t.shape()));
  Tensor idx = empty({p.rows}, {kInt64, t.device()});
  backend_for(t.device()).arg_reduce(is_max, idx, p.matrix, p.rows, p.cols);
  // The values are where the indices point: read them instead of reducing a second time.
  Tensor values = gather(view(p.matrix, {p.rows, p.cols}), 1, view(idx, {p.rows, 1}));
  const Shape& shape = keepdim ? p.keepdim_shape : p.kept_shape;
  return {view(values, shape), view(idx, shape)};
}

int64_t reduced_count(const Tensor& t, const std::vector<int64_t>& dims) {
  if (dims.empty()) return t.numel();
  int64_t n = 1;
  for (int64_t d : dims) n *= t.shape()[wrap_dim(d, t.dim(), "reduce")];
  return n;
}

}  // namespace

Tensor sum(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce(RowReduceOp::Sum, t, dims, keepdim, "sum");
}

Tensor mean(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  DDP_CHECK(is_floating(t.dtype()), "mean: expected a floating tensor, got " << t.dtype());
  int64_t n = reduced_count(t, dims);
  Tensor s = sum(t, dims, keepdim);
  mul_(s, n > 0 ? 1.0 / static_cast<double>(n) : NAN);
  return s;
}

Tensor amax(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce(RowReduceOp::Max, t, dims, keepdim, "amax");
}
Tensor amin(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce(RowReduceOp::Min, t, dims, keepdim, "amin");
}

// Two passes (mean, then squared deviations): far more accurate than E[x^2] - E[x]^2.
Tensor var(const Tensor& t, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  DDP_CHECK(is_floating(t.dtype()), "var: expected a floating tensor, got " << t.dtype());
  int64_t n = reduced_count(t, dims);
  Tensor centered = sub(t, mean(t, dims, true));
  Tensor s = sum(square(centered), dims, keepdim);
  double denom = static_cast<double>(n - correction);
  mul_(s, denom > 0 ? 1.0 / denom : NAN);
  return s;
}

Tensor norm(const Tensor& t, double p, const std::vector<int64_t>& dims, bool keepdim) {
  DDP_CHECK(is_floating(t.dtype()), "norm: expected a floating tensor, got " << t.dtype());
  if (p == 2) return sqrt(sum(square(t), dims, keepdim));
  if (p == 1) return sum(abs(t), dims, keepdim);
  if (std::isinf(p)) return p > 0 ? amax(abs(t), dims, keepdim) : amin(abs(t), dims, keepdim);
  return pow(sum(pow(abs(t), p), dims, keepdim), 1.0 / p);
}

ValuesIndices max(const Tensor& t, int64_t dim, bool keepdim) {
  return arg_reduce(true, t, dim, keepdim, "max");
}
ValuesIndices min(const Tensor& t, int64_t dim, bool keepdim) {
  return arg_reduce(false, t, dim, keepdim, "min");
}
Tensor argmax(const Tensor& t, int64_t dim, bool keepdim) {
  return max(t, dim, keepdim).indices;
}
Tensor argmin(const Tensor& t, int64_t dim, bool keepdim) {
  return min(t, dim, keepdim).indices;
}

double sum_all(const Tensor& t) {
  return sum(to(t, kFloat64)).item<double>();
}

bool all_finite(const Tensor& t) {
  if (!is_floating(t.dtype())) return true;
  return sum(isfinite(t)).item<int64_t>() == t.numel();
}

// --- comparisons for tests
// ----------------------------------------------------------------------------
bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  Tensor x = to(to(a, kCPU), kFloat64), y = to(to(b, kCPU), kFloat64);
  Tensor bound = add(mul(abs(y), rtol), atol);
  return sum(gt(abs(sub(x, y)), bound)).item<int64_t>() == 0 &&
         sum(ne(isfinite(x), isfinite(y))).item<int64_t>() == 0;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  DDP_CHECK(a.shape() == b.shape(), "max_abs_diff: shapes " << shape_str(a.shape()) << " and "
                                                            << shape_str(b.shape()) << " differ");
  if (a.numel() == 0) return 0;
  Tensor x = to(to(a, kCPU), kFloat64), y = to(to(b, kCPU), kFloat64);
  return amax(abs(sub(x, y))).item<double>();
}

double max_rel_error(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0) return 0;
  double scale = amax(abs(to(to(b, kCPU), kFloat64))).item<double>();
  return max_abs_diff(a, b) / std::max(scale, 1e-30);
}

}  // namespace ddplab::ops
