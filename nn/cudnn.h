// cuDNN behind the functional layers on CUDA tensors: conv2d, batch_norm and pooling.
//
// Compiled only into CUDA builds (nn/meson.build adds nn/cudnn*.cpp to ddplab_cuda_sources); the
// callers in nn/conv.cpp, nn/batchnorm_kernels.cpp and nn/pooling.cpp include this header under
// `#if defined(DDP_CUDA)` only.
//
// This header stays light: it names cuDNN's opaque handle types by forward declaration (the same
// typedefs cudnn.h makes, which C++ allows to repeat) and includes no cuDNN header, which costs
// seconds of compile time per file. Only nn/cudnn*.cpp include <cudnn.h>.
//
// Every entry point takes CUDA tensors that already passed the CPU path's argument checks and runs
// on the calling thread's current stream of the tensor's device. batch_norm and pool2d record their
// own autograd node; the convolution kernels run inside the node conv2d records.
// float32 and float64 are supported (float32 in full precision: no TF32); under autocast the
// convolutions also run with float16 or bfloat16 operands on the tensor cores
// (conv2d_autocast_kernels).
#pragma once

#include <cstddef>
#include <cstdint>

#include "nn/conv.h"
#include "nn/functional.h"
#include "nn/onednn.h"
#include "tensor/tensor.h"

// The opaque types of cudnn.h (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h), declared identically.
typedef struct cudnnContext* cudnnHandle_t;
typedef struct cudnnTensorStruct* cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct* cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct* cudnnConvolutionDescriptor_t;
typedef struct cudnnPoolingStruct* cudnnPoolingDescriptor_t;

namespace ddplab::nn::cudnn {

// --- handles, descriptors, workspace (nn/cudnn.cpp) --------------------------------------------

// The calling thread's cuDNN handle for `device` (one per thread and device, created on first use,
// never destroyed), bound to that device's current stream (gpu::current_stream). The caller must
// have made `device` current (gpu::DeviceGuard).
cudnnHandle_t handle(int device);

// Scratch memory for cuDNN from ddplab's caching allocator: a uint8 tensor of `bytes` on `device`
// (undefined when bytes is 0). Keep the tensor alive until the call using it has been queued.
Tensor workspace(size_t bytes, Device device);

// Owning wrappers of cuDNN descriptors (create in the constructor, destroy in the destructor).
class TensorDesc {
 public:
  // A packed NCHW 4-D descriptor of `dtype` (float32, float64, float16 or bfloat16).
  TensorDesc(DType dtype, int64_t n, int64_t c, int64_t h, int64_t w);
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDesc {
 public:
  // A KCRS (= [O, C/groups, kH, kW]) filter descriptor.
  FilterDesc(DType dtype, int64_t o, int64_t c, int64_t kh, int64_t kw);
  ~FilterDesc();
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvDesc {
 public:
  // Cross-correlation (what deep-learning frameworks call convolution) with p's stride, padding,
  // dilation and groups. float32/float64: FMA math only (no TF32 or other tensor-op conversions);
  // float16/bfloat16: tensor-op math, accumulating in float32.
  ConvDesc(const onednn::Conv2dParams& p, DType dtype);
  ~ConvDesc();
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

enum class PoolMode { Max, AvgIncludePadding };

class PoolDesc {
 public:
  PoolDesc(PoolMode mode, functional::Pair kernel, functional::Pair stride,
           functional::Pair padding);
  ~PoolDesc();
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  cudnnPoolingDescriptor_t get() const { return desc_; }

 private:
  cudnnPoolingDescriptor_t desc_ = nullptr;
};

// The scaling factors cuDNN blends with (y = alpha * result + beta * y), in the type it reads them
// as: float for float32 data, double for float64. one() / zero() point at 1 / 0 of that type.
struct Blend {
  explicit Blend(DType t) : is_double(t == kFloat64) {}
  const void* one() const { return is_double ? static_cast<const void*>(&d1) : &f1; }
  const void* zero() const { return is_double ? static_cast<const void*>(&d0) : &f0; }
  bool is_double;
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
};

// Throws unless t is float32 or float64 (what these kernels support), naming `what`.
void check_dtype(const Tensor& t, const char* what);

// --- the differentiable functions -------------------------------------------------------------

// The convolution kernels (nn/cudnn_conv.cpp) that conv2d (nn/conv.cpp) runs on CUDA tensors,
// inside the autograd node it records for every backend.
const conv_detail::ConvKernels& conv2d_kernels();
// The same three kernels under autocast (Note [Autocast] in nn/autocast.h): they read and write
// float32 tensors like the others, but round the operands to `dtype` (float16 or bfloat16) and
// multiply on the tensor cores, accumulating in float32.
const conv_detail::ConvKernels& conv2d_autocast_kernels(DType dtype);

// batch_norm (nn/cudnn_batchnorm.cpp), called after batch_norm's own argument checks. weight and
// bias are the contiguous checked parameters (undefined when affine=false); weight_in / bias_in
// the caller's tensors (the autograd inputs). use_batch_stats: training, or no running statistics.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight_in, const Tensor& bias_in, const Tensor& weight,
                  const Tensor& bias, bool training, bool use_batch_stats, double momentum,
                  double eps);

// max_pool2d / avg_pool2d (nn/cudnn_pooling.cpp) with the checked kernel, stride and padding;
// (oh, ow) is the output size the CPU path computed.
Tensor pool2d(PoolMode mode, const char* name, const Tensor& x, functional::Pair kernel,
              functional::Pair stride, functional::Pair padding, int64_t oh, int64_t ow);

}  // namespace ddplab::nn::cudnn
