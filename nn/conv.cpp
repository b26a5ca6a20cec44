// 2-D convolution: conv2d (oneDNN for float32, im2col + GEMM otherwise) and conv2d_reference.
// Under autocast (nn/autocast.h) the oneDNN convolution computes with bfloat16 operands and, on
// the CPU, writes a bfloat16 output (Note [Autocast]).
//
// Three implementations of the same maths, kept side by side on purpose:
//   * conv2d_reference: a selection matrix turns im2col into a matmul, so the whole convolution
//     is a handful of differentiable ops (autograd/functions.h) and its gradient comes from their
//     backward rules. Slow; obviously right. The tests compare the fast paths against it.
//   * im2col + GEMM with a hand-written backward: runs float64 (for gradcheck) and is the
//     readable form of what a convolution kernel does.
//   * oneDNN primitives (nn/onednn.cpp): float32, the one training uses.
// The last two, and cuDNN for CUDA tensors (nn/cudnn_conv.cpp), are ConvKernels (nn/conv.h):
// conv2d_with picks one and records the same autograd node around it.
#include "nn/conv.h"

#include <algorithm>
#include <vector>

#include "autograd/function_node.h"
#include "autograd/functions.h"
#include "nn/autocast.h"
#include "nn/functional_util.h"
#include "tensor/backend.h"
#include "tensor/blocked.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

#if defined(DDP_CUDA)
#include "nn/cudnn.h"
#endif

