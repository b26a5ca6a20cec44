// Internals of nn/conv.cpp shared with tests: argument checking and the raw im2col kernels.
//
// conv2d (nn/functional.h) is the public entry point; these are exposed so the tests can exercise
// the im2col path on float32 too (it normally serves float64, for gradcheck).
#pragma once

#include "nn/functional.h"
#include "nn/onednn.h"
#include "tensor/ops.h"

namespace ddplab::nn::conv_detail {

// Validates conv2d's arguments (ranks, channel counts, groups, dtypes, devices, output size) and
// returns the problem description. Errors name the input and weight shapes.
onednn::Conv2dParams check_conv2d_args(const Tensor& x, const Tensor& w, const Tensor& b,
                                       functional::Pair stride, functional::Pair padding,
                                       functional::Pair dilation, int64_t groups);

// The im2col + GEMM convolution on contiguous tensors (float32 or float64), without autograd.
// y = conv(x, w) + b; gx = dL/dx; gw / gb = dL/dw, dL/db (gb may be undefined).
void im2col_conv2d_forward(const onednn::Conv2dParams& p, const Tensor& x, const Tensor& w,
                           const Tensor& b, const Tensor& y);
void im2col_conv2d_backward_data(const onednn::Conv2dParams& p, const Tensor& gy, const Tensor& w,
                                 const Tensor& gx);
void im2col_conv2d_backward_weights(const onednn::Conv2dParams& p, const Tensor& x,
                                    const Tensor& gy, const Tensor& gw, const Tensor& gb);

// One implementation of the convolution: the three kernels its forward and backward passes run.
// conv2d picks one by device and dtype (oneDNN, im2col + GEMM, cuDNN) and records the same autograd
// node around whichever it picked, so the autograd wiring is written once for every backend.
// The kernels read contiguous tensors and write into tensors the caller allocated with the input's
// dtype and device; they overwrite their outputs (never accumulate).
struct ConvKernels {
  const char* node_name;  // the autograd node, e.g. "ConvolutionBackward(oneDNN)"
  // y = conv(x, w) + b (b may be undefined).
  void (*forward)(const onednn::Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& b,
                  const Tensor& y);
  // gx = dL/dx.
  void (*backward_data)(const onednn::Conv2dParams& p, const Tensor& gy, const Tensor& w,
                        const Tensor& gx);
  // gw = dL/dw and, when gb is defined, gb = dL/db.
  void (*backward_weights)(const onednn::Conv2dParams& p, const Tensor& x, const Tensor& gy,
                           const Tensor& gw, const Tensor& gb);
  // Optional (null where a backend does not offer them), for work the two passes can share:
  // forward_keep is forward that also returns something for backward to reuse (oneDNN: x in
  // its blocked layout) or an undefined tensor; backward computes the gradients whose tensors
  // are defined (gx, gw, gb) in one call, with `kept` from forward_keep (oneDNN: gy is reordered
  // once for both gradients, and x not at all).
  Tensor (*forward_keep)(const onednn::Conv2dParams& p, const Tensor& x, const Tensor& w,
                         const Tensor& b, const Tensor& y) = nullptr;
  void (*backward)(const onednn::Conv2dParams& p, const Tensor& x, const Tensor& kept,
                   const Tensor& gy, const Tensor& w, const Tensor& gx, const Tensor& gw,
                   const Tensor& gb) = nullptr;
  // Kernels that read and write channels-last activations as well as row-major ones set this; it
  // says in which format they write y (Note [Channels last] in tensor/ops_create.cpp). Null: the
  // kernels take row-major arrays only.
  ops::MemoryFormat (*output_format)(const onednn::Conv2dParams& p, const Tensor& x) = nullptr;
  // Kernels that write y (input_grad false) or gx (true) in a blocked layout where it pays set
  // this; it gives the block size, or 0 (Note [Blocked activations] in tensor/blocked.cpp).
  // Such kernels also read blocked x and gy.
  int64_t (*output_block)(const onednn::Conv2dParams& p, const Tensor& x,
                          bool input_grad) = nullptr;
};

// conv2d with a chosen kernel: `use_onednn` false forces the im2col path (float32 allowed).
Tensor conv2d_with(bool use_onednn, const Tensor& x, const Tensor& w, const Tensor& b,
                   functional::Pair stride, functional::Pair padding, functional::Pair dilation,
                   int64_t groups);

}  // namespace ddplab::nn::conv_detail
