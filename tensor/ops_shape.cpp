// Views (new shape and strides over the same storage) and the ops that assemble tensors.
#include <algorithm>
#include <optional>

#include "tensor/backend.h"
#include "tensor/ops.h"

namespace ddplab::ops {

namespace {

Tensor make_view(const Tensor& t, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

// Resolves one -1 in `shape` so that it holds `numel` elements.
Shape infer_shape(const Shape& shape, int64_t numel, const Shape& from) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      DDP_CHECK(infer < 0, "view: only one dimension can be -1, got " << shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      DDP_CHECK(out[i] >= 0, "view: invalid size in " << shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    DDP_CHECK(known != 0 && numel % known == 0, "view: shape " << shape_str(shape)
                                                               << " is invalid for input of shape "
                                                               << shape_str(from));
    out[infer] = numel / known;
  }
  DDP_CHECK(shape_numel(out) == numel, "view: shape "
                                           << shape_str(shape) << " is invalid for input of shape "
                                           << shape_str(from) << " (" << numel << " elements)");
  return out;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible. Memory is split
// into chunks of dims that are laid out back to back; each chunk must map onto whole new dims.
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides,
                                  const Shape& new_shape) {
  Shape out(new_shape.size());
  if (shape.empty()) return Shape(new_shape.size(), 1);
  if (shape_numel(shape) == 0) return contiguous_strides(new_shape);
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_stride = strides.back();
  int64_t chunk_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    chunk_numel *= shape[d];
    bool chunk_ends = d == 0 || (shape[d - 1] != 1 && strides[d - 1] != chunk_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < chunk_numel || new_shape[view_d] == 1)) {
      out[view_d] = view_numel * chunk_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != chunk_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = strides[d - 1];
      chunk_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  DDP_CHECK(shape.size() == strides.size(), "as_strided: shape "
                                                << shape_str(shape) << " and strides "
                                                << shape_str(strides) << " differ in length");
  return make_view(t, shape, strides, offset);
}

Tensor view(const Tensor& t, const Shape& shape) {
  Shape s = infer_shape(shape, t.numel(), t.shape());
  auto st = view_strides(t.shape(), t.strides(), s);
  DDP_CHECK(st.has_value(), "view: cannot view a tensor of shape "
                                << shape_str(t.shape()) << " and strides " << shape_str(t.strides())
                                << " as " << shape_str(s) << "; use reshape");
  return make_view(t, s, *st, t.storage_offset());
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  Shape s = infer_shape(shape, t.numel(), t.shape());
  if (auto st = view_strides(t.shape(), t.strides(), s))
    return make_view(t, s, *st, t.storage_offset());
  return view(clone(t), s);
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  if (t.dim() == 0) return reshape(t, {1});
  int64_t s = wrap_dim(start_dim, t.dim(), "flatten"), e = wrap_dim(end_dim, t.dim(), "flatten");
  DDP_CHECK(s <= e, "flatten: start_dim " << start_dim << " is after end_dim " << end_dim);
  Shape shape(t.shape().begin(), t.shape().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= t.shape()[d];
  shape.push_back(n);
  shape.insert(shape.end(), t.shape().begin() + e + 1, t.shape().end());
  return reshape(t, shape);
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  DDP_CHECK(
      static_cast<int64_t>(dims.size()) == t.dim(),
      "permute: " << dims.size() << " dims given for a tensor of shape " << shape_str(t.shape()));
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], t.dim(), "permute");
    DDP_CHECK(!seen[d], "permute: dim " << d << " repeated in " << shape_str(dims));
    seen[d] = true;
    shape[i] = t.shape()[d];
    strides[i] = t.strides()[d];
  }
  return make_view(t, shape, strides, t.storage_offset());
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  if (t.dim() == 0) return t;
  std::vector<int64_t> dims(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) dims[i] = i;
  std::swap(dims[wrap_dim(d0, t.dim(), "transpose")], dims[wrap_dim(d1, t.dim(), "transpose")]);
  return permute(t, dims);
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  int64_t d = wrap_dim(dim, t.dim(), "slice");
  DDP_CHECK(step > 0, "slice: step must be positive, got " << step);
  int64_t n = t.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = t.shape(), strides = t.strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  return make_view(t, shape, strides, t.storage_offset() + start * t.strides()[d]);
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  int64_t d = wrap_dim(dim, t.dim(), "narrow");
  int64_t n = t.shape()[d];
  if (start < 0) start += n;
  DDP_CHECK(start >= 0 && length >= 0 && start + length <= n,
            "narrow: [" << start << ", " << start + length << ") is out of range for dim " << d
                        << " of shape " << shape_str(t.shape()));
  Shape shape = t.shape();
  shape[d] = length;
  return make_view(t, shape, t.strides(), t.storage_offset() + start * t.strides()[d]);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  int64_t d = wrap_dim(dim, t.dim(), "select");
  int64_t n = t.shape()[d];
  DDP_CHECK(index >= -n && index < n, "select: index " << index << " out of range for dim " << d
                                                       << " of shape " << shape_str(t.shape()));
  if (index < 0) index += n;
  Shape shape = t.shape(), strides = t.strides();
  int64_t offset = t.storage_offset() + index * strides[d];
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(t, shape, strides, offset);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  DDP_CHECK(static_cast<int64_t>(shape.size()) >= t.dim(),
            "expand: cannot expand shape " << shape_str(t.shape()) << " to " << shape_str(shape));
  Shape out_shape(shape.size()), out_strides(shape.size());
  int64_t lead = static_cast<int64_t>(shape.size()) - t.dim();
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    int64_t j = i - lead;
    int64_t target = shape[i];
    if (j < 0) {
      DDP_CHECK(target >= 0, "expand: -1 not allowed for new leading dim in " << shape_str(shape));
      out_shape[i] = target;
      out_strides[i] = 0;
      continue;
    }
    int64_t size = t.shape()[j];
    if (target == -1) target = size;
    if (size == target) {
      out_shape[i] = size;
      out_strides[i] = t.strides()[j];
    } else {
      DDP_CHECK(size == 1, "expand: the size of dim " << j << " (" << size << ") of shape "
                                                      << shape_str(t.shape()) << " must match "
                                                      << shape_str(shape) << " or be 1");
      out_shape[i] = target;
      out_strides[i] = 0;
    }
  }
  return make_view(t, out_shape, out_strides, t.storage_offset());
}

