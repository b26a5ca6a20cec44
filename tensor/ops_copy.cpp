// Copies: within a device (strided, converting dtype) and across devices.
#include "tensor/backend.h"
#include "tensor/ops.h"

namespace ddplab::ops {

void copy_(const Tensor& dst, const Tensor& src, bool non_blocking) {
  if (dst.device() == src.device()) {
    Tensor s = src.shape() == dst.shape() ? src : expand(src, dst.shape());
    backend_for(dst.device()).copy(dst, s);
    return;
  }
  // Across devices: convert dtype and broadcast on the source side, move contiguous bytes, then
  // lay them out on the destination side if it is strided.
  Tensor s = src.shape() == dst.shape() ? src : expand(src, dst.shape());
  if (s.dtype() != dst.dtype() || !s.is_contiguous()) {
    Tensor tmp = empty(dst.shape(), {dst.dtype(), s.device()});
    backend_for(s.device()).copy(tmp, s);
    s = tmp;
  }
  Device dev = dst.device().is_cuda() ? dst.device() : s.device();
  if (dst.is_contiguous()) {
    backend_for(dev).copy_across_devices(dst, s, non_blocking);
  } else {
    Tensor tmp = empty(dst.shape(), dst.options());
    backend_for(dev).copy_across_devices(tmp, s, non_blocking);
    backend_for(dst.device()).copy(dst, tmp);
  }
}

Tensor contiguous(const Tensor& t) {
  return contiguous(t, MemoryFormat::Contiguous);
}

Tensor contiguous(const Tensor& t, MemoryFormat format) {
  if (is_contiguous(t, format)) return t;
  Tensor out = empty(t.shape(), t.options(), format);
  copy_(out, t);
  return out;
}

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.shape(), t.options());
  copy_(out, t);
  return out;
}

Tensor to(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), {dtype, t.device()});
  copy_(out, t);
  return out;
}

Tensor to(const Tensor& t, Device device, bool non_blocking) {
  if (t.device() == device) return t;
  Tensor out = empty(t.shape(), {t.dtype(), device});
  copy_(out, t, non_blocking);
  return out;
}

Tensor pin_memory(const Tensor& t) {
  DDP_CHECK(t.device().is_cpu(), "pin_memory: tensor is on " << t.device() << ", expected cpu");
  size_t nbytes = t.nbytes();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage(allocate_pinned(nbytes), nbytes, kCPU);
  impl->shape = t.shape();
  impl->strides = contiguous_strides(t.shape());
  impl->dtype = t.dtype();
  Tensor out(std::move(impl));
  copy_(out, t);
  return out;
}

void fill_(const Tensor& t, double value) {
  backend_for(t.device()).fill(t, value);
}
void zero_(const Tensor& t) {
  fill_(t, 0);
}

}  // namespace ddplab::ops
