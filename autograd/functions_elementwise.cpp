// Differentiable elementwise ops: arithmetic (with broadcasting), unary math, clamp, maximum/
// minimum, where, and the operators. Each backward is written beside its forward.
#include <utility>

#include "autograd/function_node.h"
#include "autograd/functions.h"

namespace ddplab {

using autograd::Grads;
using autograd::Needs;
using autograd::record;
using autograd::Saved;
using autograd::sum_to;

namespace {

// The gradient of a broadcast input: summed back to its shape, in its dtype (an op may have
// computed in a promoted dtype, e.g. float32 + float64).
Tensor reduce_grad(const Tensor& g, const Shape& shape, DType dtype) {
  Tensor r = sum_to(g, shape);
  return r.dtype() == dtype ? r : ops::to(r, dtype);
}

// The zero that where() masks with (broadcast by ops::where, so no full-size buffer).
Tensor zero_like_scalar(const Tensor& g) {
  return ops::scalar_tensor(0, g.options());
}

}  // namespace

// --- binary, tensor (op) tensor ---------------------------------------------------------------
//
// A backward closure names what it keeps: the operands' shapes and dtypes (for reduce_grad), never
// the operands themselves. Tensors it needs come through `saved` (record's fourth argument), which
// release_saved() frees after a backward without retain_graph; a tensor captured by the closure
// would live as long as the graph node (autograd/function_node.h).

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  return record("AddBackward", ops::add(a, b, alpha), {a, b}, {},
                [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype(), alpha](
                    const Tensor& g, const Saved&, const Needs& n) {
                  Grads r(2);
                  if (n[0]) r[0] = reduce_grad(g, sa, ta);
                  if (n[1]) r[1] = reduce_grad(alpha == 1 ? g : ops::mul(g, alpha), sb, tb);
                  return r;
                });
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  return add(a, b, -alpha);
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return record("MulBackward", ops::mul(a, b), {a, b}, {a, b},
                [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](
                    const Tensor& g, const Saved& s, const Needs& n) {
                  Grads r(2);
                  if (n[0]) r[0] = reduce_grad(ops::mul(g, s[1]), sa, ta);
                  if (n[1]) r[1] = reduce_grad(ops::mul(g, s[0]), sb, tb);
                  return r;
                });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = ops::div(a, b);
  // d(a/b)/db = -a/b^2 = -out/b, so saving out and b covers both inputs.
  return record("DivBackward", out, {a, b}, {b, out},
                [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](
                    const Tensor& g, const Saved& s, const Needs& n) {
                  Grads r(2);
                  Tensor g_over_b = ops::div(g, s[0]);
                  if (n[0]) r[0] = reduce_grad(g_over_b, sa, ta);
                  if (n[1]) r[1] = reduce_grad(ops::neg(ops::mul(g_over_b, s[1])), sb, tb);
                  return r;
                });
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = ops::pow(a, b);
  return record("PowBackward", out, {a, b}, {a, b, out},
                [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](
                    const Tensor& g, const Saved& s, const Needs& n) {
                  Grads r(2);
                  if (n[0]) {  // b * a^(b-1) * g
                    Tensor d = ops::mul(s[1], ops::pow(s[0], ops::sub(s[1], 1.0)));
                    r[0] = reduce_grad(ops::mul(g, d), sa, ta);
                  }
                  if (n[1]) {  // a^b * log(a) * g, with 0 where a == 0 (the limit for b > 0)
                    Tensor d = ops::mul(ops::mul(g, s[2]), ops::log(s[0]));
                    d = ops::where(ops::eq(s[0], 0.0), zero_like_scalar(d), d);
                    r[1] = reduce_grad(d, sb, tb);
                  }
                  return r;
                });
}

