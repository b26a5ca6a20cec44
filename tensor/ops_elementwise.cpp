// Elementwise ops: type promotion, broadcasting, then one backend call per op.
#include <initializer_list>

#include "tensor/backend.h"
#include "tensor/blocked.h"
#include "tensor/functors.h"
#include "tensor/ops.h"

namespace ddplab::ops {

namespace {

// The functors' flags, indexed by op.
#define DDP_FLOAT_ONLY(name, functor) functors::functor::kFloatOnly,
#define DDP_PREDICATE(name, functor) functors::functor::kPredicate,
#define DDP_NAME(name, functor) #name,
constexpr bool kUnaryFloatOnly[] = {DDP_UNARY_OPS(DDP_FLOAT_ONLY)};
constexpr bool kUnaryPredicate[] = {DDP_UNARY_OPS(DDP_PREDICATE)};
constexpr const char* kUnaryName[] = {DDP_UNARY_OPS(DDP_NAME)};
constexpr bool kBinaryFloatOnly[] = {DDP_BINARY_OPS(DDP_FLOAT_ONLY)};
constexpr bool kBinaryPredicate[] = {DDP_BINARY_OPS(DDP_PREDICATE)};
constexpr const char* kBinaryName[] = {DDP_BINARY_OPS(DDP_NAME)};
#undef DDP_FLOAT_ONLY
#undef DDP_PREDICATE
#undef DDP_NAME

// Integer inputs to float-only ops compute in float32 (exp of an int tensor is a float tensor).
DType compute_dtype(DType t, bool float_only) {
  return float_only && !is_floating(t) ? kFloat32 : t;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DDP_CHECK(da == db || da == 1 || db == 1, what << ": shapes " << shape_str(a) << " and "
                                                   << shape_str(b) << " cannot be broadcast (dim "
                                                   << i << ": " << da << " vs " << db << ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

void check_same_device(const Tensor& a, const Tensor& b, const char* what) {
  DDP_CHECK(a.device() == b.device(), what << ": expected tensors on one device, got " << a.device()
                                           << " (shape " << shape_str(a.shape()) << ") and "
                                           << b.device() << " (shape " << shape_str(b.shape())
                                           << ")");
}

// Whether tensors of one shape and dtype, all blocked alike (Note [Blocked activations] in
// tensor/blocked.cpp), can be walked as they lie: an elementwise op pairs the i-th value of each
// flat array, and the blocked order is the same permutation of every one of them. Returns the
// block size, or 0.
int64_t common_block(std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  const int64_t block = blocked_block(first);
  if (block == 0) return 0;
  for (const Tensor* t : ts) {
    if (t->shape() != first.shape() || t->dtype() != first.dtype() || blocked_block(*t) != block) {
      return 0;
    }
  }
  return block;
}

Tensor unary_out(UnaryOp op, const Tensor& t, double a = 0, double b = 0) {
  int i = static_cast<int>(op);
  DDP_CHECK(t.dtype() != kBool || kUnaryPredicate[i],
            kUnaryName[i] << ": not supported for bool tensors");
  if (const int64_t block = common_block({&t});
      block != 0 && compute_dtype(t.dtype(), kUnaryFloatOnly[i]) == t.dtype()) {
    Tensor out =
        empty_blocked(t.shape(), {kUnaryPredicate[i] ? kBool : t.dtype(), t.device()}, block);
    backend_for(t.device()).unary(op, as_stored(out), as_stored(t), a, b);
    return out;
  }
  Tensor in = to(t, compute_dtype(t.dtype(), kUnaryFloatOnly[i]));
  Tensor out = empty(t.shape(), {kUnaryPredicate[i] ? kBool : in.dtype(), t.device()},
                     suggest_memory_format(t));
  backend_for(t.device()).unary(op, out, in, a, b);
  return out;
}

void unary_inplace(UnaryOp op, const Tensor& t, double a = 0, double b = 0) {
  int i = static_cast<int>(op);
  DDP_CHECK(!kUnaryFloatOnly[i] || is_floating(t.dtype()),
            kUnaryName[i] << "_: in-place op needs a floating tensor, got " << t.dtype());
  if (common_block({&t}) != 0) {
    backend_for(t.device()).unary(op, as_stored(t), as_stored(t), a, b);
    return;
  }
  backend_for(t.device()).unary(op, t, t, a, b);
}

// A binary op's result is channels-last when an operand of the result's full shape is (and the
// other is too, or is broadcast): then all operands walk as flat arrays (Note [Channels last]).
MemoryFormat result_format(const Tensor& x, const Tensor& y) {
  const MemoryFormat fx = suggest_memory_format(x), fy = suggest_memory_format(y);
  if (x.shape() == y.shape()) return fx == fy ? fx : MemoryFormat::Contiguous;
  if (x.numel() > y.numel()) return fx;
  return y.numel() > x.numel() ? fy : MemoryFormat::Contiguous;
}

Tensor binary_out(BinaryOp op, const Tensor& x, const Tensor& y, double alpha = 1,
                  double beta = 0) {
  int i = static_cast<int>(op);
  check_same_device(x, y, kBinaryName[i]);
  Shape shape = broadcast_shapes(x.shape(), y.shape(), kBinaryName[i]);
  DType dt = compute_dtype(promote_types(x.dtype(), y.dtype()), kBinaryFloatOnly[i]);
  if (dt == kBool) dt = kUInt8;  // arithmetic on bools computes in uint8
  if (const int64_t block = common_block({&x, &y}); block != 0 && dt == x.dtype()) {
    Tensor out = empty_blocked(shape, {kBinaryPredicate[i] ? kBool : dt, x.device()}, block);
    backend_for(x.device()).binary(op, as_stored(out), as_stored(x), as_stored(y), alpha, beta);
    return out;
  }
  Tensor xs = expand(to(x, dt), shape), ys = expand(to(y, dt), shape);
  Tensor out = empty(shape, {kBinaryPredicate[i] ? kBool : dt, x.device()}, result_format(x, y));
  backend_for(x.device()).binary(op, out, xs, ys, alpha, beta);
  return out;
}

void binary_inplace(BinaryOp op, const Tensor& t, const Tensor& other, double alpha = 1,
                    double beta = 0) {
  int i = static_cast<int>(op);
  check_same_device(t, other, kBinaryName[i]);
  Shape shape = broadcast_shapes(t.shape(), other.shape(), kBinaryName[i]);
  DDP_CHECK(shape == t.shape(), kBinaryName[i] << "_: result of shape " << shape_str(shape)
                                               << " does not fit the in-place target of shape "
                                               << shape_str(t.shape()));
  DDP_CHECK(!kBinaryFloatOnly[i] || is_floating(t.dtype()),
            kBinaryName[i] << "_: in-place op needs a floating tensor, got " << t.dtype());
  if (common_block({&t, &other}) != 0) {
    backend_for(t.device()).binary(op, as_stored(t), as_stored(t), as_stored(other), alpha, beta);
    return;
  }
  backend_for(t.device()).binary(op, t, t, expand(to(other, t.dtype()), shape), alpha, beta);
}

}  // namespace

Tensor neg(const Tensor& t) {
  return unary_out(UnaryOp::Neg, t);
}
Tensor abs(const Tensor& t) {
  return unary_out(UnaryOp::Abs, t);
}
Tensor exp(const Tensor& t) {
  return unary_out(UnaryOp::Exp, t);
}
Tensor log(const Tensor& t) {
  return unary_out(UnaryOp::Log, t);
}
Tensor sqrt(const Tensor& t) {
  return unary_out(UnaryOp::Sqrt, t);
}
Tensor rsqrt(const Tensor& t) {
  return unary_out(UnaryOp::Rsqrt, t);
}
Tensor relu(const Tensor& t) {
  return unary_out(UnaryOp::Relu, t);
}
Tensor sigmoid(const Tensor& t) {
  return unary_out(UnaryOp::Sigmoid, t);
}
Tensor tanh(const Tensor& t) {
  return unary_out(UnaryOp::Tanh, t);
}
Tensor sign(const Tensor& t) {
  return unary_out(UnaryOp::Sign, t);
}
Tensor reciprocal(const Tensor& t) {
  return unary_out(UnaryOp::Reciprocal, t);
}
Tensor square(const Tensor& t) {
  return unary_out(UnaryOp::Square, t);
}
Tensor pow(const Tensor& t, double e) {
  return unary_out(UnaryOp::PowScalar, t, e);
}
Tensor add(const Tensor& t, double s) {
  return unary_out(UnaryOp::AddScalar, t, s);
}
Tensor sub(const Tensor& t, double s) {
  return unary_out(UnaryOp::AddScalar, t, -s);
}
Tensor mul(const Tensor& t, double s) {
  return unary_out(UnaryOp::MulScalar, t, s);
}
Tensor div(const Tensor& t, double s) {
  return unary_out(UnaryOp::DivScalar, t, s);
}
Tensor rsub(const Tensor& t, double s) {
  return unary_out(UnaryOp::RSubScalar, t, s);
}
Tensor isfinite(const Tensor& t) {
  return unary_out(UnaryOp::IsFinite, t);
}
Tensor eq(const Tensor& a, double b) {
  return unary_out(UnaryOp::EqScalar, a, b);
}
Tensor lt(const Tensor& a, double b) {
  return unary_out(UnaryOp::LtScalar, a, b);
}
Tensor gt(const Tensor& a, double b) {
  return unary_out(UnaryOp::GtScalar, a, b);
}

Tensor clamp(const Tensor& t, std::optional<double> lo, std::optional<double> hi) {
  DDP_CHECK(lo || hi, "clamp: at least one of min and max must be given");
  if (lo && hi) return unary_out(UnaryOp::Clamp, t, *lo, *hi);
  return lo ? unary_out(UnaryOp::ClampMin, t, *lo) : unary_out(UnaryOp::ClampMax, t, *hi);
}

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  return binary_out(BinaryOp::Add, a, b, alpha);
}
Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  return binary_out(BinaryOp::Sub, a, b, alpha);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Mul, a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Div, a, b);
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Pow, a, b);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Maximum, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Minimum, a, b);
}
Tensor eq(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Eq, a, b);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Ne, a, b);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Lt, a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Le, a, b);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Gt, a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Ge, a, b);
}
Tensor relu_backward(const Tensor& g, const Tensor& x) {
  return binary_out(BinaryOp::ReluBackward, g, x);
}
Tensor sigmoid_backward(const Tensor& g, const Tensor& y) {
  return binary_out(BinaryOp::SigmoidBackward, g, y);
}
Tensor tanh_backward(const Tensor& g, const Tensor& y) {
  return binary_out(BinaryOp::TanhBackward, g, y);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_device(cond, a, "where");
  check_same_device(a, b, "where");
  Shape shape =
      broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  DType dt = promote_types(a.dtype(), b.dtype());
  Tensor out = empty(shape, {dt, a.device()});
  backend_for(a.device())
      .where(out, expand(to(cond, kBool), shape), expand(to(a, dt), shape),
             expand(to(b, dt), shape));
  return out;
}

