// oneDNN on the CPU: the process-wide engine and stream, and cached convolution primitives.
//
// Creating a oneDNN primitive JIT-compiles a kernel for one exact problem (shapes, strides,
// padding, memory layouts) and takes milliseconds, far longer than running it on CIFAR-sized
// tensors. So each convolution shape gets its primitives (forward, backward data, backward
// weights, and the reorders between our plain NCHW tensors and oneDNN's blocked layouts) built
// once, on first use, and kept in a table keyed by the shape (Conv2dParams) and the precision.
// This header keeps dnnl.hpp out of the rest of ddplab: callers pass raw pointers to dense NCHW
// or NHWC data (float32, or bfloat16 activations under autocast: ConvTypes).
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

// What the products of a convolution read. Float32: everything float32. BFloat16 (autocast,
// Note [Autocast] in nn/autocast.h): the operands of the products (input, weight, output
// gradient) are bfloat16, rounded on their way into the kernel where the caller holds them in
// float32 (oneDNN reorders them into its blocked layout anyway, so the conversion costs no extra
// pass over memory); the kernel accumulates in float32.
enum class Precision { Float32, BFloat16 };

// The element type of an array the caller holds.
enum class Element { Float32, BFloat16 };

// The types of one convolution: what the products read, and how the caller holds the
// activations: x (and its gradient gx) and y (and its gradient gy). Weights, bias and their
// gradients are float32 arrays always (master weights). Under autocast the activations between
// layers are bfloat16 (y = Element::BFloat16, and x too except for the first layer, which reads
// the float32 images); bfloat16 arrays need Precision::BFloat16.
//
// And the layout the caller holds x (and gx) in: NCHW, or NHWC (channels-last, Note [Channels
// last] in tensor/ops_create.cpp) where x_nhwc says so. y's (and gy's) layout follows from these
// and the kernel: conv2d_output_nhwc.
struct ConvTypes {
  Precision prec = Precision::Float32;
  Element x = Element::Float32;
  Element y = Element::Float32;
  bool x_nhwc = false;
  bool operator==(const ConvTypes& t) const {
    return prec == t.prec && x == t.x && y == t.y && x_nhwc == t.x_nhwc;
  }
};

// Which algorithm CPU convolutions use (Note [Winograd] in nn/onednn.cpp).
enum class ConvAlgorithm {
  Auto,        // Winograd for float32 3x3 stride-1 convolutions: oneDNN's with >= 32 channels in
               // and out on AVX-512 (where it was measured faster), ours (nn/winograd.h) where
               // oneDNN runs them directly and the padding is 1; direct everywhere else
  OneDnnOnly,  // Winograd only where oneDNN has it, direct elsewhere (to compare with Auto)
  Direct,      // always direct, like PyTorch's oneDNN path (for comparisons)
};
// The algorithm for convolutions run from now on (primitives already built for the other setting
// stay cached). Starts as DDPLAB_CONV_ALGO says ("auto", "onednn" or "direct"), else Auto.
void set_conv_algorithm(ConvAlgorithm a);
ConvAlgorithm conv_algorithm();
// Whether a convolution of `p` with `types` runs Winograd's algorithm under the current setting
// (oneDNN's, or ours where the activations are channels-last or blocked).
bool conv_uses_winograd(const Conv2dParams& p, ConvTypes types = {});

// Whether the calls below with `types` hold y (and gy) channels-last (NHWC), else NCHW: NHWC where
// the forward kernel writes NHWC bytes, so that y needs no reorder out nor gy one in, and wherever
// x is NHWC, so that a channels-last network stays channels-last (Note [Channels last]).
bool conv2d_output_nhwc(const Conv2dParams& p, ConvTypes types = {});

