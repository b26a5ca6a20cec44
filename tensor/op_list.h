// The lists of elementwise operations, as X-macros: X(EnumName, Functor).
//
// The op enums (tensor/backend.h), the CPU backend and the CUDA backend all expand these lists,
// so adding an op is one functor in tensor/functors.h plus one line here.
#pragma once

// Unary ops: out = f(x; a, b), with a and b op parameters (clamp bounds, a scalar operand).
#define DDPLAB_UNARY_OPS(X)   \
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
#define DDPLAB_BINARY_OPS(X)            \
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
#define DDPLAB_REDUCE_OPS(X) \
  X(Sum, SumReduce)          \
  X(Max, MaxReduce)          \
  X(Min, MinReduce)