void neg_(const Tensor& t) {
  unary_inplace(UnaryOp::Neg, t);
}
void exp_(const Tensor& t) {
  unary_inplace(UnaryOp::Exp, t);
}
void log_(const Tensor& t) {
  unary_inplace(UnaryOp::Log, t);
}
void sqrt_(const Tensor& t) {
  unary_inplace(UnaryOp::Sqrt, t);
}
void relu_(const Tensor& t) {
  unary_inplace(UnaryOp::Relu, t);
}
void sigmoid_(const Tensor& t) {
  unary_inplace(UnaryOp::Sigmoid, t);
}
void tanh_(const Tensor& t) {
  unary_inplace(UnaryOp::Tanh, t);
}
void add_(const Tensor& t, double s) {
  unary_inplace(UnaryOp::AddScalar, t, s);
}
void mul_(const Tensor& t, double s) {
  unary_inplace(UnaryOp::MulScalar, t, s);
}
void clamp_(const Tensor& t, std::optional<double> lo, std::optional<double> hi) {
  DDP_CHECK(lo || hi, "clamp_: at least one of min and max must be given");
  if (lo && hi) return unary_inplace(UnaryOp::Clamp, t, *lo, *hi);
  if (lo) return unary_inplace(UnaryOp::ClampMin, t, *lo);
  unary_inplace(UnaryOp::ClampMax, t, *hi);
}
void add_(const Tensor& t, const Tensor& o, double alpha) {
  binary_inplace(BinaryOp::Add, t, o, alpha);
}
void sub_(const Tensor& t, const Tensor& o, double alpha) {
  binary_inplace(BinaryOp::Sub, t, o, alpha);
}
void mul_(const Tensor& t, const Tensor& o) {
  binary_inplace(BinaryOp::Mul, t, o);
}
void div_(const Tensor& t, const Tensor& o) {
  binary_inplace(BinaryOp::Div, t, o);
}
void axpby_(const Tensor& t, double beta, const Tensor& o, double alpha) {
  binary_inplace(BinaryOp::Axpby, t, o, alpha, beta);
}
void mul_out(const Tensor& out, const Tensor& t, double s) {
  check_same_device(out, t, "mul_out");
  DDP_CHECK(out.shape() == t.shape(), "mul_out: input of shape " << shape_str(t.shape())
                                                                 << " for an output of shape "
                                                                 << shape_str(out.shape()));
  DDP_CHECK(is_floating(out.dtype()), "mul_out: needs a floating output, got " << out.dtype());
  backend_for(out.device()).unary(UnaryOp::MulScalar, out, to(t, out.dtype()), s, 0);
}

}  // namespace ddplab::ops
