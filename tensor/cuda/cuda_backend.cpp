// CudaBackend: the Backend interface (tensor/backend.h) for CUDA devices.
//
// Each method makes the tensor's device current and forwards to the kernels (cuda_kernels.h); the
// kernels queue work on that device's current stream and return without waiting, as PyTorch does.
// Copies to and from the host are here too.
#include "tensor/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_kernels.h"
#include "tensor/cuda/cuda_runtime.h"

namespace ddplab {

namespace {

int device_of(const Tensor& t) {
  DDP_CHECK(t.is_cuda(), "the CUDA backend got a tensor on " << t.device());
  return t.device().index;
}

// A contiguous tensor of `like`'s shape and dtype on `device` (staging for copies).
Tensor empty_on(int device, const Tensor& like) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage(cuda_allocator(device).allocate(like.nbytes()), like.nbytes(),
                          Device(DeviceType::CUDA, device));
  impl->shape = like.shape();
  impl->strides = contiguous_strides(like.shape());
  impl->dtype = like.dtype();
  return Tensor(impl);
}

class CudaBackend final : public Backend {
 public:
  void unary(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) override {
    const int d = device_of(out);
    gpu::DeviceGuard g(d);
    gpu::unary(d, op, out, in, a, b);
  }
  void binary(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y, double alpha,
              double beta) override {
    const int d = device_of(out);
    gpu::DeviceGuard g(d);
    gpu::binary(d, op, out, x, y, alpha, beta);
  }
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override {
    const int d = device_of(out);
    gpu::DeviceGuard g(d);
    gpu::where(d, out, cond, a, b);
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    const int d = device_of(dst);
    DDP_CHECK(src.device() == dst.device(),
              "copy: " << src.device() << " -> " << dst.device() << " needs copy_across_devices");
    gpu::DeviceGuard g(d);
    gpu::copy(d, dst, src);
  }
  void fill(const Tensor& t, double value) override {
    const int d = device_of(t);
    gpu::DeviceGuard g(d);
    gpu::fill(d, t, value);
  }
  void reduce(RowReduceOp op, const Tensor& out, const Tensor& in, int64_t rows,
              int64_t cols) override {
    const int d = device_of(out);
    gpu::DeviceGuard g(d);
    gpu::reduce(d, op, out, in, rows, cols);
  }
  void arg_reduce(bool is_max, const Tensor& out, const Tensor& in, int64_t rows,
                  int64_t cols) override {
    const int d = device_of(out);
    gpu::DeviceGuard g(d);
    gpu::arg_reduce(d, is_max, out, in, rows, cols);
  }
  void gemm(const GemmArgs& args) override {
    // GemmArgs holds raw pointers only: ask the runtime which device owns C.
    cudaPointerAttributes attr{};
    DDP_CUDA_CHECK(cudaPointerGetAttributes(&attr, args.c));
    DDP_CHECK(attr.type == cudaMemoryTypeDevice, "gemm: the output is not CUDA device memory");
    gpu::DeviceGuard g(attr.device);
    gpu::gemm(attr.device, args);
  }
  void random(RandomKind kind, const Tensor& t, double a, double b, uint64_t seed,
              uint64_t offset) override {
    const int d = device_of(t);
    gpu::DeviceGuard g(d);
    gpu::random(d, kind, t, a, b, seed, offset);
  }
  void index_select(const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer,
                    int64_t in_n, int64_t inner) override {
    const int d = device_of(out);
    gpu::DeviceGuard g(d);
    gpu::index_select(d, out, in, index, outer, in_n, inner);
  }
  void gather(const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer, int64_t in_n,
              int64_t idx_n, int64_t inner) override {
    const int d = device_of(out);
    gpu::DeviceGuard g(d);
    gpu::gather(d, out, in, index, outer, in_n, idx_n, inner);
  }
  void scatter_add(const Tensor& dst, const Tensor& src, const Tensor& index, int64_t outer,
                   int64_t dst_n, int64_t idx_n, int64_t inner) override {
    const int d = device_of(dst);
    gpu::DeviceGuard g(d);
    gpu::scatter_add(d, dst, src, index, outer, dst_n, idx_n, inner);
  }