namespace {

// maximum and minimum share their backward: the operand that won an element gets its gradient,
// and ties split it in half (as PyTorch does).
Tensor record_extremum(const char* name, bool is_max, const Tensor& a, const Tensor& b,
                       Tensor out) {
  return record(name, std::move(out), {a, b}, {a, b},
                [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype(), is_max](
                    const Tensor& g, const Saved& s, const Needs& n) {
                  // Weight of a: 1 where a wins, 1/2 on ties, 0 elsewhere; b gets the rest.
                  Tensor a_wins = is_max ? ops::gt(s[0], s[1]) : ops::lt(s[0], s[1]);
                  Tensor wa = ops::add(ops::to(a_wins, g.dtype()),
                                       ops::to(ops::eq(s[0], s[1]), g.dtype()), 0.5);
                  Grads r(2);
                  if (n[0]) r[0] = reduce_grad(ops::mul(g, wa), sa, ta);
                  if (n[1]) r[1] = reduce_grad(ops::mul(g, ops::rsub(wa, 1.0)), sb, tb);
                  return r;
                });
}

}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  return record_extremum("MaximumBackward", true, a, b, ops::maximum(a, b));
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  return record_extremum("MinimumBackward", false, a, b, ops::minimum(a, b));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  // cond is saved, not an input: it has no gradient.
  return record("WhereBackward", ops::where(cond, a, b), {a, b}, {cond},
                [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](
                    const Tensor& g, const Saved& s, const Needs& n) {
                  Grads r(2);
                  Tensor z = zero_like_scalar(g);
                  if (n[0]) r[0] = reduce_grad(ops::where(s[0], g, z), sa, ta);
                  if (n[1]) r[1] = reduce_grad(ops::where(s[0], z, g), sb, tb);
                  return r;
                });
}

// --- tensor (op) scalar -------------------------------------------------------------------------

Tensor add(const Tensor& a, double s) {
  return record("AddBackward", ops::add(a, s), {a}, {},
                [](const Tensor& g, const Saved&, const Needs&) { return Grads{g}; });
}
Tensor sub(const Tensor& a, double s) {
  return add(a, -s);
}
Tensor mul(const Tensor& a, double s) {
  return record("MulBackward", ops::mul(a, s), {a}, {},
                [=](const Tensor& g, const Saved&, const Needs&) { return Grads{ops::mul(g, s)}; });
}
Tensor div(const Tensor& a, double s) {
  return record("DivBackward", ops::div(a, s), {a}, {},
                [=](const Tensor& g, const Saved&, const Needs&) { return Grads{ops::div(g, s)}; });
}
Tensor rsub(const Tensor& a, double s) {
  return record("RsubBackward", ops::rsub(a, s), {a}, {},
                [](const Tensor& g, const Saved&, const Needs&) { return Grads{ops::neg(g)}; });
}
Tensor rdiv(const Tensor& a, double s) {
  Tensor out = ops::mul(ops::reciprocal(a), s);
  // d(s/a)/da = -s/a^2 = -out/a
  return record("RdivBackward", out, {a}, {a, out},
                [](const Tensor& g, const Saved& sv, const Needs&) {
                  return Grads{ops::neg(ops::div(ops::mul(g, sv[1]), sv[0]))};
                });
}

// --- unary --------------------------------------------------------------------------------------

Tensor neg(const Tensor& t) {
  return record("NegBackward", ops::neg(t), {t}, {},
                [](const Tensor& g, const Saved&, const Needs&) { return Grads{ops::neg(g)}; });
}

Tensor exp(const Tensor& t) {
  Tensor y = ops::exp(t);
  return record("ExpBackward", y, {t}, {y}, [](const Tensor& g, const Saved& s, const Needs&) {
    return Grads{ops::mul(g, s[0])};
  });
}

Tensor log(const Tensor& t) {
  return record(
      "LogBackward", ops::log(t), {t}, {t},
      [](const Tensor& g, const Saved& s, const Needs&) { return Grads{ops::div(g, s[0])}; });
}