namespace ddplab::nn {

using functional::Pair;
using onednn::Conv2dParams;

namespace conv_detail {

Conv2dParams check_conv2d_args(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride,
                               Pair padding, Pair dilation, int64_t groups) {
  DDP_CHECK(x.defined() && w.defined(), "conv2d: input and weight must be defined");
  DDP_CHECK(x.dim() == 4, "conv2d: expected a 4-D input [N, C, H, W], got shape "
                              << shape_str(x.shape()) << " (weight " << shape_str(w.shape())
                              << ")");
  DDP_CHECK(w.dim() == 4, "conv2d: expected a 4-D weight [O, C/groups, kH, kW], got shape "
                              << shape_str(w.shape()) << " (input " << shape_str(x.shape()) << ")");
  DDP_CHECK(groups >= 1, "conv2d: groups must be positive, got " << groups);
  DDP_CHECK(x.size(1) == w.size(1) * groups,
            "conv2d: input " << shape_str(x.shape()) << " has " << x.size(1)
                             << " channels but weight " << shape_str(w.shape())
                             << " with groups=" << groups << " expects " << w.size(1) * groups);
  DDP_CHECK(w.size(0) % groups == 0, "conv2d: weight " << shape_str(w.shape())
                                                       << " has out_channels not divisible by "
                                                          "groups="
                                                       << groups);
  // Under autocast a bfloat16 activation meets the float32 master weights (Note [Autocast]).
  const bool autocast_mix = amp::autocast_dtype_for(x).has_value() && w.dtype() == kFloat32;
  DDP_CHECK(x.dtype() == w.dtype() || autocast_mix,
            "conv2d: input " << shape_str(x.shape()) << " is " << dtype_name(x.dtype())
                             << " but weight " << shape_str(w.shape()) << " is "
                             << dtype_name(w.dtype()));
  DDP_CHECK(x.device() == w.device(),
            "conv2d: input is on " << x.device() << " but weight on " << w.device());
  if (b.defined()) {
    DDP_CHECK(b.dim() == 1 && b.size(0) == w.size(0),
              "conv2d: bias " << shape_str(b.shape()) << " does not match weight "
                              << shape_str(w.shape()) << " (expected [" << w.size(0) << "])");
    DDP_CHECK(b.dtype() == w.dtype() && b.device() == x.device(),
              "conv2d: bias must have the weight's dtype and the input's device");
  }
  for (int i = 0; i < 2; ++i) {
    DDP_CHECK(stride[i] >= 1 && padding[i] >= 0 && dilation[i] >= 1,
              "conv2d: need stride >= 1, padding >= 0, dilation >= 1; got stride ["
                  << stride[0] << ", " << stride[1] << "], padding [" << padding[0] << ", "
                  << padding[1] << "], dilation [" << dilation[0] << ", " << dilation[1] << "]");
  }
#if !defined(DDP_CUDA)
  DDP_CHECK(!x.is_cuda(),
            "conv2d: not implemented on CUDA yet (cuDNN convolution is pending); "
            "run the convolution on the CPU");
#endif
  Conv2dParams p;
  p.n = x.size(0), p.c = x.size(1), p.h = x.size(2), p.w = x.size(3);
  p.o = w.size(0), p.kh = w.size(2), p.kw = w.size(3);
  p.stride_h = stride[0], p.stride_w = stride[1];
  p.pad_h = padding[0], p.pad_w = padding[1];
  p.dil_h = dilation[0], p.dil_w = dilation[1];
  p.groups = groups;
  p.has_bias = b.defined();
  DDP_CHECK(p.out_h() >= 1 && p.out_w() >= 1,
            "conv2d: kernel " << shape_str(w.shape()) << " (dilation [" << dilation[0] << ", "
                              << dilation[1] << "]) is larger than the padded input "
                              << shape_str(x.shape()) << " (padding [" << padding[0] << ", "
                              << padding[1] << "])");
  return p;
}

namespace {

// cols[(c, i, j), (oh, ow)] = x[c0 + c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside):
// the input pixels each output pixel's kernel window sees, one column per output pixel.
template <class T>
void im2col(const Conv2dParams& p, const T* x, int64_t c0, int64_t cg, T* cols) {
  const int64_t oh = p.out_h(), ow = p.out_w(), rows = cg * p.kh * p.kw;
#pragma omp parallel for if (rows * oh * ow > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = c0 + r / (p.kh * p.kw), i = r / p.kw % p.kh, j = r % p.kw;
    T* out = cols + r * oh * ow;
    for (int64_t y = 0; y < oh; ++y) {
      const int64_t ih = y * p.stride_h - p.pad_h + i * p.dil_h;
      for (int64_t xo = 0; xo < ow; ++xo) {
        const int64_t iw = xo * p.stride_w - p.pad_w + j * p.dil_w;
        const bool inside = ih >= 0 && ih < p.h && iw >= 0 && iw < p.w;
        out[y * ow + xo] = inside ? x[(c * p.h + ih) * p.w + iw] : T(0);
      }
    }
  }
}

// The adjoint of im2col: adds each column entry back into the pixel it was read from.
// Channels are independent, so the parallel loop runs over channels (no two threads add into
// the same pixel).
template <class T>
void col2im(const Conv2dParams& p, const T* cols, int64_t c0, int64_t cg, T* gx) {
  const int64_t oh = p.out_h(), ow = p.out_w();
#pragma omp parallel for if (cg * p.kh * p.kw * oh * ow > kParallelGrain)
  for (int64_t c = 0; c < cg; ++c) {
    for (int64_t i = 0; i < p.kh; ++i) {
      for (int64_t j = 0; j < p.kw; ++j) {
        const T* in = cols + ((c * p.kh + i) * p.kw + j) * oh * ow;
        for (int64_t y = 0; y < oh; ++y) {
          const int64_t ih = y * p.stride_h - p.pad_h + i * p.dil_h;
          if (ih < 0 || ih >= p.h) continue;
          for (int64_t xo = 0; xo < ow; ++xo) {
            const int64_t iw = xo * p.stride_w - p.pad_w + j * p.dil_w;
            if (iw >= 0 && iw < p.w) gx[((c0 + c) * p.h + ih) * p.w + iw] += in[y * ow + xo];
          }
        }
      }
    }
  }
}

// Row-major C = alpha * op(A) @ op(B) + beta * C on raw pointers, through the CPU backend.
void gemm(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
          int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc, double beta) {
  GemmArgs g;
  g.dtype = dtype;
  g.trans_a = ta, g.trans_b = tb;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc;
  g.alpha = 1, g.beta = beta;
  backend_for(kCPU).gemm(g);
}

template <class T>
void forward_impl(const Conv2dParams& p, const T* x, const T* w, const T* b, T* y) {
  const int64_t cg = p.c / p.groups, og = p.o / p.groups, k = cg * p.kh * p.kw;
  const int64_t l = p.out_h() * p.out_w();
  std::vector<T> cols(static_cast<size_t>(k * l));
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t g = 0; g < p.groups; ++g) {
      im2col(p, x + n * p.c * p.h * p.w, g * cg, cg, cols.data());
      // y[n, group g] [og, l] = w_g [og, k] @ cols [k, l]
      gemm(dtype_of<T>::value, false, false, og, l, k, w + g * og * k, k, cols.data(), l,
           y + (n * p.o + g * og) * l, l, 0);
    }
    if (b != nullptr) {
      for (int64_t o = 0; o < p.o; ++o) {
        T* row = y + (n * p.o + o) * l;
        for (int64_t i = 0; i < l; ++i) row[i] += b[o];
      }
    }
  }
}

