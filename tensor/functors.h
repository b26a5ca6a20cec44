// Every elementwise and reduction op, written once.
//
// Each functor is a DDP_HD struct that the CPU loops (tensor/cpu/) and the CUDA kernels
// (tensor/cuda/) both call, with C the compute type (float for float16/bfloat16 storage).
// Flags: kFloatOnly ops reject integer tensors; kPredicate ops write a bool tensor.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/macros.h"

namespace ddplab::functors {

// Math functions with float and double overloads that resolve the same on host and device.
namespace m {
DDP_HD float exp(float x) {
  return ::expf(x);
}
DDP_HD double exp(double x) {
  return ::exp(x);
}
DDP_HD float log(float x) {
  return ::logf(x);
}
DDP_HD double log(double x) {
  return ::log(x);
}
DDP_HD float sqrt(float x) {
  return ::sqrtf(x);
}
DDP_HD double sqrt(double x) {
  return ::sqrt(x);
}
DDP_HD float tanh(float x) {
  return ::tanhf(x);
}
DDP_HD double tanh(double x) {
  return ::tanh(x);
}
DDP_HD float pow(float x, float y) {
  return ::powf(x, y);
}
DDP_HD double pow(double x, double y) {
  return ::pow(x, y);
}
template <class C>
DDP_HD C pow(C x,
             C y) {  // integers: repeated squaring, negative exponents give 0 (as PyTorch for x>1)
  if (y < 0) return x == 1 ? C(1) : C(0);
  C r = 1;
  while (y > 0) {
    if (y & 1) r *= x;
    x *= x;
    y >>= 1;
  }
  return r;
}
template <class C>
DDP_HD bool isnan(C x) {
  return x != x;  // NOLINT(misc-redundant-expression): true only for NaN
}
}  // namespace m

struct Elementwise {
  static constexpr bool kFloatOnly = false;
  static constexpr bool kPredicate = false;
};
struct FloatOnly : Elementwise {
  static constexpr bool kFloatOnly = true;
};
struct Predicate : Elementwise {
  static constexpr bool kPredicate = true;
};

// ---- unary: apply(x, a, b) ----------------------------------------------------------------------
struct NegOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return -x;
  }
};
struct AbsOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return x < C(0) ? -x : x;
  }
};
struct ExpOp : FloatOnly {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return m::exp(x);
  }
};
struct LogOp : FloatOnly {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return m::log(x);
  }
};
struct SqrtOp : FloatOnly {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return m::sqrt(x);
  }
};
struct RsqrtOp : FloatOnly {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return C(1) / m::sqrt(x);
  }
};
struct ReluOp : Elementwise {
  // NaN stays NaN (x > 0 is false for NaN, so test the other way round).
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return x <= C(0) ? C(0) : x;
  }
};
struct SigmoidOp : FloatOnly {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return C(1) / (C(1) + m::exp(-x));
  }
};
struct TanhOp : FloatOnly {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return m::tanh(x);
  }
};
struct SignOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return C((C(0) < x) - (x < C(0)));
  }
};
struct ReciprocalOp : FloatOnly {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return C(1) / x;
  }
};
struct SquareOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C, C) {
    return x * x;
  }
};
struct ClampOp : Elementwise {  // NaN propagates, as in PyTorch
  template <class C>
  DDP_HD static C apply(C x, C lo, C hi) {
    return m::isnan(x) ? x : (x < lo ? lo : (x > hi ? hi : x));
  }
};
struct ClampMinOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C lo, C) {
    return m::isnan(x) ? x : (x < lo ? lo : x);
  }
};
struct ClampMaxOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C hi, C) {
    return m::isnan(x) ? x : (x > hi ? hi : x);
  }
};
struct PowScalarOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C e, C) {
    if constexpr (std::is_floating_point_v<C>) {
      if (e == C(2)) return x * x;  // exact, and what the gradients of squares need
      if (e == C(1)) return x;
    }
    return m::pow(x, e);
  }
};
struct AddScalarOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C s, C) {
    return x + s;
  }
};
struct MulScalarOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C s, C) {
    return x * s;
  }
};
struct DivScalarOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C s, C) {
    return x / s;
  }
};
struct RSubScalarOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C s, C) {
    return s - x;
  }
};
struct AffineOp : Elementwise {  // x * a + b
  template <class C>
  DDP_HD static C apply(C x, C a, C b) {
    return x * a + b;
  }
};
struct EqScalarOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C s, C) {
    return x == s;
  }
};
struct LtScalarOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C s, C) {
    return x < s;
  }
};
struct GtScalarOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C s, C) {
    return x > s;
  }
};
struct IsFiniteOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C, C) {
    if constexpr (std::is_floating_point_v<C>) {
      return x == x && x - x == C(0);  // false for NaN and for +-inf (inf - inf is NaN)
    } else {
      return true;
    }
  }
};

