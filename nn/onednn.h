// oneDNN on the CPU: the process-wide engine and stream, and cached convolution primitives.
//
// Creating a oneDNN primitive JIT-compiles a kernel for one exact problem (shapes, strides,
// padding, memory layouts) and takes milliseconds, far longer than running it on CIFAR-sized
// tensors. So each convolution shape gets its primitives (forward, backward data, backward
// weights, and the reorders between our plain NCHW tensors and oneDNN's blocked layouts) built
// once, on first use, and kept in a table keyed by the shape (Conv2dParams). This header keeps
// dnnl.hpp out of the rest of ddplab: callers pass raw float pointers to contiguous NCHW data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddplab::nn::onednn {

// Everything that selects a convolution primitive. Sizes follow PyTorch's names:
// input [n, c, h, w], weight [o, c / groups, kh, kw], output [n, o, oh, ow].
struct Conv2dParams {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t o = 0, kh = 0, kw = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dil_h = 1, dil_w = 1;
  int64_t groups = 1;
  bool has_bias = false;

  int64_t out_h() const { return (h + 2 * pad_h - dil_h * (kh - 1) - 1) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - dil_w * (kw - 1) - 1) / stride_w + 1; }
  bool operator==(const Conv2dParams& p) const;
  std::string str() const;  // for error messages
};

// y = conv(x, w) + b. All pointers address contiguous float32 NCHW / OIHW arrays; b may be null
// when !has_bias.
void conv2d_forward(const Conv2dParams& p, const float* x, const float* w, const float* b,
                    float* y);
// gx = dL/dx from gy = dL/dy.
void conv2d_backward_data(const Conv2dParams& p, const float* gy, const float* w, float* gx);
// gw = dL/dw and (when gb is not null) gb = dL/db, overwritten (not accumulated).
void conv2d_backward_weights(const Conv2dParams& p, const float* x, const float* gy, float* gw,
                             float* gb);

// Number of distinct convolution shapes whose primitives are cached (for tests and curiosity).
size_t conv_cache_size();
// oneDNN's name for the forward kernel it picked for `p` (e.g. "brg:avx512_core").
std::string conv_forward_impl_name(const Conv2dParams& p);

}  // namespace ddplab::nn::onednn
