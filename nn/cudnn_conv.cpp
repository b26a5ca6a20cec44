// conv2d on CUDA through cuDNN: forward, backward data, backward filter (nn/cudnn.h).
//
// The algorithm of each of the three calls is chosen once per problem (shape, stride, padding,
// dilation, groups, dtype, device) with cuDNN's heuristics (cudnnGet*Algorithm_v7: no trial runs,
// so no allocation or synchronization happens while choosing) and cached with its workspace size.
// The workspace comes from ddplab's caching allocator. Bias is added (and its gradient summed)
// with ordinary ops.
#include <cudnn.h>

#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "nn/cudnn.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"

namespace ddplab::nn::cudnn {

namespace {

using onednn::Conv2dParams;

// The descriptors of one problem.
struct ConvDescs {
  ConvDescs(const Conv2dParams& p, DType t)
      : x(t, p.n, p.c, p.h, p.w),
        y(t, p.n, p.o, p.out_h(), p.out_w()),
        w(t, p.o, p.c / p.groups, p.kh, p.kw),
        conv(p, t) {}
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
};

enum class Pass { Forward, BackwardData, BackwardFilter };

struct Algo {
  int algo = 0;  // the cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t value
  size_t workspace = 0;
};

std::string cache_key(const Conv2dParams& p, DType t, int device, Pass pass) {
  std::ostringstream s;
  s << p.str() << '|' << dtype_name(t) << '|' << device << '|' << static_cast<int>(pass);
  return s.str();
}

bool uses_tensor_ops(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

bool is_16_bit(DType t) {
  return t == kFloat16 || t == kBFloat16;
}

// Picks the first algorithm the heuristics rank as runnable (and, for float32 and float64, not
// tensor-op math: see ConvDesc).
template <class Perf>
Algo pick(const std::vector<Perf>& perf, int count, const Conv2dParams& p, DType t,
          const char* what) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS &&
        (is_16_bit(t) || !uses_tensor_ops(perf[i].mathType))) {
      return Algo{static_cast<int>(perf[i].algo), perf[i].memory};
    }
  }
  DDP_FAIL("conv2d: cuDNN offers no " << what << " algorithm for " << p.str());
}

Algo choose(cudnnHandle_t h, const ConvDescs& d, const Conv2dParams& p, DType t, Pass pass) {
  int max_count = 0, count = 0;
  Algo a;
  switch (pass) {
    case Pass::Forward: {
      DDP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(max_count));
      DDP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
          h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), max_count, &count, perf.data()));
      a = pick(perf, count, p, t, "forward");
      DDP_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
          h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
          static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), &a.workspace));
      break;
    }
    case Pass::BackwardData: {
      DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(max_count));
      DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), max_count, &count, perf.data()));
      a = pick(perf, count, p, t, "backward-data");
      DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
          h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo), &a.workspace));
      break;
    }
    case Pass::BackwardFilter: {
      DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(max_count));
      DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), max_count, &count, perf.data()));
      a = pick(perf, count, p, t, "backward-filter");
      DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo), &a.workspace));
      break;
    }
  }
  return a;
}

// The cached algorithm of (problem, pass); chosen on first use.
Algo algo_for(cudnnHandle_t h, const ConvDescs& d, const Conv2dParams& p, DType t, int device,
              Pass pass) {
  static std::mutex mu;
  static std::unordered_map<std::string, Algo> cache;
  const std::string key = cache_key(p, t, device, pass);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  Algo a = choose(h, d, p, t, pass);  // outside the lock: two threads may both choose, harmlessly
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, a);
  return a;
}

void* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.raw_data() : nullptr;
}

// What each of the three cuDNN calls below needs: the tensor's device made current, its cuDNN
// handle, the descriptors, the algorithm chosen for `pass` and a workspace of the size it needs.
// (Members are initialised in this order: the handle needs the device current.)
struct ConvCall {
  ConvCall(const Conv2dParams& p, const Tensor& t, Pass pass)
      : guard(t.device().index),
        h(handle(t.device().index)),
        d(p, t.dtype()),
        algo(algo_for(h, d, p, t.dtype(), t.device().index, pass)),
        ws(workspace(algo.workspace, t.device())),
        blend(t.dtype()) {}
  gpu::DeviceGuard guard;
  cudnnHandle_t h;
  ConvDescs d;
  Algo algo;
  Tensor ws;  // kept alive until the call using it has been queued
  Blend blend;
};

