// Differentiable shape ops and copies: views (reshape, permute, narrow, expand, ...), cat/stack,
// indexing (index_select, gather), dtype and device moves, detach.
//
// A view's backward puts the gradient back into the input's shape: the inverse view for
// reshape/permute/transpose, a sum for expand, and "zeros with the gradient written into the
// viewed window" for narrow/slice/select.
#include "autograd/function_node.h"
#include "autograd/functions.h"

namespace ddplab {

using autograd::Grads;
using autograd::Needs;
using autograd::record;
using autograd::Saved;
using autograd::sum_to;

namespace {

// For ops whose gradient is the output gradient reshaped back to the input's shape.
Tensor record_reshape_like(const char* name, Tensor out, const Tensor& t) {
  const Shape& in = t.shape();
  return record(name, std::move(out), {t}, {}, [in](const Tensor& g, const Saved&, const Needs&) {
    return Grads{ops::reshape(g, in)};
  });
}

// For window views: zeros of the input's shape with the gradient copied into the same window.
template <class ViewFn>
Tensor record_window(const char* name, Tensor out, const Tensor& t, ViewFn view) {
  const Shape& in = t.shape();
  return record(name, std::move(out), {t}, {},
                [in, view](const Tensor& g, const Saved&, const Needs&) {
                  Tensor gi = ops::zeros(in, g.options());
                  ops::copy_(view(gi), g);
                  return Grads{gi};
                });
}

}  // namespace

Tensor reshape(const Tensor& t, const Shape& shape) {
  return record_reshape_like("ReshapeBackward", ops::reshape(t, shape), t);
}
Tensor view(const Tensor& t, const Shape& shape) {
  return record_reshape_like("ViewBackward", ops::view(t, shape), t);
}
Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  return record_reshape_like("FlattenBackward", ops::flatten(t, start_dim, end_dim), t);
}
Tensor unsqueeze(const Tensor& t, int64_t dim) {
  return record_reshape_like("UnsqueezeBackward", ops::unsqueeze(t, dim), t);
}
Tensor squeeze(const Tensor& t, std::optional<int64_t> dim) {
  return record_reshape_like("SqueezeBackward", ops::squeeze(t, dim), t);
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    inverse[wrap_dim(dims[i], t.dim(), "permute")] = static_cast<int64_t>(i);
  }
  return record("PermuteBackward", ops::permute(t, dims), {t}, {},
                [inverse](const Tensor& g, const Saved&, const Needs&) {
                  return Grads{ops::permute(g, inverse)};
                });
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  return record("TransposeBackward", ops::transpose(t, d0, d1), {t}, {},
                [=](const Tensor& g, const Saved&, const Needs&) {
                  return Grads{ops::transpose(g, d0, d1)};
                });
}

Tensor expand(const Tensor& t, const Shape& shape) {
  const Shape& in = t.shape();
  return record("ExpandBackward", ops::expand(t, shape), {t}, {},
                [in](const Tensor& g, const Saved&, const Needs&) { return Grads{sum_to(g, in)}; });
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  return record_window("NarrowBackward", ops::narrow(t, dim, start, length), t,
                       [=](const Tensor& gi) { return ops::narrow(gi, dim, start, length); });
}
Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  return record_window("SelectBackward", ops::select(t, dim, index), t,
                       [=](const Tensor& gi) { return ops::select(gi, dim, index); });
}
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return record_window("SliceBackward", ops::slice(t, dim, start, end, step), t,
                       [=](const Tensor& gi) { return ops::slice(gi, dim, start, end, step); });
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = ops::cat(tensors, dim);
  const int64_t d = wrap_dim(dim, out.dim(), "cat");
  std::vector<int64_t> sizes;
  sizes.reserve(tensors.size());
  for (const Tensor& t : tensors) sizes.push_back(t.size(d));
  return record("CatBackward", out, tensors, {},
                [=](const Tensor& g, const Saved&, const Needs& n) {
                  Grads r(sizes.size());
                  int64_t offset = 0;
                  for (size_t i = 0; i < sizes.size(); ++i) {
                    if (n[i]) r[i] = ops::narrow(g, d, offset, sizes[i]);
                    offset += sizes[i];
                  }
                  return r;
                });
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = ops::stack(tensors, dim);
  const int64_t d = wrap_dim(dim, out.dim(), "stack");
  const size_t count = tensors.size();
  return record("StackBackward", out, tensors, {},
                [=](const Tensor& g, const Saved&, const Needs& n) {
                  Grads r(count);
                  for (size_t i = 0; i < count; ++i) {
                    if (n[i]) r[i] = ops::select(g, d, static_cast<int64_t>(i));
                  }
                  return r;
                });
}

Tensor contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  return record("ContiguousBackward", ops::contiguous(t), {t}, {},
                [](const Tensor& g, const Saved&, const Needs&) { return Grads{g}; });
}

Tensor clone(const Tensor& t) {
  return record("CloneBackward", ops::clone(t), {t}, {},
                [](const Tensor& g, const Saved&, const Needs&) { return Grads{g}; });
}

Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index) {
  const Shape& in = t.shape();
  const int64_t d = wrap_dim(dim, t.dim(), "index_select");
  return record("IndexSelectBackward", ops::index_select(t, dim, index), {t}, {index},
                [=](const Tensor& g, const Saved& s, const Needs&) {
                  // index_add: scatter_add_ wants an index shaped like the gradient, so the 1-D
                  // index is broadcast along every other dim.
                  Shape ishape(g.dim(), 1);
                  ishape[d] = s[0].numel();
                  Tensor idx = ops::contiguous(ops::expand(ops::reshape(s[0], ishape), g.shape()));
                  Tensor gi = ops::zeros(in, g.options());
                  ops::scatter_add_(gi, d, idx, ops::contiguous(g));
                  return Grads{gi};
                });
}

Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  const Shape& in = t.shape();
  const int64_t d = wrap_dim(dim, t.dim(), "gather");
  return record("GatherBackward", ops::gather(t, dim, index), {t}, {index},
                [=](const Tensor& g, const Saved& s, const Needs&) {
                  Tensor gi = ops::zeros(in, g.options());
                  ops::scatter_add_(gi, d, s[0], ops::contiguous(g));
                  return Grads{gi};
                });
}

Tensor to(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  DType from = t.dtype();
  return record(
      "ToCopyBackward", ops::to(t, dtype), {t}, {},
      [from](const Tensor& g, const Saved&, const Needs&) { return Grads{ops::to(g, from)}; });
}

Tensor to(const Tensor& t, Device device, bool non_blocking) {
  if (t.device() == device) return t;
  Device from = t.device();
  return record(
      "ToDeviceBackward", ops::to(t, device, non_blocking), {t}, {},
      [from](const Tensor& g, const Saved&, const Needs&) { return Grads{ops::to(g, from)}; });
}

Tensor detach(const Tensor& t) {
  return t.detach();
}

}  // namespace ddplab