template <class T>
void backward_data_impl(const Conv2dParams& p, const T* gy, const T* w, T* gx) {
  const int64_t cg = p.c / p.groups, og = p.o / p.groups, k = cg * p.kh * p.kw;
  const int64_t l = p.out_h() * p.out_w();
  std::vector<T> cols(static_cast<size_t>(k * l));
  std::fill(gx, gx + p.n * p.c * p.h * p.w, T(0));
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t g = 0; g < p.groups; ++g) {
      // cols [k, l] = w_g^T [k, og] @ gy[n, group g] [og, l]
      gemm(dtype_of<T>::value, true, false, k, l, og, w + g * og * k, k,
           gy + (n * p.o + g * og) * l, l, cols.data(), l, 0);
      col2im(p, cols.data(), g * cg, cg, gx + n * p.c * p.h * p.w);
    }
  }
}

template <class T>
void backward_weights_impl(const Conv2dParams& p, const T* x, const T* gy, T* gw, T* gb) {
  const int64_t cg = p.c / p.groups, og = p.o / p.groups, k = cg * p.kh * p.kw;
  const int64_t l = p.out_h() * p.out_w();
  std::vector<T> cols(static_cast<size_t>(k * l));
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t g = 0; g < p.groups; ++g) {
      im2col(p, x + n * p.c * p.h * p.w, g * cg, cg, cols.data());
      // gw_g [og, k] (+)= gy[n, group g] [og, l] @ cols^T [l, k]
      gemm(dtype_of<T>::value, false, true, og, k, l, gy + (n * p.o + g * og) * l, l, cols.data(),
           l, gw + g * og * k, k, n == 0 ? 0 : 1);
    }
  }
  if (gb != nullptr) {
    for (int64_t o = 0; o < p.o; ++o) {
      double s = 0;
      for (int64_t n = 0; n < p.n; ++n) {
        const T* row = gy + (n * p.o + o) * l;
        for (int64_t i = 0; i < l; ++i) s += row[i];
      }
      gb[o] = static_cast<T>(s);
    }
  }
}

template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace

void im2col_conv2d_forward(const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& b,
                           const Tensor& y) {
  DDP_NN_DISPATCH(x.dtype(), "conv2d",
                  forward_impl<scalar_t>(p, x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                         ptr_or_null<scalar_t>(b), y.data_ptr<scalar_t>()));
}

void im2col_conv2d_backward_data(const Conv2dParams& p, const Tensor& gy, const Tensor& w,
                                 const Tensor& gx) {
  DDP_NN_DISPATCH(gy.dtype(), "conv2d",
                  backward_data_impl<scalar_t>(p, gy.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                               gx.data_ptr<scalar_t>()));
}

