// Elementwise kernels: unary and binary ops, where, copy (with dtype conversion) and fill.
//
// The op enums are expanded from tensor/op_list.h into switch statements, each case naming the
// functor of tensor/functors.h that the kernel calls; nothing here knows what "exp" or "add" is.
// The generic functors are also instantiated for unsigned and bool tensors, where tests such as
// `x < 0` are always false: correct, and not worth a warning per instantiation.
#pragma nv_diag_suppress 186

#include <type_traits>

#include "tensor/cuda/cuda_kernels.h"
#include "tensor/cuda/cuda_loops.cuh"
#include "tensor/functors.h"

namespace ddplab::gpu {

namespace {

// ---- loops: one element each
// ----------------------------------------------------------------------

template <class F, class T, class Out, class Ix>
struct UnaryLoop {
  using C = compute_t<T>;
  Out* out;
  const T* in;
  C a, b;
  Ix ix;
  __device__ void operator()(int64_t i) const {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[0]] = static_cast<Out>(F::apply(static_cast<C>(in[off[1]]), a, b));
  }
};

template <class F, class T, class Out, class Ix>
struct BinaryLoop {
  using C = compute_t<T>;
  Out* out;
  const T* x;
  const T* y;
  C alpha, beta;
  Ix ix;
  __device__ void operator()(int64_t i) const {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = static_cast<Out>(
        F::apply(static_cast<C>(x[off[1]]), static_cast<C>(y[off[2]]), alpha, beta));
  }
};

template <class T, class Ix>
struct WhereLoop {
  T* out;
  const bool* cond;
  const T* a;
  const T* b;
  Ix ix;
  __device__ void operator()(int64_t i) const {
    int64_t off[4];
    ix.offsets(i, off);
    out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
};

// The source type is static, the destination's dtype a runtime switch (see store_as).
template <class S, class Ix>
struct CopyLoop {
  void* dst;
  DType dst_dtype;
  const S* src;
  Ix ix;
  __device__ void operator()(int64_t i) const {
    int64_t off[2];
    ix.offsets(i, off);
    store_as(dst, dst_dtype, off[0], src[off[1]]);
  }
};

template <class T, class Ix>
struct FillLoop {
  T* out;
  T value;
  Ix ix;
  __device__ void operator()(int64_t i) const {
    int64_t off[1];
    ix.offsets(i, off);
    out[off[0]] = value;
  }
};

// ---- typed launchers
// -----------------------------------------------------------------------------

// C(value) for an op parameter, converted the way the CPU converts it.
template <class C>
C param(double v) {
  return static_cast<C>(v);
}

template <class F, class T>
void unary_typed(int device, const Tensor& out, const Tensor& in, double a, double b) {
  using C = compute_t<T>;
  if constexpr (F::kFloatOnly && !std::is_floating_point_v<C>) {
    DDP_FAIL("this op needs a floating tensor, got " << dtype_name(in.dtype()));
  } else {
    using Out = std::conditional_t<F::kPredicate, bool, T>;
    DDP_CHECK(out.dtype() == dtype_of<Out>::value, "unary: output dtype "
                                                       << dtype_name(out.dtype()) << ", expected "
                                                       << dtype_name(dtype_of<Out>::value));
    auto* o = static_cast<Out*>(out.raw_data());
    const auto* x = static_cast<const T*>(in.raw_data());
    launch_strided<2>(device, {&out, &in}, out.numel(), [&](auto ix) {
      return UnaryLoop<F, T, Out, decltype(ix)>{o, x, param<C>(a), param<C>(b), ix};
    });
  }
}

template <class F, class T>
void binary_typed(int device, const Tensor& out, const Tensor& x, const Tensor& y, double alpha,
                  double beta) {
  using C = compute_t<T>;
  if constexpr (F::kFloatOnly && !std::is_floating_point_v<C>) {
    DDP_FAIL("this op needs floating tensors, got " << dtype_name(x.dtype()));
  } else {
    using Out = std::conditional_t<F::kPredicate, bool, T>;
    DDP_CHECK(out.dtype() == dtype_of<Out>::value && y.dtype() == x.dtype(),
              "binary: dtypes " << dtype_name(out.dtype()) << " = f(" << dtype_name(x.dtype())
                                << ", " << dtype_name(y.dtype()) << ") do not match");
    auto* o = static_cast<Out*>(out.raw_data());
    const auto* px = static_cast<const T*>(x.raw_data());
    const auto* py = static_cast<const T*>(y.raw_data());
    launch_strided<3>(device, {&out, &x, &y}, out.numel(), [&](auto ix) {
      return BinaryLoop<F, T, Out, decltype(ix)>{o, px, py, param<C>(alpha), param<C>(beta), ix};
    });
  }
}

template <class F>
void unary_op(int device, const Tensor& out, const Tensor& in, double a, double b) {
  DDP_DISPATCH_NUMERIC(in.dtype(), "unary", unary_typed<F, scalar_t>(device, out, in, a, b));
}

template <class F>
void binary_op(int device, const Tensor& out, const Tensor& x, const Tensor& y, double alpha,
               double beta) {
  DDP_DISPATCH_NUMERIC(x.dtype(), "binary",
                       binary_typed<F, scalar_t>(device, out, x, y, alpha, beta));
}

}  // namespace

void unary(int device, UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) {
  switch (op) {
#define DDP_UNARY_CASE(name, functor)                   \
  case UnaryOp::name:                                   \
    unary_op<functors::functor>(device, out, in, a, b); \
    return;
    DDP_UNARY_OPS(DDP_UNARY_CASE)
#undef DDP_UNARY_CASE
  }
  DDP_FAIL("unary: unknown op " << static_cast<int>(op));
}

void binary(int device, BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y,
            double alpha, double beta) {
  switch (op) {
#define DDP_BINARY_CASE(name, functor)                            \
  case BinaryOp::name:                                            \
    binary_op<functors::functor>(device, out, x, y, alpha, beta); \
    return;
    DDP_BINARY_OPS(DDP_BINARY_CASE)
#undef DDP_BINARY_CASE
  }
  DDP_FAIL("binary: unknown op " << static_cast<int>(op));
}

void where(int device, const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  DDP_CHECK(cond.dtype() == kBool,
            "where: condition must be bool, got " << dtype_name(cond.dtype()));
  DDP_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(),
            "where: branches must have the output's dtype");
  DDP_DISPATCH_ALL(out.dtype(), "where", {
    auto* o = static_cast<scalar_t*>(out.raw_data());
    const auto* c = static_cast<const bool*>(cond.raw_data());
    const auto* pa = static_cast<const scalar_t*>(a.raw_data());
    const auto* pb = static_cast<const scalar_t*>(b.raw_data());
    launch_strided<4>(device, {&out, &cond, &a, &b}, out.numel(), [&](auto ix) {
      return WhereLoop<scalar_t, decltype(ix)>{o, c, pa, pb, ix};
    });
  });
}

void copy(int device, const Tensor& dst, const Tensor& src) {
  DDP_DISPATCH_ALL(src.dtype(), "copy", {
    void* d = dst.raw_data();
    const auto* s = static_cast<const scalar_t*>(src.raw_data());
    const DType dt = dst.dtype();
    launch_strided<2>(device, {&dst, &src}, dst.numel(), [&](auto ix) {
      return CopyLoop<scalar_t, decltype(ix)>{d, dt, s, ix};
    });
  });
}

void fill(int device, const Tensor& t, double value) {
  DDP_DISPATCH_ALL(t.dtype(), "fill", {
    auto* o = static_cast<scalar_t*>(t.raw_data());
    const auto v = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(value));
    launch_strided<1>(device, {&t}, t.numel(), [&](auto ix) {
      return FillLoop<scalar_t, decltype(ix)>{o, v, ix};
    });
  });
}

}  // namespace ddplab::gpu
