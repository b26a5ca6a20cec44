// cuDNN handles, descriptors and workspace for the CUDA paths of nn/functional (nn/cudnn.h).
#include "nn/cudnn.h"

#include <cudnn.h>

#include <climits>
#include <unordered_map>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"

namespace ddplab::nn::cudnn {

namespace {

int to_int(int64_t v, const char* what) {
  DDP_CHECK(v >= 0 && v <= INT_MAX,
            "cuDNN: " << what << " = " << v << " exceeds cuDNN's int range");
  return static_cast<int>(v);
}

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return CUDNN_DATA_FLOAT;
    case DType::Float64:
      return CUDNN_DATA_DOUBLE;
    case DType::Float16:  // autocast's convolutions (Note [Autocast] in nn/autocast.h)
      return CUDNN_DATA_HALF;
    case DType::BFloat16:
      return CUDNN_DATA_BFLOAT16;
    default:
      DDP_FAIL("cuDNN: supports float32, float64, float16 and bfloat16 here, got "
               << dtype_name(dtype));
  }
}

}  // namespace

cudnnHandle_t handle(int device) {
  // One handle per (thread, device): a cuDNN handle must not be used by two threads at once.
  // Never destroyed: destroying at thread or process exit can run after the CUDA context is gone.
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  cudnnHandle_t& h = handles[device];
  if (h == nullptr) {
    gpu::DeviceGuard g(device);
    DDP_CUDNN_CHECK(cudnnCreate(&h));
  }
  // Re-bound before every use, so cuDNN's work orders with the caller's other work.
  DDP_CUDNN_CHECK(cudnnSetStream(h, gpu::current_stream(device).handle()));
  return h;
}

Tensor workspace(size_t bytes, Device device) {
  if (bytes == 0) return Tensor();
  return ops::empty({static_cast<int64_t>(bytes)}, TensorOptions(kUInt8, device));
}

void check_dtype(const Tensor& t, const char* what) {
  DDP_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64,
            what << ": supports float32 and float64 on CUDA, got " << dtype_name(t.dtype()));
}

// Each constructor converts and checks its arguments before creating the descriptor, and destroys
// it again if a set call fails: a constructor that throws never runs its destructor.
TensorDesc::TensorDesc(DType dtype, int64_t n, int64_t c, int64_t h, int64_t w) {
  const cudnnDataType_t t = data_type(dtype);
  const int dims[4] = {to_int(n, "N"), to_int(c, "C"), to_int(h, "H"), to_int(w, "W")};
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_));
  const cudnnStatus_t st =
      cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, t, dims[0], dims[1], dims[2], dims[3]);
  if (st != CUDNN_STATUS_SUCCESS) cudnnDestroyTensorDescriptor(desc_);
  DDP_CUDNN_CHECK(st);
}
TensorDesc::~TensorDesc() {
  if (desc_ != nullptr) cudnnDestroyTensorDescriptor(desc_);
}

FilterDesc::FilterDesc(DType dtype, int64_t o, int64_t c, int64_t kh, int64_t kw) {
  const cudnnDataType_t t = data_type(dtype);
  const int dims[4] = {to_int(o, "out_channels"), to_int(c, "in_channels"),
                       to_int(kh, "kernel height"), to_int(kw, "kernel width")};
  DDP_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_));
  const cudnnStatus_t st =
      cudnnSetFilter4dDescriptor(desc_, t, CUDNN_TENSOR_NCHW, dims[0], dims[1], dims[2], dims[3]);
  if (st != CUDNN_STATUS_SUCCESS) cudnnDestroyFilterDescriptor(desc_);
  DDP_CUDNN_CHECK(st);
}
FilterDesc::~FilterDesc() {
  if (desc_ != nullptr) cudnnDestroyFilterDescriptor(desc_);
}

ConvDesc::ConvDesc(const onednn::Conv2dParams& p, DType dtype) {
  // float32 and float64 accumulate in their own type (as the CPU's GEMMs); 16-bit operands
  // accumulate in float32, as under autocast on the CPU.
  const bool sixteen = dtype == kFloat16 || dtype == kBFloat16;
  const cudnnDataType_t t = sixteen ? CUDNN_DATA_FLOAT : data_type(dtype);
  const int a[7] = {to_int(p.pad_h, "padding"),   to_int(p.pad_w, "padding"),
                    to_int(p.stride_h, "stride"), to_int(p.stride_w, "stride"),
                    to_int(p.dil_h, "dilation"),  to_int(p.dil_w, "dilation"),
                    to_int(p.groups, "groups")};
  DDP_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_));
  cudnnStatus_t st = cudnnSetConvolution2dDescriptor(desc_, a[0], a[1], a[2], a[3], a[4], a[5],
                                                     CUDNN_CROSS_CORRELATION, t);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetConvolutionGroupCount(desc_, a[6]);
  // float32: FMA kernels only: CUDNN_DEFAULT_MATH would allow TF32 tensor cores on Ampere and
  // later, whose 10-bit mantissa breaks agreement with the CPU's float32 results. 16-bit
  // operands: the tensor cores are the point of autocast, and they round nothing further.
  if (st == CUDNN_STATUS_SUCCESS) {
    st = cudnnSetConvolutionMathType(desc_, sixteen ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH);
  }
  if (st != CUDNN_STATUS_SUCCESS) cudnnDestroyConvolutionDescriptor(desc_);
  DDP_CUDNN_CHECK(st);
}
ConvDesc::~ConvDesc() {
  if (desc_ != nullptr) cudnnDestroyConvolutionDescriptor(desc_);
}

PoolDesc::PoolDesc(PoolMode mode, functional::Pair kernel, functional::Pair stride,
                   functional::Pair padding) {
  // Max: deterministic backward, NaN propagates (as the CPU kernel). Average: the divisor counts
  // padded positions (count_include_pad=True, PyTorch's default).
  const cudnnPoolingMode_t m = mode == PoolMode::Max ? CUDNN_POOLING_MAX_DETERMINISTIC
                                                     : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
  const int a[6] = {to_int(kernel[0], "kernel"),   to_int(kernel[1], "kernel"),
                    to_int(padding[0], "padding"), to_int(padding[1], "padding"),
                    to_int(stride[0], "stride"),   to_int(stride[1], "stride")};
  DDP_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&desc_));
  const cudnnStatus_t st = cudnnSetPooling2dDescriptor(desc_, m, CUDNN_PROPAGATE_NAN, a[0], a[1],
                                                       a[2], a[3], a[4], a[5]);
  if (st != CUDNN_STATUS_SUCCESS) cudnnDestroyPoolingDescriptor(desc_);
  DDP_CUDNN_CHECK(st);
}
PoolDesc::~PoolDesc() {
  if (desc_ != nullptr) cudnnDestroyPoolingDescriptor(desc_);
}

}  // namespace ddplab::nn::cudnn