void im2col_conv2d_backward_weights(const Conv2dParams& p, const Tensor& x, const Tensor& gy,
                                    const Tensor& gw, const Tensor& gb) {
  DDP_NN_DISPATCH(
      x.dtype(), "conv2d",
      backward_weights_impl<scalar_t>(p, x.data_ptr<scalar_t>(), gy.data_ptr<scalar_t>(),
                                      gw.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(gb)));
}

namespace {

// The oneDNN kernels (nn/onednn.h) take raw pointers and the types of the arrays behind them:
// float32, or in bfloat16 precision (autocast) bfloat16 activations (x may still be float32: the
// first layer reads the images) with float32 weights (Note [Autocast]).
onednn::Element element(const Tensor& t) {
  return t.dtype() == kBFloat16 ? onednn::Element::BFloat16 : onednn::Element::Float32;
}

// Whether x counts as channels-last for a convolution: it is so, or it has one channel, whose
// bytes are the same in both layouts (and which suggest_memory_format calls contiguous). A network
// reading one-channel images (Fashion-MNIST) then runs channels-last from its first convolution
// on, where batch norm's and max pooling's loops are the fast ones: the small CNN's float32 step
// took 0.66x the time at 1 thread and 0.67x at 2 (2026-12-03, Intel Xeon with AMX; Note [Channels
// last]).
bool counts_as_channels_last(const Tensor& x) {
  return ops::suggest_memory_format(x) == ops::MemoryFormat::ChannelsLast ||
         (x.dim() == 4 && x.size(1) == 1);
}

// x_or_gx: whichever of the pair the call has (they share their dtype and layout). y (and gy) is
// bfloat16 exactly in bfloat16 precision (conv2d_with's y_dtype), in the layout
// onednn::conv2d_output_nhwc gives.
template <onednn::Precision P>
onednn::ConvTypes conv_types(const Tensor& x_or_gx) {
  constexpr onednn::Element y =
      P == onednn::Precision::BFloat16 ? onednn::Element::BFloat16 : onednn::Element::Float32;
  return {P, element(x_or_gx), y, counts_as_channels_last(x_or_gx)};
}

// Channels-last where oneDNN's kernel writes NHWC anyway (then y needs no reorder on the way out,
// nor gy on the way back in) or x is channels-last (a channels-last network stays so): the rule
// of onednn::conv2d_output_nhwc, Note [Channels last].
template <onednn::Precision P>
ops::MemoryFormat onednn_output_format(const Conv2dParams& p, const Tensor& x) {
  return onednn::conv2d_output_nhwc(p, conv_types<P>(x)) ? ops::MemoryFormat::ChannelsLast
                                                         : ops::MemoryFormat::Contiguous;
}

// Where oneDNN writes y, and backward gx, in its blocked layout (Note [Blocked activations] in
// tensor/blocked.cpp): the block size, or 0.
template <onednn::Precision P>
int64_t onednn_output_block(const Conv2dParams& p, const Tensor& x, bool input_grad) {
  return input_grad ? onednn::conv2d_input_grad_block(p, conv_types<P>(x))
                    : onednn::conv2d_output_block(p, conv_types<P>(x));
}

// The bytes of an activation as they lie (blocked ones, `block` from onednn::Blocks, are not
// rearranged: the kernel is told their layout), or null.
void* activation_bytes(const Tensor& t, int64_t block) {
  return t.defined() ? ops::in_layout(t, block).raw_data() : nullptr;
}

template <onednn::Precision P>
void onednn_forward(const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& b,
                    const Tensor& y) {
  const onednn::Blocks blocks{ops::blocked_block(x), ops::blocked_block(y)};
  onednn::conv2d_forward(p, activation_bytes(x, blocks.x), w.data_ptr<float>(),
                         ptr_or_null<float>(b), activation_bytes(y, blocks.y), conv_types<P>(x),
                         nullptr, blocks);
}

template <onednn::Precision P>
Tensor onednn_forward_keep(const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& b,
                           const Tensor& y) {
  const onednn::ConvTypes types = conv_types<P>(x);
  const onednn::Blocks blocks{ops::blocked_block(x), ops::blocked_block(y)};
  const size_t bytes = onednn::conv2d_saved_input_bytes(p, types, blocks.x);
  // A float32 tensor only as a byte buffer: its contents are in oneDNN's layout (and, in
  // bfloat16 precision, bfloat16).
  Tensor kept =
      bytes == 0 ? Tensor() : ops::empty({static_cast<int64_t>((bytes + 3) / 4)}, w.options());
  onednn::conv2d_forward(p, activation_bytes(x, blocks.x), w.data_ptr<float>(),
                         ptr_or_null<float>(b), activation_bytes(y, blocks.y), types,
                         kept.defined() ? kept.raw_data() : nullptr, blocks);
  return kept;
}

void* raw_or_null(const Tensor& t) {
  return t.defined() ? t.raw_data() : nullptr;
}

template <onednn::Precision P>
void onednn_backward(const Conv2dParams& p, const Tensor& x, const Tensor& kept, const Tensor& gy,
                     const Tensor& w, const Tensor& gx, const Tensor& gw, const Tensor& gb) {
  // x as forward saw it: forward's kept bytes were reordered from that layout. If x was blocked
  // then and has been rearranged since (an unaware reader), kept is still right, and x unused.
  const onednn::Blocks blocks{ops::blocked_block(x), 0, ops::blocked_block(gx),
                              ops::blocked_block(gy)};
  onednn::conv2d_backward(p, kept.defined() ? nullptr : activation_bytes(x, blocks.x),
                          raw_or_null(kept), activation_bytes(gy, blocks.gy), ptr_or_null<float>(w),
                          activation_bytes(gx, blocks.gx), ptr_or_null<float>(gw),
                          ptr_or_null<float>(gb), conv_types<P>(x.defined() ? x : gx), blocks);
}

template <onednn::Precision P>
void onednn_backward_data(const Conv2dParams& p, const Tensor& gy, const Tensor& w,
                          const Tensor& gx) {
  onednn_backward<P>(p, Tensor(), Tensor(), gy, w, gx, Tensor(), Tensor());
}

template <onednn::Precision P>
void onednn_backward_weights(const Conv2dParams& p, const Tensor& x, const Tensor& gy,
                             const Tensor& gw, const Tensor& gb) {
  onednn_backward<P>(p, x, Tensor(), gy, Tensor(), Tensor(), gw, gb);
}

constexpr auto kF32 = onednn::Precision::Float32;
constexpr auto kBF16 = onednn::Precision::BFloat16;
constexpr ConvKernels kOneDnnKernels{"ConvolutionBackward(oneDNN)", onednn_forward<kF32>,
                                     onednn_backward_data<kF32>,    onednn_backward_weights<kF32>,
                                     onednn_forward_keep<kF32>,     onednn_backward<kF32>,
                                     onednn_output_format<kF32>,    onednn_output_block<kF32>};
constexpr ConvKernels kOneDnnBf16Kernels{
    "ConvolutionBackward(oneDNN bf16)", onednn_forward<kBF16>,      onednn_backward_data<kBF16>,
    onednn_backward_weights<kBF16>,     onednn_forward_keep<kBF16>, onednn_backward<kBF16>,
    onednn_output_format<kBF16>,        onednn_output_block<kBF16>};
constexpr ConvKernels kIm2colKernels{"ConvolutionBackward(im2col)", im2col_conv2d_forward,
                                     im2col_conv2d_backward_data, im2col_conv2d_backward_weights};

// cuDNN for CUDA tensors whichever CPU kernel was asked for; on the CPU oneDNN serves float32
// (in bfloat16 under autocast, which also takes bfloat16 inputs) and im2col everything else
// (float64, for gradcheck).
const ConvKernels& kernels_for(const Tensor& x, bool use_onednn) {
#if defined(DDP_CUDA)
  if (x.is_cuda()) {
    const std::optional<DType> amp = amp::autocast_dtype_for(x);
    return amp ? cudnn::conv2d_autocast_kernels(*amp) : cudnn::conv2d_kernels();
  }
#endif
  if (use_onednn && amp::autocast_dtype_for(x) == kBFloat16) return kOneDnnBf16Kernels;
  if (!use_onednn || x.dtype() != kFloat32) return kIm2colKernels;
  return kOneDnnKernels;
}

// The block size `kernels` writes y (input_grad false) or gx (true) in, 0 for none: only kernels
// that offer blocked output, for a tensor that would be channels-last anyway.
int64_t output_block(const ConvKernels& kernels, const Conv2dParams& p, const Tensor& x,
                     ops::MemoryFormat format, bool input_grad) {
  const bool may = kernels.output_block != nullptr && format == ops::MemoryFormat::ChannelsLast;
  return may ? kernels.output_block(p, x, input_grad) : 0;
}

}  // namespace

