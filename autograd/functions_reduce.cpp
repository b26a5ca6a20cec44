// Differentiable reductions: sum, mean, var, amax/amin, max/min along a dim.
//
// Every reduction's backward first puts the output gradient back into the input's shape:
// reinsert the reduced dims as size 1 (when keepdim was false) and broadcast (expand, a stride-0
// view, no copy). The per-op part is what to multiply that by.
#include <algorithm>

#include "autograd/function_node.h"
#include "autograd/functions.h"

namespace ddplab {

using autograd::Grads;
using autograd::Needs;
using autograd::record;
using autograd::Saved;

namespace {

// The reduced dims, wrapped and sorted; empty `dims` means every dim.
std::vector<int64_t> reduced_dims(const Shape& in, const std::vector<int64_t>& dims,
                                  const char* what) {
  std::vector<int64_t> r;
  if (dims.empty()) {
    for (size_t i = 0; i < in.size(); ++i) r.push_back(static_cast<int64_t>(i));
  } else {
    for (int64_t d : dims) r.push_back(wrap_dim(d, static_cast<int64_t>(in.size()), what));
  }
  std::sort(r.begin(), r.end());
  return r;
}

// The input shape with the reduced dims set to 1: what the output looks like with keepdim.
Shape keepdim_shape(const Shape& in, const std::vector<int64_t>& rdims) {
  Shape s = in;
  for (int64_t d : rdims) s[d] = 1;
  return s;
}

// The output gradient viewed in keepdim shape (no data copy when contiguous).
Tensor as_keepdim(const Tensor& g, const Shape& keep) {
  return ops::reshape(g, keep);
}

int64_t reduced_count(const Shape& in, const std::vector<int64_t>& rdims) {
  int64_t n = 1;
  for (int64_t d : rdims) n *= in[d];
  return n;
}

}  // namespace

Tensor sum(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  const Shape& in = t.shape();
  Shape keep = keepdim_shape(in, reduced_dims(in, dims, "sum"));
  return record("SumBackward", ops::sum(t, dims, keepdim), {t}, {},
                [=](const Tensor& g, const Saved&, const Needs&) {
                  return Grads{ops::expand(as_keepdim(g, keep), in)};
                });
}

Tensor mean(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  const Shape& in = t.shape();
  auto rdims = reduced_dims(in, dims, "mean");
  Shape keep = keepdim_shape(in, rdims);
  double n = static_cast<double>(reduced_count(in, rdims));
  return record("MeanBackward", ops::mean(t, dims, keepdim), {t}, {},
                [=](const Tensor& g, const Saved&, const Needs&) {
                  return Grads{ops::expand(ops::div(as_keepdim(g, keep), n), in)};
                });
}

Tensor var(const Tensor& t, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  const Shape& in = t.shape();
  auto rdims = reduced_dims(in, dims, "var");
  Shape keep = keepdim_shape(in, rdims);
  double denom = static_cast<double>(reduced_count(in, rdims) - correction);
  const std::vector<int64_t>& rd = rdims;
  // d var / dx_i = 2 (x_i - mean) / (N - correction)
  return record("VarBackward", ops::var(t, dims, correction, keepdim), {t}, {t},
                [=](const Tensor& g, const Saved& s, const Needs&) {
                  Tensor centered = ops::sub(s[0], ops::mean(s[0], rd, /*keepdim=*/true));
                  Tensor scale = ops::mul(as_keepdim(g, keep), 2.0 / denom);
                  return Grads{ops::mul(centered, scale)};
                });
}

namespace {

// amax/amin: the gradient is shared evenly by the elements equal to the extreme value.
Tensor extreme(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim, bool is_max) {
  const Shape& in = t.shape();
  auto rdims = reduced_dims(in, dims, is_max ? "amax" : "amin");
  Shape keep = keepdim_shape(in, rdims);
  Tensor out = is_max ? ops::amax(t, dims, keepdim) : ops::amin(t, dims, keepdim);
  return record(is_max ? "AmaxBackward" : "AminBackward", out, {t}, {t, out},
                [=](const Tensor& g, const Saved& s, const Needs&) {
                  Tensor mask = ops::to(ops::eq(s[0], as_keepdim(s[1], keep)), g.dtype());
                  Tensor count = ops::sum(mask, rdims, /*keepdim=*/true);
                  return Grads{ops::mul(mask, ops::div(as_keepdim(g, keep), count))};
                });
}

// max/min along one dim: the gradient goes to the returned index (scatter-add into zeros).
ops::ValuesIndices extreme_dim(const Tensor& t, int64_t dim, bool keepdim, bool is_max) {
  ops::ValuesIndices vi = is_max ? ops::max(t, dim, keepdim) : ops::min(t, dim, keepdim);
  const Shape& in = t.shape();
  int64_t d = wrap_dim(dim, t.dim(), is_max ? "max" : "min");
  Shape keep = keepdim_shape(in, {d});
  vi.values = record(is_max ? "MaxBackward" : "MinBackward", vi.values, {t}, {vi.indices},
                     [=](const Tensor& g, const Saved& s, const Needs&) {
                       Tensor gi = ops::zeros(in, g.options());
                       ops::scatter_add_(gi, d, ops::reshape(s[0], keep),
                                         ops::contiguous(as_keepdim(g, keep)));
                       return Grads{gi};
                     });
  return vi;
}

}  // namespace

Tensor amax(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(t, dims, keepdim, true);
}
Tensor amin(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(t, dims, keepdim, false);
}
ops::ValuesIndices max(const Tensor& t, int64_t dim, bool keepdim) {
  return extreme_dim(t, dim, keepdim, true);
}
ops::ValuesIndices min(const Tensor& t, int64_t dim, bool keepdim) {
  return extreme_dim(t, dim, keepdim, false);
}

}  // namespace ddplab
