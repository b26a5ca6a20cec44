// The simple layers of nn/functional.h: linear, relu, dropout.
//
// (Convolution lives in nn/conv.cpp, batch norm in nn/batchnorm_kernels.cpp, pooling in
// nn/pooling.cpp, log_softmax and the losses in nn/loss.cpp.)
#include "nn/functional.h"

#include "autograd/function_node.h"
#include "autograd/functions.h"
#include "nn/autocast.h"
#include "nn/functional_util.h"
#include "tensor/blocked.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

namespace ddplab::nn::functional {

// y = x @ w^T + b. The input's leading dims are flattened into rows so that one GEMM serves any
// rank; w is used transposed by the GEMM's flag, never copied.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  DDP_CHECK(x.defined() && w.defined(), "linear: input and weight must be defined");
  DDP_CHECK(w.dim() == 2, "linear: expected a 2-D weight [out, in], got shape "
                              << shape_str(w.shape()) << " (input " << shape_str(x.shape()) << ")");
  DDP_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1),
            "linear: input " << shape_str(x.shape()) << " does not match weight "
                             << shape_str(w.shape()) << ": the input's last dim must equal "
                             << w.size(1) << " (weight.size(1))");
  // Under autocast a bfloat16 activation meets the float32 master weights (Note [Autocast]).
  const std::optional<DType> amp = amp::autocast_dtype_for(x);
  DDP_CHECK(x.dtype() == w.dtype() || (amp && w.dtype() == kFloat32),
            "linear: input " << shape_str(x.shape()) << " is " << dtype_name(x.dtype())
                             << " but weight " << shape_str(w.shape()) << " is "
                             << dtype_name(w.dtype()));
  DDP_CHECK(x.device() == w.device(),
            "linear: input is on " << x.device() << " but weight on " << w.device());
  const int64_t in = w.size(1), out = w.size(0);
  if (b.defined()) {
    DDP_CHECK(b.dim() == 1 && b.size(0) == out,
              "linear: bias " << shape_str(b.shape()) << " does not match weight "
                              << shape_str(w.shape()) << " (expected [" << out << "])");
    DDP_CHECK(b.dtype() == w.dtype() && b.device() == x.device(),
              "linear: bias must have the weight's dtype and the input's device");
  }
  // Under autocast the input and weight enter the GEMM in bfloat16 (float32 ones as bfloat16
  // copies) and the output is float32, the weight's dtype (Note [Autocast] in nn/autocast.h).
  const DType operand_dtype = amp.value_or(x.dtype());
  Tensor x2 = ops::contiguous(ops::to(ops::reshape(x, {-1, in}), operand_dtype));
  Tensor wc = ops::contiguous(ops::to(w, operand_dtype));
  const int64_t rows = x2.size(0);
  Tensor y = ops::empty({rows, out}, w.options());
  if (b.defined()) {
    ops::copy_(y, b);  // broadcast each row, then accumulate the product onto it (beta = 1)
    ops::gemm_(y, x2, wc, false, true, 1, 1);
  } else {
    ops::gemm_(y, x2, wc, false, true, 1, 0);
  }
  Shape out_shape = x.shape();
  out_shape.back() = out;
  y = ops::reshape(y, out_shape);

  std::vector<Tensor> inputs{x, w};
  if (b.defined()) inputs.push_back(b);
  if (!autograd::needs_grad(inputs)) return y;
  const Shape& x_shape = x.shape();
  const DType x_dtype = x.dtype();
  return autograd::record("AddmmBackward", y, inputs, {x2, wc},
                          [x_shape, x_dtype, in, out](const Tensor& grad, const autograd::Saved& s,
                                                      const autograd::Needs& needs) {
                            Tensor g2 = ops::contiguous(ops::reshape(grad, {-1, out}));
                            // The products read the gradient in the operands' dtype (bfloat16
                            // under autocast) and write the output gradient's (float32).
                            Tensor g2_op = ops::to(g2, s[0].dtype());
                            autograd::Grads g(needs.size());
                            if (needs[0]) {  // dx [rows, in] = g [rows, out] @ w [out, in]
                              Tensor gx = ops::empty({g2.size(0), in}, g2.options());
                              ops::gemm_(gx, g2_op, s[1], false, false);
                              // In x's dtype (bfloat16 for an autocast activation).
                              g[0] = ops::reshape(ops::to(gx, x_dtype), x_shape);
                            }
                            if (needs[1]) {  // dw [out, in] = g^T [out, rows] @ x [rows, in]
                              g[1] = ops::empty({out, in}, g2.options());
                              ops::gemm_(g[1], g2_op, s[0], true, false);
                            }
                            if (needs.size() > 2 && needs[2]) g[2] = ops::sum(g2, {0});
                            return g;
                          });
}

namespace {

// relu's gradient for bfloat16 y: dx = dy where y > 0, else 0 (ReluBackwardOp's rule; NaN in y
// counts as not > 0). y > 0 exactly when y's bits are 0x0001-0x7f80 (positive, not zero, not
// NaN): a mask on the bits keeps the loop free of branches (a branch on the sign of random data
// mispredicts half the time) and of float conversions, so the compiler vectorizes it.
DDP_CPU_CLONES void relu_grad_bf16(const BFloat16* dy, const BFloat16* y, BFloat16* dx, int64_t n) {
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t keep = static_cast<uint16_t>(y[i].x - 1u) < 0x7f80u ? 0xffffu : 0u;
    dx[i] = BFloat16::from_bits(static_cast<uint16_t>(dy[i].x & keep));
  }
}