// Note [Blocked activations] (tensor/blocked.cpp): the block size of oneDNN's nChw<B>c in which a
// float32 convolution with `types` writes y (conv2d_output_block) and, backward, gx
// (conv2d_input_grad_block), or 0 where it writes them as conv2d_output_nhwc and x_nhwc say: B
// (16 on AVX-512, 8 below) where its kernel works in that layout, the tensor would be
// channels-last, and the channels are more than one block (with one, nChw<B>c is NHWC byte for
// byte). Off (always 0) after set_blocked_activations(false) or with DDPLAB_BLOCKED=0.
int64_t conv2d_output_block(const Conv2dParams& p, ConvTypes types = {});
int64_t conv2d_input_grad_block(const Conv2dParams& p, ConvTypes types = {});
void set_blocked_activations(bool on);
bool blocked_activations();

// The blocked layouts of the activation arrays of one call: 0 for an array laid out as `types`
// and conv2d_output_nhwc say, B for nChw<B>c as conv2d_output_block / conv2d_input_grad_block (or
// the tensor handed in) say.
struct Blocks {
  int64_t x = 0, y = 0, gx = 0, gy = 0;
};

// y = conv(x, w) + b. All pointers address dense arrays, the activations laid out as `types`
// and conv2d_output_nhwc say and w OIHW: x and y of the types
// `types` gives, w and b float32; b may be null when !has_bias. x_saved (optional;
// conv2d_saved_input_bytes(p) bytes) receives x in the layout the backward-weights primitive
// reads, for conv2d_backward: forward reorders x into that layout anyway, so keeping the result
// saves backward the same reorder (at the price of the memory).
void conv2d_forward(const Conv2dParams& p, const void* x, const float* w, const float* b, void* y,
                    ConvTypes types = {}, void* x_saved = nullptr, Blocks blocks = {});
// The size of forward's x_saved, or 0 when keeping it saves nothing (x needs no reorder, or
// forward and backward weights read different layouts).
size_t conv2d_saved_input_bytes(const Conv2dParams& p, ConvTypes types = {}, int64_t x_block = 0);
// The gradients from gy = dL/dy in one call: gx = dL/dx unless gx is null, gw = dL/dw (and gb =
// dL/db unless null) unless gw is null; overwritten, not accumulated. x_saved is forward's (or
// null: x is read). One call instead of the two below lets both read gy reordered once. gy has
// y's type, gx x's (`types`); gw and gb are float32.
void conv2d_backward(const Conv2dParams& p, const void* x, const void* x_saved, const void* gy,
                     const float* w, void* gx, float* gw, float* gb, ConvTypes types = {},
                     Blocks blocks = {});
// gx = dL/dx from gy = dL/dy.
void conv2d_backward_data(const Conv2dParams& p, const void* gy, const float* w, void* gx,
                          ConvTypes types = {});
// gw = dL/dw and (when gb is not null) gb = dL/db, overwritten (not accumulated).
void conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* gy, float* gw,
                             float* gb, ConvTypes types = {});

// Whether oneDNN runs bfloat16 convolutions and matmuls on this CPU: it needs AVX-512 (with
// avx512_bf16 it has native bfloat16 dot-product instructions; on plain AVX-512 it converts in
// registers).
bool cpu_has_bf16_kernels();
// oneDNN's name for the instruction set it dispatches to on this CPU (e.g. "avx512_core_bf16").
std::string cpu_isa_name();
// The major version of the oneDNN running (2 for Debian 12's 2.6.3, 3 with -Donednn=pypi): the
// two differ in which kernels exist (3.x has no Winograd on x86), which tests must know.
int major_version();

// Number of distinct convolution shapes (and precisions) whose primitives are cached (for tests
// and curiosity).
size_t conv_cache_size();
// oneDNN's name for the forward kernel it picked for `p` (e.g. "brg:avx512_core").
std::string conv_forward_impl_name(const Conv2dParams& p, ConvTypes types = {});
// In how many parts of the batch, one thread each, the weight gradient of `p` runs on the calling
// thread's thread count: 1, except for bfloat16 strided convolutions on oneDNN's jit_bf16 kernel
// (Note [bf16 strided weight gradient] in nn/onednn.cpp).
int conv_backward_weights_parts(const Conv2dParams& p, ConvTypes types = {});

}  // namespace ddplab::nn::onednn
