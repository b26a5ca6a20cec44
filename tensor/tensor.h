// Tensor: a strided view of a Storage.
//
// A tensor is (storage, offset, shape, strides, dtype). Views (reshape, permute, narrow, expand,
// ...) make a new TensorImpl over the same Storage with other shape/strides, so writing through a
// view writes the original. Element (i0, i1, ...) lives at storage[offset + sum_k i_k * stride_k].
//
// `Tensor` is a cheap handle (a shared pointer): copying it never copies data. The raw array ops
// live in tensor/ops.h (namespace ddplab::ops); the differentiable ones that record the autograd
// graph live in autograd/ (namespace ddplab).
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace ddplab {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"

struct TensorOptions {
  DType dtype = kFloat32;
  Device device = kCPU;
  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}        // NOLINT(google-explicit-constructor)
  TensorOptions(Device d) : device(d) {}      // NOLINT(google-explicit-constructor)
  TensorOptions(DeviceType d) : device(d) {}  // NOLINT(google-explicit-constructor)
  TensorOptions(DType t, Device d) : dtype(t), device(d) {}
  TensorOptions with_dtype(DType t) const { return {t, device}; }
  TensorOptions with_device(Device d) const { return {dtype, d}; }
};

class Tensor;
namespace autograd {
class Node;
struct AutogradMeta;  // defined in autograd/: requires_grad, grad, grad_fn, hooks
}  // namespace autograd

struct TensorImpl {
  Storage storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;  // in elements
  DType dtype = kFloat32;
  std::shared_ptr<autograd::AutogradMeta> autograd_meta;  // null for tensors outside autograd
};

// The operators on tensors (a + b, a * 2.0, -a) and the other differentiable ops (matmul, relu,
// sum, ...) are free functions in namespace ddplab, declared in autograd/functions.h; the raw
// ops without autograd are in tensor/ops.h (namespace ddplab::ops).
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t numel() const;
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage.device(); }
  bool is_cuda() const { return device().is_cuda(); }
  TensorOptions options() const { return {dtype(), device()}; }
  int64_t storage_offset() const { return impl().offset; }
  const Storage& storage() const { return impl().storage; }
  size_t offset_bytes() const { return static_cast<size_t>(impl().offset) * element_size(dtype()); }
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(dtype()); }

  // Pointer to element 0 (storage + offset). The typed form checks the dtype.
  void* raw_data() const;
  template <class T>
  T* data_ptr() const {
    DDP_CHECK(dtype_of<T>::value == dtype(), "data_ptr: tensor has dtype "
                                                 << dtype_name(dtype()) << ", asked for "
                                                 << dtype_name(dtype_of<T>::value));
    return static_cast<T*>(raw_data());
  }
  // The value of a one-element tensor, converted to T (copied from the GPU if needed).
  template <class T>
  T item() const;
  // All elements in row-major order, converted to T (for tests and printing).
  template <class T>
  std::vector<T> to_vector() const;

  TensorImpl& impl() const {
    DDP_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  std::string str() const;  // PyTorch-like repr with shape, dtype and device

  // --- autograd (implemented in autograd/) -------------------------------------------------
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad = true);
  Tensor grad() const;  // undefined until a backward pass reaches this leaf
  void set_grad(const Tensor& g) const;
  std::shared_ptr<autograd::Node> grad_fn() const;
  bool is_leaf() const;   // no grad_fn: a parameter or a constant
  Tensor detach() const;  // same storage, outside the graph
  // A copy with its own storage, recorded in the graph like any op (gradients flow back to this
  // tensor), as torch.Tensor.clone. ops::clone is the raw copy without autograd.
  Tensor clone() const;
  void backward(const Tensor& grad_output = Tensor(), bool retain_graph = false) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Contiguous row-major strides for a shape.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); names the tensor shape in the error.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what);

}  // namespace ddplab