Tensor conv2d_with(bool use_onednn, const Tensor& x_in, const Tensor& w_in, const Tensor& b_in,
                   Pair stride, Pair padding, Pair dilation, int64_t groups) {
  Conv2dParams p = check_conv2d_args(x_in, w_in, b_in, stride, padding, dilation, groups);
  const ConvKernels* kernels = &kernels_for(x_in, use_onednn);
  // The kernels read dense arrays: row-major, or channels-last for those that take it (a no-op
  // usually). The output's format is the kernel's choice.
  const bool takes_nhwc = kernels->output_format != nullptr;
  const ops::MemoryFormat x_format =
      takes_nhwc ? ops::suggest_memory_format(x_in) : ops::MemoryFormat::Contiguous;
  Tensor x = ops::contiguous(x_in, x_format), w = ops::contiguous(w_in);
  Tensor b = b_in.defined() ? ops::contiguous(b_in) : Tensor();
  // Under autocast on the CPU the output stays bfloat16 for the layers after it (Note
  // [Autocast]); everywhere else it has the input's dtype.
  const DType y_dtype = kernels == &kOneDnnBf16Kernels ? kBFloat16 : x.dtype();
  const ops::MemoryFormat y_format =
      takes_nhwc ? kernels->output_format(p, x) : ops::MemoryFormat::Contiguous;
  const Shape y_shape{p.n, p.o, p.out_h(), p.out_w()};
  Tensor y = ops::empty_in_layout(y_shape, x.options().with_dtype(y_dtype),
                                  output_block(*kernels, p, x, y_format, false), y_format);
  std::vector<Tensor> inputs{x_in, w_in};
  if (b_in.defined()) inputs.push_back(b_in);
  const bool record = autograd::needs_grad(inputs);
  // What forward_keep keeps serves the weight gradient only.
  Tensor kept;
  if (record && kernels->forward_keep != nullptr && autograd::needs_grad({w_in})) {
    kept = kernels->forward_keep(p, x, w, b, y);
  } else {
    kernels->forward(p, x, w, b, y);
  }
  if (!record) return y;
  // Backward runs with forward's thread count: the primitives (and so the layouts of y, kept and
  // gx) are chosen per count, and the count may change between the two (Note [Threads under
  // load] in tensor/adaptive_threads.cpp).
  const int threads = get_num_threads();
  return autograd::record(
      kernels->node_name, y, inputs, {x, w, kept},
      [p, kernels, y_dtype, x_format, y_format, threads](
          const Tensor& grad, const autograd::Saved& s, const autograd::Needs& needs) {
        const ScopedNumThreads same_as_forward(threads);
        const Tensor& x = s[0];
        const Tensor& w = s[1];
        // The gradient has the output's dtype (it may arrive wider from a float32 consumer) and
        // its format; gx gets x's.
        Tensor gy = ops::contiguous(ops::to(grad, y_dtype), y_format);
        autograd::Grads g(needs.size());
        const bool want_bias = p.has_bias && needs[2];
        if (needs[0]) {
          g[0] = ops::empty_in_layout(x.shape(), x.options(),
                                      output_block(*kernels, p, x, x_format, true), x_format);
        }
        if (needs[1]) {
          g[1] = ops::empty(w.shape(), w.options());
          // The weights pass also sums the bias gradient, saving a second pass over gy.
          if (want_bias) g[2] = ops::empty({p.o}, w.options());
        }
        if (kernels->backward != nullptr) {
          kernels->backward(p, x, s[2], gy, w, g[0], g[1], want_bias && needs[1] ? g[2] : Tensor());
        } else {
          if (needs[0]) kernels->backward_data(p, gy, w, g[0]);
          if (needs[1]) kernels->backward_weights(p, x, gy, g[1], want_bias ? g[2] : Tensor());
        }
        if (want_bias && !needs[1]) g[2] = ops::sum(ops::to(gy, w.dtype()), {0, 2, 3});
        return g;
      });
}

}  // namespace conv_detail

