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

// Picks the first algorithm the heuristics rank as runnable (and not tensor-op math).
template <class Perf>
Algo pick(const std::vector<Perf>& perf, int count, const Conv2dParams& p, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && !uses_tensor_ops(perf[i].mathType)) {
      return Algo{static_cast<int>(perf[i].algo), perf[i].memory};
    }
  }
  DDP_FAIL("conv2d: cuDNN offers no " << what << " algorithm for " << p.str());
}

Algo choose(cudnnHandle_t h, const ConvDescs& d, const Conv2dParams& p, Pass pass) {
  int max_count = 0, count = 0;
  Algo a;
  switch (pass) {
    case Pass::Forward: {
      DDP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(max_count));
      DDP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
          h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), max_count, &count, perf.data()));
      a = pick(perf, count, p, "forward");
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
      a = pick(perf, count, p, "backward-data");
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
      a = pick(perf, count, p, "backward-filter");
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
  Algo a = choose(h, d, p, pass);  // outside the lock: two threads may both choose, harmlessly
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
  check_dtype(x, "conv2d");
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

}  // namespace

const conv_detail::ConvKernels& conv2d_kernels() {
  return kKernels;
}

}  // namespace ddplab::nn::cudnn