  // Host <-> device and device <-> device. The host side must be contiguous with dst's dtype
  // (the front-end converts on the CPU first); the device side may be strided or of another dtype
  // and is staged through a contiguous device buffer.
  void copy_across_devices(const Tensor& dst, const Tensor& src, bool non_blocking) override {
    DDP_CHECK(dst.shape() == src.shape(), "copy_across_devices: shapes "
                                              << shape_str(dst.shape()) << " and "
                                              << shape_str(src.shape()) << " differ");
    if (dst.numel() == 0) return;
    if (dst.is_cuda() && src.is_cuda()) {
      copy_device_to_device(dst, src);
      return;
    }
    const bool to_device = dst.is_cuda();
    const Tensor& host = to_device ? src : dst;
    const Tensor& dev = to_device ? dst : src;
    DDP_CHECK(host.is_contiguous(), "copy_across_devices: the host tensor must be contiguous");
    const int d = dev.device().index;
    gpu::DeviceGuard g(d);
    const gpu::Stream stream = gpu::current_stream(d);

    // The device side as a contiguous tensor of the host's dtype.
    const bool direct = dev.is_contiguous() && dev.dtype() == host.dtype();
    Tensor staging = direct ? dev : empty_on(d, host);
    if (!to_device && !direct) gpu::copy(d, staging, dev);  // gather/convert on the GPU first

    void* dst_ptr = to_device ? staging.raw_data() : host.raw_data();
    const void* src_ptr = to_device ? host.raw_data() : staging.raw_data();
    const auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    DDP_CUDA_CHECK(cudaMemcpyAsync(dst_ptr, src_ptr, host.nbytes(), kind, stream.handle()));
    if (to_device && !direct) gpu::copy(d, dev, staging);  // scatter/convert on the GPU after

    // Asynchronous only from pinned memory: with pageable memory cudaMemcpyAsync may return before
    // the copy has read the host buffer, which the caller may then reuse or free.
    if (non_blocking && gpu::is_pinned(host.raw_data())) {
      gpu::record_pinned_use(host.raw_data(), stream);
    } else {
      stream.synchronize();
    }
  }

  void synchronize() override {
    for (int d = 0; d < gpu::device_count(); ++d) gpu::synchronize(d);
  }

 private:
  static void copy_device_to_device(const Tensor& dst, const Tensor& src) {
    const int dd = dst.device().index, sd = src.device().index;
    if (dd == sd) {
      gpu::DeviceGuard g(dd);
      gpu::copy(dd, dst, src);
      return;
    }
    // Across GPUs: make src contiguous in dst's dtype on its own device, copy the bytes, then
    // scatter on the destination. The copy runs on dst's current stream after src's stream
    // has produced the data.
    Tensor s = src;
    if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
      gpu::DeviceGuard g(sd);
      s = empty_on(sd, dst);
      gpu::copy(sd, s, src);
    }
    gpu::Event ready;
    ready.record(gpu::current_stream(sd));
    gpu::DeviceGuard g(dd);
    const gpu::Stream stream = gpu::current_stream(dd);
    ready.wait(stream);
    Tensor t = dst.is_contiguous() ? dst : empty_on(dd, dst);
    DDP_CUDA_CHECK(
        cudaMemcpyPeerAsync(t.raw_data(), dd, s.raw_data(), sd, dst.nbytes(), stream.handle()));
    if (!t.is_same(dst)) gpu::copy(dd, dst, t);
    // The staging buffers die here; their blocks return to caches of streams that may not have
    // finished with them, so wait (device-to-device copies between GPUs are rare outside NCCL).
    stream.synchronize();
  }
};

}  // namespace

Backend& cuda_backend(int device) {
  gpu::require_device(device);
  static CudaBackend backend;  // one object serves every device: it has no per-device state
  return backend;
}

}  // namespace ddplab