namespace functional {

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride, Pair padding,
              Pair dilation, int64_t groups) {
  return conv_detail::conv2d_with(true, x, w, b, stride, padding, dilation, groups);
}

// im2col as a matmul: with S[(h, w), (i, j, oh, ow)] = 1 where input pixel (h, w) is what kernel
// tap (i, j) of output pixel (oh, ow) reads, x [N, C, H*W] @ S gives every kernel window as a
// column. Padding needs no special case: a tap that falls outside the input has no 1 in S, so it
// reads zero. Everything after building S is differentiable ops, so autograd derives the
// backward by itself.
Tensor conv2d_reference(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride,
                        Pair padding, Pair dilation, int64_t groups) {
  Conv2dParams p = conv_detail::check_conv2d_args(x, w, b, stride, padding, dilation, groups);
  const int64_t oh = p.out_h(), ow = p.out_w(), kk = p.kh * p.kw, l = oh * ow;
  const int64_t cg = p.c / groups, og = p.o / groups;
  std::vector<double> s(static_cast<size_t>(p.h * p.w * kk * l), 0.0);
  for (int64_t i = 0; i < p.kh; ++i) {
    for (int64_t j = 0; j < p.kw; ++j) {
      for (int64_t y = 0; y < oh; ++y) {
        for (int64_t xo = 0; xo < ow; ++xo) {
          const int64_t ih = y * p.stride_h - p.pad_h + i * p.dil_h;
          const int64_t iw = xo * p.stride_w - p.pad_w + j * p.dil_w;
          if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) continue;
          const int64_t col = (i * p.kw + j) * l + y * ow + xo;
          s[static_cast<size_t>((ih * p.w + iw) * kk * l + col)] = 1.0;
        }
      }
    }
  }
  Tensor sel = ops::from_vector(s, {p.h * p.w, kk * l}, x.options());
  // [N, C, H*W] @ [H*W, kk*L] -> [N, C, kk*L] -> [N, G, Cg*kk, L]
  Tensor cols = ddplab::matmul(ddplab::reshape(x, {p.n, p.c, p.h * p.w}), sel);
  cols = ddplab::reshape(cols, {p.n, groups, cg * kk, l});
  // weight [O, Cg, kh, kw] -> [1, G, Og, Cg*kk]; out [N, G, Og, L]
  Tensor wg = ddplab::reshape(w, {1, groups, og, cg * kk});
  Tensor y = ddplab::reshape(ddplab::matmul(wg, cols), {p.n, p.o, oh, ow});
  if (b.defined()) y = ddplab::add(y, ddplab::reshape(b, {1, p.o, 1, 1}));
  return y;
}

}  // namespace functional

}  // namespace ddplab::nn
