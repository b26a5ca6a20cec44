// The lists of elementwise operations, as X-macros: X(EnumName, Functor).
//
// The op enums (tensor/backend.h), the op names and flags (tensor/ops_elementwise.cpp), the CPU
// backend and the CUDA backend all expand these lists, so no executor needs editing for a new
// op. Adding an elementwise op (sigmoid, say) still takes these steps:
//   1. the functor, in tensor/functors.h (SigmoidOp);
//   2. its line here: X(Sigmoid, SigmoidOp);
//   3. the raw op: a declaration in tensor/ops.h (ops::sigmoid, and ops::sigmoid_ if it has an
//      in-place form) and a wrapper in tensor/ops_elementwise.cpp calling unary_out / unary_inplace
//      (binary ops: binary_out; a reduction: a wrapper in tensor/ops_reduce.cpp);
//   4. if it is differentiable: the autograd function, declared in autograd/functions.h and
//      defined in autograd/functions_*.cpp (forward through ops::, backward as a lambda; a new
//      backward formula may itself need an op, as SigmoidBackward is);
//   5. tests: the value against a double reference in tests/tensor/ (test_elementwise.cpp,
//      test_reduce.cpp), and the gradient in tests/autograd/test_gradcheck.cpp.
#pragma once

// Unary ops: out = f(x; a, b), with a and b op parameters (clamp bounds, a scalar operand).
#define DDP_UNARY_OPS(X)      \
  X(Neg, NegOp)               \
  X(Abs, AbsOp)               \
  X(Exp, ExpOp)               \
  X(Log, LogOp)               \
  X(Sqrt, SqrtOp)             \
  X(Rsqrt, RsqrtOp)           \
  X(Relu, ReluOp)             \
  X(Sigmoid, SigmoidOp)       \
  X(Tanh, TanhOp)             \
  X(Sign, SignOp)             \
  X(Reciprocal, ReciprocalOp) \
  X(Square, SquareOp)         \
  X(Clamp, ClampOp)           \
  X(ClampMin, ClampMinOp)     \
  X(ClampMax, ClampMaxOp)     \
  X(PowScalar, PowScalarOp)   \
  X(AddScalar, AddScalarOp)   \
  X(MulScalar, MulScalarOp)   \
  X(DivScalar, DivScalarOp)   \
  X(RSubScalar, RSubScalarOp) \
  X(Affine, AffineOp)         \
  X(EqScalar, EqScalarOp)     \
  X(LtScalar, LtScalarOp)     \
  X(GtScalar, GtScalarOp)     \
  X(IsFinite, IsFiniteOp)

// Binary ops: out = f(x, y; alpha).
#define DDP_BINARY_OPS(X)               \
  X(Add, AddOp)                         \
  X(Sub, SubOp)                         \
  X(Mul, MulOp)                         \
  X(Div, DivOp)                         \
  X(Pow, PowOp)                         \
  X(Maximum, MaximumOp)                 \
  X(Minimum, MinimumOp)                 \
  X(Axpby, AxpbyOp)                     \
  X(Eq, EqOp)                           \
  X(Ne, NeOp)                           \
  X(Lt, LtOp)                           \
  X(Le, LeOp)                           \
  X(Gt, GtOp)                           \
  X(Ge, GeOp)                           \
  X(ReluBackward, ReluBackwardOp)       \
  X(SigmoidBackward, SigmoidBackwardOp) \
  X(TanhBackward, TanhBackwardOp)

// Reductions over the last axis of a [rows, cols] view.
#define DDP_REDUCE_OPS(X) \
  X(Sum, SumReduce)       \
  X(Max, MaxReduce)       \
  X(Min, MinReduce)