// relu's gradient from its output y, in y's dtype (a float32 consumer of a bfloat16 activation
// sends a float32 gradient). ops::relu_backward serves every dtype; bfloat16 on the CPU gets the
// kernel above instead, since the generic loop converts each element to float and back.
// dy is made dense in y's memory format, so both walk as flat arrays (Note [Channels last]).
Tensor relu_grad(const Tensor& grad, const Tensor& y) {
  const ops::MemoryFormat format = ops::suggest_memory_format(y);
  Tensor dy = ops::contiguous(ops::to(grad, y.dtype()), format);
  // A blocked y (Note [Blocked activations] in tensor/blocked.cpp): dy in its layout too, so the
  // elementwise op below walks both as they lie.
  if (const int64_t block = ops::blocked_block(y); block != 0 && dy.shape() == y.shape()) {
    dy = ops::to_blocked(dy, block);
  }
  if (y.dtype() != kBFloat16 || y.is_cuda() || !ops::is_contiguous(y, format) ||
      dy.shape() != y.shape()) {
    return ops::relu_backward(dy, y);
  }
  Tensor dx = ops::empty(y.shape(), y.options(), format);
  relu_grad_bf16(dy.data_ptr<BFloat16>(), y.data_ptr<BFloat16>(), dx.data_ptr<BFloat16>(),
                 y.numel());
  return dx;
}

}  // namespace

Tensor relu(const Tensor& x) {
  Tensor y = ops::relu(x);
  if (!autograd::needs_grad({x})) return y;
  // Saving the output is enough (y > 0 exactly where x > 0) and keeps no extra tensor alive
  // when the next layer saves y anyway.
  return autograd::record("ReluBackward", y, {x}, {y},
                          [](const Tensor& grad, const autograd::Saved& s, const autograd::Needs&) {
                            return autograd::Grads{relu_grad(grad, s[0])};
                          });
}

namespace {

// y = relu(a + b), the sum rounded to T first exactly as ops::add rounds it (bfloat16: added in
// float, then rounded), then clamped as ops::relu clamps (NaN stays NaN).
template <class T>
DDP_CPU_CLONES void add_relu_kernel(const T* a, const T* b, T* y, int64_t n) {
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    const T v = a[i] + b[i];
    y[i] = v <= T(0) ? T(0) : v;
  }
}

}  // namespace

Tensor add_relu(const Tensor& a, const Tensor& b) {
  DDP_CHECK(a.defined() && b.defined(), "add_relu: both inputs must be defined");
  const bool fusable = a.shape() == b.shape() && a.dtype() == b.dtype() &&
                       a.device() == b.device() && !a.is_cuda() &&
                       (a.dtype() == kFloat32 || a.dtype() == kFloat64 || a.dtype() == kBFloat16);
  if (!fusable)
    return functional::relu(a + b);  // broadcasting, promotion, other devices: the two ops
  // One flat loop over dense arrays in a's memory format (b is copied into it if it differs),
  // or a's blocked layout (Note [Blocked activations] in tensor/blocked.cpp; y blocked too).
  const ops::MemoryFormat format = ops::suggest_memory_format(a);
  Tensor ac = ops::contiguous(a, format), bc = ops::contiguous(b, format);
  const int64_t block = ops::blocked_block(ac);
  if (block != 0) bc = ops::to_blocked(bc, block);
  Tensor y = ops::empty_in_layout(a.shape(), a.options(), block, format);
  DDP_NN_DISPATCH_BF16(a.dtype(), "add_relu",
                       add_relu_kernel(ops::in_layout(ac, block).data_ptr<scalar_t>(),
                                       ops::in_layout(bc, block).data_ptr<scalar_t>(),
                                       ops::in_layout(y, block).data_ptr<scalar_t>(), a.numel()));
  if (!autograd::needs_grad({a, b})) return y;
  // d(a + b)/da = d(a + b)/db = 1: both inputs get relu's masked gradient, one tensor for both.
  return autograd::record("AddReluBackward", y, {a, b}, {y},
                          [](const Tensor& grad, const autograd::Saved& s, const autograd::Needs&) {
                            Tensor g = relu_grad(grad, s[0]);
                            return autograd::Grads{g, g};
                          });
}

// Inverted dropout (as PyTorch): kept elements are scaled by 1/(1-p) in training, so eval is the
// identity. The mask comes from ops::bernoulli_ (Philox): a generator with a fixed seed gives
// the same mask on any thread count and on the GPU.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  DDP_CHECK(p >= 0 && p <= 1, "dropout: probability must be in [0, 1], got " << p);
  if (!training || p == 0) return x;
  Tensor mask = ops::empty(x.shape(), x.options());
  if (p == 1) {
    ops::zero_(mask);
  } else {
    ops::bernoulli_(mask, 1 - p, gen);
    ops::mul_(mask, 1 / (1 - p));
  }
  Tensor y = ops::mul(x, mask);
  if (!autograd::needs_grad({x})) return y;
  return autograd::record("DropoutBackward", y, {x}, {mask},
                          [](const Tensor& grad, const autograd::Saved& s, const autograd::Needs&) {
                            return autograd::Grads{ops::mul(grad, s[0])};
                          });
}

}  // namespace ddplab::nn::functional