Tensor sqrt(const Tensor& t) {
  Tensor y = ops::sqrt(t);
  return record("SqrtBackward", y, {t}, {y}, [](const Tensor& g, const Saved& s, const Needs&) {
    return Grads{ops::div(ops::mul(g, 0.5), s[0])};  // g / (2 sqrt(x))
  });
}

Tensor rsqrt(const Tensor& t) {
  Tensor y = ops::rsqrt(t);
  return record("RsqrtBackward", y, {t}, {y}, [](const Tensor& g, const Saved& s, const Needs&) {
    // d(x^-1/2)/dx = -1/2 x^-3/2 = -1/2 y^3
    return Grads{ops::mul(ops::mul(g, ops::pow(s[0], 3.0)), -0.5)};
  });
}

Tensor pow(const Tensor& t, double exponent) {
  return record("PowBackward", ops::pow(t, exponent), {t}, {t},
                [=](const Tensor& g, const Saved& s, const Needs&) {
                  if (exponent == 0) return Grads{ops::zeros_like(g)};
                  Tensor d = ops::mul(ops::pow(s[0], exponent - 1), exponent);
                  return Grads{ops::mul(g, d)};
                });
}

Tensor square(const Tensor& t) {
  return record("SquareBackward", ops::square(t), {t}, {t},
                [](const Tensor& g, const Saved& s, const Needs&) {
                  return Grads{ops::mul(ops::mul(g, s[0]), 2.0)};
                });
}

Tensor abs(const Tensor& t) {
  return record("AbsBackward", ops::abs(t), {t}, {t},
                [](const Tensor& g, const Saved& s, const Needs&) {
                  return Grads{ops::mul(g, ops::sign(s[0]))};
                });
}

Tensor relu(const Tensor& t) {
  Tensor y = ops::relu(t);
  // Saving the output is enough (y > 0 exactly where x > 0) and lets x be freed.
  return record("ReluBackward", y, {t}, {y}, [](const Tensor& g, const Saved& s, const Needs&) {
    return Grads{ops::relu_backward(g, s[0])};
  });
}

Tensor sigmoid(const Tensor& t) {
  Tensor y = ops::sigmoid(t);
  return record("SigmoidBackward", y, {t}, {y}, [](const Tensor& g, const Saved& s, const Needs&) {
    return Grads{ops::sigmoid_backward(g, s[0])};
  });
}

Tensor tanh(const Tensor& t) {
  Tensor y = ops::tanh(t);
  return record("TanhBackward", y, {t}, {y}, [](const Tensor& g, const Saved& s, const Needs&) {
    return Grads{ops::tanh_backward(g, s[0])};
  });
}

Tensor clamp(const Tensor& t, std::optional<double> lo, std::optional<double> hi) {
  return record("ClampBackward", ops::clamp(t, lo, hi), {t}, {t},
                [=](const Tensor& g, const Saved& s, const Needs&) {
                  Tensor r = g;
                  Tensor z = zero_like_scalar(g);
                  if (lo) r = ops::where(ops::lt(s[0], *lo), z, r);
                  if (hi) r = ops::where(ops::gt(s[0], *hi), z, r);
                  return Grads{r};
                });
}

// --- operators ----------------------------------------------------------------------------------

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator+(const Tensor& a, double s) {
  return add(a, s);
}
Tensor operator-(const Tensor& a, double s) {
  return sub(a, s);
}
Tensor operator*(const Tensor& a, double s) {
  return mul(a, s);
}
Tensor operator/(const Tensor& a, double s) {
  return div(a, s);
}
Tensor operator+(double s, const Tensor& a) {
  return add(a, s);
}
Tensor operator-(double s, const Tensor& a) {
  return rsub(a, s);
}
Tensor operator*(double s, const Tensor& a) {
  return mul(a, s);
}
Tensor operator/(double s, const Tensor& a) {
  return rdiv(a, s);
}
Tensor operator-(const Tensor& a) {
  return neg(a);
}

}  // namespace ddplab