// ---- binary: apply(x, y, a, b) ------------------------------------------------------------------
struct AddOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C y, C alpha, C) {
    return x + alpha * y;
  }
};
struct SubOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C y, C alpha, C) {
    return x - alpha * y;
  }
};
struct MulOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C y, C, C) {
    return x * y;
  }
};
struct DivOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C y, C, C) {
    return x / y;
  }
};
struct PowOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C y, C, C) {
    return m::pow(x, y);
  }
};
struct MaximumOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C y, C, C) {
    return m::isnan(x) ? x : (m::isnan(y) ? y : (x > y ? x : y));
  }
};
struct MinimumOp : Elementwise {
  template <class C>
  DDP_HD static C apply(C x, C y, C, C) {
    return m::isnan(x) ? x : (m::isnan(y) ? y : (x < y ? x : y));
  }
};
struct AxpbyOp : Elementwise {  // x * beta + y * alpha
  template <class C>
  DDP_HD static C apply(C x, C y, C alpha, C beta) {
    return x * beta + y * alpha;
  }
};
struct EqOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C y, C, C) {
    return x == y;
  }
};
struct NeOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C y, C, C) {
    return x != y;
  }
};
struct LtOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C y, C, C) {
    return x < y;
  }
};
struct LeOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C y, C, C) {
    return x <= y;
  }
};
struct GtOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C y, C, C) {
    return x > y;
  }
};
struct GeOp : Predicate {
  template <class C>
  DDP_HD static bool apply(C x, C y, C, C) {
    return x >= y;
  }
};
struct ReluBackwardOp : Elementwise {  // x: grad, y: relu's input
  template <class C>
  DDP_HD static C apply(C g, C in, C, C) {
    return in > C(0) ? g : C(0);
  }
};
struct SigmoidBackwardOp : FloatOnly {  // y: sigmoid's output
  template <class C>
  DDP_HD static C apply(C g, C y, C, C) {
    return g * y * (C(1) - y);
  }
};
struct TanhBackwardOp : FloatOnly {  // y: tanh's output
  template <class C>
  DDP_HD static C apply(C g, C y, C, C) {
    return g * (C(1) - y * y);
  }
};

// ---- reductions: init() and an associative combine(), so any executor may split the work --------
struct SumReduce {
  template <class A>
  DDP_HD static A init() {
    return A(0);
  }
  template <class A>
  DDP_HD static A combine(A acc, A x) {
    return acc + x;
  }
};
struct MaxReduce {  // NaN wins, as in PyTorch
  template <class A>
  DDP_HD static A init() {
    if constexpr (std::is_floating_point_v<A>) return -std::numeric_limits<A>::infinity();
    return std::numeric_limits<A>::lowest();
  }
  template <class A>
  DDP_HD static A combine(A acc, A x) {
    return (m::isnan(acc) || acc >= x) && !m::isnan(x) ? acc : x;
  }
};
struct MinReduce {
  template <class A>
  DDP_HD static A init() {
    if constexpr (std::is_floating_point_v<A>) return std::numeric_limits<A>::infinity();
    return std::numeric_limits<A>::max();
  }
  template <class A>
  DDP_HD static A combine(A acc, A x) {
    return (m::isnan(acc) || acc <= x) && !m::isnan(x) ? acc : x;
  }
};

// The accumulator a reduction uses: sums of floats accumulate in double on the CPU (the GPU uses
// a tree of float partial sums, which is accurate for the same reason), integers in int64.
template <class Reduce, class C, bool kDevice>
struct reduce_acc {
  using type =
      std::conditional_t<!std::is_same_v<Reduce, SumReduce>, C,
                         std::conditional_t<std::is_floating_point_v<C>,
                                            std::conditional_t<kDevice, C, double>, long long>>;
};

}  // namespace ddplab::functors