Tensor squeeze(const Tensor& t, std::optional<int64_t> dim) {
  Shape shape, strides;
  std::optional<int64_t> d;
  if (dim) d = wrap_dim(*dim, t.dim(), "squeeze");
  for (int64_t i = 0; i < t.dim(); ++i) {
    bool drop = t.shape()[i] == 1 && (!d || *d == i);
    if (!drop) {
      shape.push_back(t.shape()[i]);
      strides.push_back(t.strides()[i]);
    }
  }
  return make_view(t, shape, strides, t.storage_offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  int64_t d = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape shape = t.shape(), strides = t.strides();
  int64_t stride = d < t.dim() ? shape[d] * strides[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return make_view(t, shape, strides, t.storage_offset());
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  DDP_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  int64_t total = 0;
  DType dtype = first.dtype();
  for (const Tensor& t : tensors) {
    DDP_CHECK(t.dim() == first.dim() && t.device() == first.device(),
              "cat: tensor of shape " << shape_str(t.shape()) << " on " << t.device()
                                      << " does not match shape " << shape_str(first.shape())
                                      << " on " << first.device());
    for (int64_t i = 0; i < t.dim(); ++i)
      DDP_CHECK(i == d || t.shape()[i] == shape[i],
                "cat: shapes " << shape_str(first.shape()) << " and " << shape_str(t.shape())
                               << " differ outside dim " << d);
    total += t.shape()[d];
    dtype = promote_types(dtype, t.dtype());
  }
  shape[d] = total;
  Tensor out = empty(shape, {dtype, first.device()});
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    copy_(narrow(out, d, offset, t.shape()[d]), t);
    offset += t.shape()[d];
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  DDP_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) {
    DDP_CHECK(t.shape() == tensors[0].shape(), "stack: shapes " << shape_str(tensors[0].shape())
                                                                << " and " << shape_str(t.shape())
                                                                << " differ");
    parts.push_back(unsqueeze(t, d));
  }
  return cat(parts, d);
}

// Sizes of [outer, n, inner] around dim d.
static void split_around(const Shape& shape, int64_t d, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
}

Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index) {
  int64_t d = wrap_dim(dim, t.dim(), "index_select");
  DDP_CHECK(index.dtype() == kInt64 && index.dim() <= 1,
            "index_select: index must be a 1-D int64 tensor, got " << index.dtype() << " of shape "
                                                                   << shape_str(index.shape()));
  DDP_CHECK(index.device() == t.device(),
            "index_select: index on " << index.device() << ", input on " << t.device());
  Tensor src = contiguous(t), idx = contiguous(index);
  Shape shape = t.shape();
  shape[d] = idx.numel();
  Tensor out = empty(shape, t.options());
  int64_t outer, inner;
  split_around(t.shape(), d, outer, inner);
  backend_for(t.device()).index_select(out, src, idx, outer, t.shape()[d], inner);
  return out;
}

Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  int64_t d = wrap_dim(dim, t.dim(), "gather");
  DDP_CHECK(index.dtype() == kInt64 && index.dim() == t.dim(),
            "gather: index must be an int64 tensor with " << t.dim() << " dims, got "
                                                          << index.dtype() << " of shape "
                                                          << shape_str(index.shape()));
  for (int64_t i = 0; i < t.dim(); ++i)
    DDP_CHECK(i == d || index.shape()[i] == t.shape()[i],
              "gather: index shape " << shape_str(index.shape()) << " does not match input shape "
                                     << shape_str(t.shape()) << " outside dim " << d);
  Tensor src = contiguous(t), idx = contiguous(index);
  Tensor out = empty(index.shape(), t.options());
  int64_t outer, inner;
  split_around(t.shape(), d, outer, inner);
  backend_for(t.device()).gather(out, src, idx, outer, t.shape()[d], index.shape()[d], inner);
  return out;
}

void scatter_add_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src) {
  int64_t d = wrap_dim(dim, dst.dim(), "scatter_add_");
  DDP_CHECK(index.dtype() == kInt64 && index.shape() == src.shape() && index.dim() == dst.dim(),
            "scatter_add_: index (shape " << shape_str(index.shape())
                                          << ") must be int64 and shaped like src "
                                          << shape_str(src.shape()));
  DDP_CHECK(dst.is_contiguous(), "scatter_add_: destination must be contiguous");
  for (int64_t i = 0; i < dst.dim(); ++i)
    DDP_CHECK(i == d || index.shape()[i] == dst.shape()[i],
              "scatter_add_: index shape " << shape_str(index.shape())
                                           << " does not match destination "
                                           << shape_str(dst.shape()) << " outside dim " << d);
  Tensor s = contiguous(to(src, dst.dtype())), idx = contiguous(index);
  int64_t outer, inner;
  split_around(dst.shape(), d, outer, inner);
  backend_for(dst.device())
      .scatter_add(dst, s, idx, outer, dst.shape()[d], index.shape()[d], inner);
}

}  // namespace ddplab::ops
