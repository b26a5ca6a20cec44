// Private to batch norm's own files (nn/batchnorm_*): nothing else includes it, and nothing here
// is a promise to other code. They share it because batch_norm (its fused forms too) and
// SyncBatchNorm's steps run the same kernels, and because the channels-last kernels must apply
// the reference kernels' very scale, shift and clamp to give the same bits.
#pragma once

#include <cstdint>

#include "tensor/blocked.h"
#include "tensor/dtype.h"
#include "tensor/macros.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace ddplab::nn::batchnorm_detail {

// x viewed as [N, C, S] (S = H*W for 4-D input, 1 for 2-D [N, C]).
struct BnShape {
  int64_t n, c, s;
  int64_t count() const { return n * s; }
};

inline BnShape bn_shape(const Tensor& x) {
  BnShape d{x.size(0), x.size(1), 1};
  for (int64_t k = 2; k < x.dim(); ++k) d.s *= x.size(k);
  return d;
}

// y = (x - mean) * invstd * weight + bias is computed as y = x * scale + shift, with channel c's
// scale and shift taken in double and rounded to the arithmetic type P once.
template <class P>
void scale_shift(const double* mean, const double* invstd, const P* weight, const P* bias,
                 int64_t c, P& sc, P& sh) {
  const double g = weight ? static_cast<double>(weight[c]) : 1.0;
  const double scale = g * invstd[c];
  const double shift = (bias ? static_cast<double>(bias[c]) : 0.0) - mean[c] * scale;
  sc = static_cast<P>(scale);
  sh = static_cast<P>(shift);
}

// max(v, 0) for batch_norm_relu, the clamp written as ReluOp writes it so that NaN stays NaN.
template <class P>
DDP_ALWAYS_INLINE P relu_clamp(P v) {
  return v <= P(0) ? P(0) : v;
}

// The values of t as they lie: blocked bytes not rearranged when block != 0 (the loops walk them
// blocked), else t's data as any kernel reads it.
template <class T>
T* stored(const Tensor& t, int64_t block) {
  return ops::in_layout(t, block).data_ptr<T>();
}

// A new tensor of x's shape and dtype in x's layout: blocked like x, or `format`.
inline Tensor like(const Tensor& x, int64_t block, ops::MemoryFormat format) {
  return ops::empty_in_layout(x.shape(), x.options(), block, format);
}

// The checks and conversion every entry point applies to weight and bias (in
// nn/batchnorm_kernels.cpp, with batch_norm's argument checks).
DType param_dtype(const Tensor& x);
Tensor param_or_none(const Tensor& t, const Tensor& x, int64_t c, const char* name);

// --- The kernels one file writes and another calls ---------------------------------------------
//
// Statistics are double whatever T is; weight, bias and their gradients are compute_t<T>. Each is
// compiled for float, double and BFloat16, except the two SyncBatchNorm steps grad_sums and
// input_grad, which take no bfloat16 (DDP_NN_DISPATCH).

// The reference kernels, over the contiguous [N, C, S] rows (nn/batchnorm_contiguous.cpp).
// backward's y: batch_norm_relu's output, whose sign masks dy, or nullptr for batch_norm.
template <class T>
void batch_moments(const T* x, const BnShape& d, double* mean, double* m2);
template <class T, bool kRelu = false>
void normalize(const T* x, const BnShape& d, const double* mean, const double* invstd,
               const compute_t<T>* weight, const compute_t<T>* bias, T* y);
template <class T>
void backward(const T* x, const T* dy, const T* y, const BnShape& d, const double* mean,
              const double* invstd, const compute_t<T>* weight, bool training, T* dx,
              compute_t<T>* dweight, compute_t<T>* dbias);
template <class T>
void grad_sums(const T* x, const T* dy, const BnShape& d, const double* mean, double* sums);
template <class T>
void input_grad(const T* x, const T* dy, const BnShape& d, const double* mean, const double* invstd,
                const T* weight, const double* sums, double count, T* dx);

// The same for a channels-last x, or one blocked in groups of `block` channels (0: not blocked),
// their results in x's layout (nn/batchnorm_channels_last.cpp, and the backward in
// nn/batchnorm_channels_last_backward.cpp). backward_nhwc's relu, bias, y and dy_masked: see there.
template <class T>
void batch_moments_nhwc(const T* x, const BnShape& d, double* mean, double* m2, int64_t block);
template <class T, bool kRelu = false>
void normalize_nhwc(const T* x, const BnShape& d, const double* mean, const double* invstd,
                    const compute_t<T>* weight, const compute_t<T>* bias, T* y, int64_t block);
template <class T>
void normalize_add_relu_nhwc(const T* x, const T* residual, const BnShape& d, const double* mean,
                             const double* invstd, const compute_t<T>* weight,
                             const compute_t<T>* bias, T* y, int64_t block);
template <class T>
void backward_nhwc(const T* x, const T* dy, bool relu, const compute_t<T>* bias, const T* y,
                   T* dy_masked, const BnShape& d, const double* mean, const double* invstd,
                   const compute_t<T>* weight, bool training, T* dx, compute_t<T>* dweight,
                   compute_t<T>* dbias, int64_t block);
template <class T>
void grad_sums_nhwc(const T* x, const T* dy, const BnShape& d, const double* mean, double* sums,
                    int64_t block);
template <class T>
void input_grad_nhwc(const T* x, const T* dy, const BnShape& d, const double* mean,
                     const double* invstd, const T* weight, const double* sums, double count, T* dx,
                     int64_t block);

}  // namespace ddplab::nn::batchnorm_detail