void forward(const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& b,
             const Tensor& y) {
  if (!is_16_bit(x.dtype())) check_dtype(x, "conv2d");  // 16-bit: from the autocast kernels
  const ConvCall c(p, x, Pass::Forward);
  DDP_CUDNN_CHECK(cudnnConvolutionForward(
      c.h, c.blend.one(), c.d.x.get(), x.raw_data(), c.d.w.get(), w.raw_data(), c.d.conv.get(),
      static_cast<cudnnConvolutionFwdAlgo_t>(c.algo.algo), ptr_or_null(c.ws), c.algo.workspace,
      c.blend.zero(), c.d.y.get(), y.raw_data()));
  if (b.defined()) ops::add_(y, ops::reshape(b, {1, p.o, 1, 1}));
}

void backward_data(const Conv2dParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx) {
  const ConvCall c(p, gy, Pass::BackwardData);
  DDP_CUDNN_CHECK(cudnnConvolutionBackwardData(
      c.h, c.blend.one(), c.d.w.get(), w.raw_data(), c.d.y.get(), gy.raw_data(), c.d.conv.get(),
      static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo.algo), ptr_or_null(c.ws), c.algo.workspace,
      c.blend.zero(), c.d.x.get(), gx.raw_data()));
}

// The filter gradient from cuDNN; the bias gradient (the sum of gy over batch and pixels) with
// ordinary ops.
void backward_weights(const Conv2dParams& p, const Tensor& x, const Tensor& gy, const Tensor& gw,
                      const Tensor& gb) {
  const ConvCall c(p, x, Pass::BackwardFilter);
  DDP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      c.h, c.blend.one(), c.d.x.get(), x.raw_data(), c.d.y.get(), gy.raw_data(), c.d.conv.get(),
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo.algo), ptr_or_null(c.ws),
      c.algo.workspace, c.blend.zero(), c.d.w.get(), gw.raw_data()));
  if (gb.defined()) ops::copy_(gb, ops::sum(gy, {0, 2, 3}));
}

constexpr conv_detail::ConvKernels kKernels{"ConvolutionBackward(cuDNN)", forward, backward_data,
                                            backward_weights};

// Autocast (Note [Autocast] in nn/autocast.h). cuDNN wants the input, filter and output of one
// call in one type, so unlike oneDNN it cannot read float32 and multiply in 16 bits by itself:
// each kernel rounds its float32 operands to T (ops::to, one pass each), runs the 16-bit
// convolution on the tensor cores (accumulating in float32), and widens the result into the
// float32 tensor the caller gave. The products are those of the CPU's bfloat16 kernels; the
// extra rounding of the result to T before widening is the price of cuDNN's one-type rule
// (PyTorch's CUDA autocast hands the 16-bit output on instead: ours stays float32 so that
// BatchNorm and the loss see float32, as on the CPU).
template <DType T>
void forward_16(const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& b,
                const Tensor& y) {
  Tensor y16 = ops::empty(y.shape(), TensorOptions(T, y.device()));
  forward(p, ops::to(x, T), ops::to(w, T), Tensor(), y16);
  ops::copy_(y, y16);
  if (b.defined()) ops::add_(y, ops::reshape(b, {1, p.o, 1, 1}));  // bias in float32
}

template <DType T>
void backward_data_16(const Conv2dParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx) {
  Tensor gx16 = ops::empty(gx.shape(), TensorOptions(T, gx.device()));
  backward_data(p, ops::to(gy, T), ops::to(w, T), gx16);
  ops::copy_(gx, gx16);
}

template <DType T>
void backward_weights_16(const Conv2dParams& p, const Tensor& x, const Tensor& gy, const Tensor& gw,
                         const Tensor& gb) {
  Tensor gw16 = ops::empty(gw.shape(), TensorOptions(T, gw.device()));
  backward_weights(p, ops::to(x, T), ops::to(gy, T), gw16, Tensor());
  ops::copy_(gw, gw16);
  if (gb.defined()) ops::copy_(gb, ops::sum(gy, {0, 2, 3}));  // from the float32 gradient
}

constexpr conv_detail::ConvKernels kHalfKernels{
    "ConvolutionBackward(cuDNN float16)", forward_16<DType::Float16>,
    backward_data_16<DType::Float16>, backward_weights_16<DType::Float16>};
constexpr conv_detail::ConvKernels kBFloat16Kernels{
    "ConvolutionBackward(cuDNN bfloat16)", forward_16<DType::BFloat16>,
    backward_data_16<DType::BFloat16>, backward_weights_16<DType::BFloat16>};

}  // namespace

const conv_detail::ConvKernels& conv2d_kernels() {
  return kKernels;
}

const conv_detail::ConvKernels& conv2d_autocast_kernels(DType dtype) {
  DDP_CHECK(is_16_bit(dtype),
            "conv2d: autocast computes in float16 or bfloat16, not " << dtype_name(dtype));
  return dtype == kFloat16 ? kHalfKernels : kBFloat16Kernels;
}

}  // namespace ddplab::nn::cudnn
