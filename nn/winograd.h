// Winograd's F(m x m, 3x3) convolution on the CPU, our own kernel: 3x3, stride 1, padding 1
// convolutions whose channels oneDNN only runs directly (Note [Winograd F(m x m, 3x3)] in
// nn/winograd.cpp). Float32 arithmetic on float32 or bfloat16 activations, channels in
// vector-register-wide groups; nn/onednn.cpp calls it in place of its primitives where `fits`
// says so.
#pragma once

#include <cstdint>

namespace ddplab::nn::winograd {

// One convolution: input [n, c, h, w], weight [o, c, 3, 3], output [n, o, h, w]. The activations
// (x and gx, y and gy) are held blocked, [n][channels / block][h][w][block]; a block equal to the
// channel count is NHWC (channels-last).
// `lanes` picks the kernel: 16 floats per vector register (AVX-512) or 8 (AVX2 with FMA); the
// caller passes the width oneDNN runs at, so that ONEDNN_MAX_CPU_ISA limits both alike. `tile` is
// the side m of the output tiles, F(m x m, 3x3): 4 (fewer products) or 2 (more accurate).
struct Problem {
  int64_t n = 0, c = 0, h = 0, w = 0, o = 0;
  int64_t x_block = 0, y_block = 0;
  int64_t lanes = 0;
  int64_t tile = 4;
  // The activations (x, y, gy, gx) are bfloat16 (uint16_t bits) instead of float32; the weights,
  // bias and their gradients stay float32 (Note [bfloat16 activations] in nn/winograd.cpp).
  bool bf16 = false;
};

// Whether the kernel can run `p` on this CPU: its instruction set present, a tile size it has,
// channel counts and blocks in whole vectors.
bool fits(const Problem& p);

// y = conv(x, w) + b (b may be null); w is OIHW.
void forward(const Problem& p, const void* x, const float* w, const float* b, void* y);
// gx = dL/dx from gy = dL/dy.
void backward_data(const Problem& p, const void* gy, const float* w, void* gx);
// gw = dL/dw (OIHW) and, unless null, gb = dL/db; overwritten.
void backward_weights(const Problem& p, const void* x, const void* gy, float* gw, float* gb);

}  // namespace ddplab::nn::winograd
