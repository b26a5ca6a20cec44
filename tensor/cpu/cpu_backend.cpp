// The CPU executor: runs the shared functors (tensor/functors.h) in OpenMP loops, GEMM through
// oneDNN. Mirrors tensor/cuda/cuda_backend.cpp, which runs the same functors in CUDA kernels
// (tensor/cuda/cuda_elementwise.cu, cuda_reduce.cu, cuda_index.cu).
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/backend.h"
#include "tensor/cpu/loops.h"
#include "tensor/cpu/onednn_matmul.h"
#include "tensor/functors.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace ddplab::cpu {

namespace {

template <class T>
T& at(char* p, int64_t i, int64_t stride) {
  return *reinterpret_cast<T*>(p + i * stride);
}

// The dense rows of the loops below, where the time goes: the compiler vectorizes them, and
// DDP_CPU_CLONES (tensor/macros.h) compiles them for AVX-512 as well. That matters for bfloat16,
// whose every element is widened to float and rounded back: with SSE's 4 floats per instruction
// the conversions, not memory, set the pace.
template <class T, class Op, class O, class C>
DDP_CPU_CLONES void unary_row(O* o, const T* x, int64_t n, C ca, C cb) {
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<O>(Op::apply(static_cast<C>(x[i]), ca, cb));
}

template <class T, class Op, class O, class C>
DDP_CPU_CLONES void binary_row(O* o, const T* x, const T* y, int64_t n, C ca, C cb) {
  for (int64_t i = 0; i < n; ++i) {
    o[i] = static_cast<O>(Op::apply(static_cast<C>(x[i]), static_cast<C>(y[i]), ca, cb));
  }
}

template <class D, class S>
DDP_CPU_CLONES void convert_row(D* d, const S* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<D>(static_cast<compute_t<S>>(x[i]));
}

template <class T, class Op>
void unary_loop(const Tensor& out, const Tensor& in, double a, double b) {
  using C = compute_t<T>;
  using O = std::conditional_t<Op::kPredicate, bool, T>;
  const C ca = static_cast<C>(a), cb = static_cast<C>(b);
  for_each_row<2>({&out, &in}, [&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(O) && s[1] == sizeof(T)) {  // contiguous: vectorisable
      unary_row<T, Op>(reinterpret_cast<O*>(p[0]), reinterpret_cast<const T*>(p[1]), n, ca, cb);
    } else {
      for (int64_t i = 0; i < n; ++i)
        at<O>(p[0], i, s[0]) =
            static_cast<O>(Op::apply(static_cast<C>(at<T>(p[1], i, s[1])), ca, cb));
    }
  });
}

template <class T, class Op>
void binary_loop(const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta) {
  using C = compute_t<T>;
  using O = std::conditional_t<Op::kPredicate, bool, T>;
  const C ca = static_cast<C>(alpha), cb = static_cast<C>(beta);
  for_each_row<3>({&out, &x, &y}, [&](char** p, const int64_t* s, int64_t n) {
    O* o = reinterpret_cast<O*>(p[0]);
    const T* xp = reinterpret_cast<const T*>(p[1]);
    const T* yp = reinterpret_cast<const T*>(p[2]);
    if (s[0] == sizeof(O) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
      binary_row<T, Op>(o, xp, yp, n, ca, cb);
    } else if (s[0] == sizeof(O) && s[1] == sizeof(T) && s[2] == 0) {  // tensor (op) scalar
      const C yv = static_cast<C>(yp[0]);
      for (int64_t i = 0; i < n; ++i)
        o[i] = static_cast<O>(Op::apply(static_cast<C>(xp[i]), yv, ca, cb));
    } else if (s[0] == sizeof(O) && s[1] == 0 && s[2] == sizeof(T)) {  // scalar (op) tensor
      const C xv = static_cast<C>(xp[0]);
      for (int64_t i = 0; i < n; ++i)
        o[i] = static_cast<O>(Op::apply(xv, static_cast<C>(yp[i]), ca, cb));
    } else {
      for (int64_t i = 0; i < n; ++i)
        at<O>(p[0], i, s[0]) = static_cast<O>(Op::apply(
            static_cast<C>(at<T>(p[1], i, s[1])), static_cast<C>(at<T>(p[2], i, s[2])), ca, cb));
    }
  });
}

template <class D, class S>
void copy_loop(const Tensor& dst, const Tensor& src) {
  for_each_row<2>({&dst, &src}, [&](char** p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<D, S>) {
      if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
        std::memcpy(p[0], p[1], static_cast<size_t>(n) * sizeof(D));
        return;
      }
    }
    if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
      convert_row(reinterpret_cast<D*>(p[0]), reinterpret_cast<const S*>(p[1]), n);
    } else {
      for (int64_t i = 0; i < n; ++i)
        at<D>(p[0], i, s[0]) = static_cast<D>(static_cast<compute_t<S>>(at<S>(p[1], i, s[1])));
    }
  });
}

// Between row-major NCHW and channels-last NHWC (Note [Channels last] in tensor/ops_create.cpp)
// each image is a matrix transpose: [C][H*W] <-> [H*W][C]. Element by element, one side is read or
// written with a stride of C or H*W, which touches a new cache line per element; done in square
// tiles, a tile's lines stay in L1 cache while both sides are walked.
template <class E>
void transpose_tiles(const E* src, E* dst, int64_t batch, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * col_tiles;
#pragma omp parallel for schedule(static) if (batch * rows * cols > kParallelGrain)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t / (row_tiles * col_tiles);
    const int64_t r0 = (t / col_tiles) % row_tiles * kTile, c0 = t % col_tiles * kTile;
    const E* in = src + b * rows * cols;
    E* out = dst + b * rows * cols;
    const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = in[r * cols + c];
    }
  }
}

// dst = src as that transpose when one is dense NCHW and the other dense NHWC, of one dtype (the
// bytes move unchanged); returns false, doing nothing, for any other pair.
bool copy_between_formats(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.dim() != 4 || dst.shape() != src.shape()) return false;
  const bool to_nchw =
      dst.is_contiguous() && ops::suggest_memory_format(src) == ops::MemoryFormat::ChannelsLast;
  const bool to_nhwc =
      src.is_contiguous() && ops::suggest_memory_format(dst) == ops::MemoryFormat::ChannelsLast;
  if (!to_nchw && !to_nhwc) return false;
  const int64_t n = dst.size(0), c = dst.size(1), hw = dst.size(2) * dst.size(3);
  // Source matrix per image: [H*W][C] when going to NCHW, [C][H*W] when going to NHWC.
  const int64_t rows = to_nchw ? hw : c, cols = to_nchw ? c : hw;
  // An unsigned integer of the element's size stands for any dtype.
  const auto as = [&](auto zero) {
    using E = decltype(zero);
    transpose_tiles(static_cast<const E*>(src.raw_data()), static_cast<E*>(dst.raw_data()), n, rows,
                    cols);
    return true;
  };
  switch (element_size(dst.dtype())) {
    case 1:
      return as(uint8_t{0});
    case 2:
      return as(uint16_t{0});
    case 4:
      return as(uint32_t{0});
    case 8:
      return as(uint64_t{0});
    default:
      return false;
  }
}

// Reduces one contiguous row with 8 independent accumulators: the compiler can keep them in one
// vector register, and the shorter addition chains also round less than one running sum.
template <class R, class A, class T>
A reduce_row(const T* x, int64_t n) {
  using C = compute_t<T>;
  A acc[8];
  for (auto& a : acc) a = R::template init<A>();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j)
      acc[j] = R::combine(acc[j], static_cast<A>(static_cast<C>(x[i + j])));
  for (; i < n; ++i) acc[0] = R::combine(acc[0], static_cast<A>(static_cast<C>(x[i])));
  for (int w = 4; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] = R::combine(acc[j], acc[j + w]);
  return acc[0];
}

template <class T, class R>
void reduce_loop(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  using A = typename functors::reduce_acc<R, C, false>::type;
  const T* x = static_cast<const T*>(in.raw_data());
  auto store = [&](int64_t r, A v) {
    if (out.dtype() == kInt64) {
      out.data_ptr<int64_t>()[r] = static_cast<int64_t>(v);
    } else {
      static_cast<T*>(out.raw_data())[r] = static_cast<T>(static_cast<C>(v));
    }
  };
  const int threads = rows * cols >= kParallelGrain ? omp_get_max_threads() : 1;
  if (rows >= threads) {
#pragma omp parallel for schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r) store(r, reduce_row<R, A>(x + r * cols, cols));
    return;
  }
  // Few long rows (a full reduction): each thread reduces a slice, then the slices are combined.
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<A> partial(static_cast<size_t>(threads), R::template init<A>());
    const T* row = x + r * cols;
#pragma omp parallel num_threads(threads)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t begin = cols * t / nt, end = cols * (t + 1) / nt;
      partial[static_cast<size_t>(t)] = reduce_row<R, A>(row + begin, end - begin);
    }
    A acc = R::template init<A>();
    for (A p : partial) acc = R::combine(acc, p);
    store(r, acc);
  }
}

template <class T>
void arg_reduce_loop(bool is_max, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  const T* x = static_cast<const T*>(in.raw_data());
  int64_t* o = out.data_ptr<int64_t>();
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    int64_t best = 0;
    C bv = static_cast<C>(row[0]);
    for (int64_t i = 1; i < cols && !functors::m::isnan(bv); ++i) {
      C v = static_cast<C>(row[i]);
      // NaN counts as the extreme value (as in PyTorch); ties keep the first index.
      if (functors::m::isnan(v) || (is_max ? v > bv : v < bv)) {
        bv = v;
        best = i;
      }
    }
    o[r] = best;
  }
}

template <class T>
void random_loop(RandomKind kind, const Tensor& t, double a, double b, uint64_t seed,
                 uint64_t offset) {
  T* p = static_cast<T*>(t.raw_data());
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i)
    p[i] = static_cast<T>(static_cast<compute_t<T>>(
        random_element(kind, seed, offset, static_cast<uint64_t>(i), a, b)));
}

// float64 GEMM (used by gradient checks): op(A) and op(B) are packed row-major, then an i-k-j
// loop whose inner loop is a vectorisable axpy.
void dgemm(const GemmArgs& g, const double* a, const double* b, double* c) {
  std::vector<double> pa(static_cast<size_t>(g.m * g.k)), pb(static_cast<size_t>(g.k * g.n));
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t p = 0; p < g.k; ++p)
      pa[i * g.k + p] = g.trans_a ? a[p * g.lda + i] : a[i * g.lda + p];
  for (int64_t p = 0; p < g.k; ++p)
    for (int64_t j = 0; j < g.n; ++j)
      pb[p * g.n + j] = g.trans_b ? b[j * g.ldb + p] : b[p * g.ldb + j];
#pragma omp parallel for schedule(static) if (g.m * g.n * g.k >= kParallelGrain)
  for (int64_t i = 0; i < g.m; ++i) {
    std::vector<double> acc(static_cast<size_t>(g.n), 0.0);
    for (int64_t p = 0; p < g.k; ++p) {
      double av = pa[i * g.k + p];
      const double* brow = pb.data() + p * g.n;
      for (int64_t j = 0; j < g.n; ++j) acc[j] += av * brow[j];
    }
    double* crow = c + i * g.ldc;
    for (int64_t j = 0; j < g.n; ++j)
      crow[j] = g.alpha * acc[j] + (g.beta == 0 ? 0.0 : g.beta * crow[j]);
  }
}

// The walk gather and scatter_add share (they are each other's adjoint: gather reads where the
// index points, scatter_add adds there). `index` is an [outer, idx_n, inner] view of int64
// positions along the middle dim of an [outer, n, inner] tensor; fn(at_index, at_target) gets, for
// each element, its offset in the index tensor and the offset it points at in the other tensor.
template <class Fn>
void for_each_index(const int64_t* index, int64_t outer, int64_t n, int64_t idx_n, int64_t inner,
                    const char* what, Fn fn) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < idx_n; ++i)
      for (int64_t j = 0; j < inner; ++j) {
        const int64_t at_index = (o * idx_n + i) * inner + j;
        const int64_t k = index[at_index];
        DDP_CHECK(k >= 0 && k < n, what << ": index " << k << " out of range for size " << n);
        fn(at_index, (o * n + k) * inner + j);
      }
}

class CpuBackend final : public Backend {
 public:
  void unary(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) override {
    switch (op) {
#define DDP_UNARY_CASE(name, functor)                                                  \
  case UnaryOp::name:                                                                  \
    if constexpr (functors::functor::kFloatOnly) {                                     \
      DDP_DISPATCH_FLOATING(in.dtype(), #name,                                         \
                            (unary_loop<scalar_t, functors::functor>(out, in, a, b))); \
    } else {                                                                           \
      DDP_DISPATCH_NUMERIC(in.dtype(), #name,                                          \
                           (unary_loop<scalar_t, functors::functor>(out, in, a, b)));  \
    }                                                                                  \
    break;
      DDP_UNARY_OPS(DDP_UNARY_CASE)
#undef DDP_UNARY_CASE
    }
  }

  void binary(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y, double alpha,
              double beta) override {
    switch (op) {
#define DDP_BINARY_CASE(name, functor)                                                           \
  case BinaryOp::name:                                                                           \
    if constexpr (functors::functor::kFloatOnly) {                                               \
      DDP_DISPATCH_FLOATING(x.dtype(), #name,                                                    \
                            (binary_loop<scalar_t, functors::functor>(out, x, y, alpha, beta))); \
    } else {                                                                                     \
      DDP_DISPATCH_NUMERIC(x.dtype(), #name,                                                     \
                           (binary_loop<scalar_t, functors::functor>(out, x, y, alpha, beta)));  \
    }                                                                                            \
    break;
      DDP_BINARY_OPS(DDP_BINARY_CASE)
#undef DDP_BINARY_CASE
    }
  }

  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override {
    DDP_DISPATCH_ALL(out.dtype(), "where", {
      for_each_row<4>({&out, &cond, &a, &b}, [&](char** p, const int64_t* s, int64_t n) {
        for (int64_t i = 0; i < n; ++i)
          at<scalar_t>(p[0], i, s[0]) =
              at<bool>(p[1], i, s[1]) ? at<scalar_t>(p[2], i, s[2]) : at<scalar_t>(p[3], i, s[3]);
      });
    });
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    if (copy_between_formats(dst, src)) return;
    DDP_DISPATCH_ALL(dst.dtype(), "copy", {
      using dst_t = scalar_t;
      DDP_DISPATCH_ALL(src.dtype(), "copy", (copy_loop<dst_t, scalar_t>(dst, src)));
    });
  }

  void fill(const Tensor& t, double value) override {
    DDP_DISPATCH_ALL(t.dtype(), "fill", {
      const scalar_t v = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(value));
      for_each_row<1>({&t}, [&](char** p, const int64_t* s, int64_t n) {
        for (int64_t i = 0; i < n; ++i) at<scalar_t>(p[0], i, s[0]) = v;
      });
    });
  }

  void reduce(RowReduceOp op, const Tensor& out, const Tensor& in, int64_t rows,
              int64_t cols) override {
    switch (op) {
#define DDP_REDUCE_CASE(name, functor)                                                 \
  case RowReduceOp::name:                                                              \
    DDP_DISPATCH_ALL(in.dtype(), #name,                                                \
                     (reduce_loop<scalar_t, functors::functor>(out, in, rows, cols))); \
    break;
      DDP_REDUCE_OPS(DDP_REDUCE_CASE)
#undef DDP_REDUCE_CASE
    }
  }

  void arg_reduce(bool is_max, const Tensor& out, const Tensor& in, int64_t rows,
                  int64_t cols) override {
    DDP_DISPATCH_NUMERIC(in.dtype(), "argmax",
                         (arg_reduce_loop<scalar_t>(is_max, out, in, rows, cols)));
  }

  void gemm(const GemmArgs& g) override {
    for (int64_t i = 0; i < g.batch; ++i) {
      if (g.dtype == kFloat32) {
        const float* a = static_cast<const float*>(g.a) + i * g.stride_a;
        const float* b = static_cast<const float*>(g.b) + i * g.stride_b;
        float* c = static_cast<float*>(g.c) + i * g.stride_c;
        dnnl_status_t st = dnnl_sgemm(g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', g.m, g.n, g.k,
                                      static_cast<float>(g.alpha), a, g.lda, b, g.ldb,
                                      static_cast<float>(g.beta), c, g.ldc);
        DDP_CHECK(st == dnnl_success, "oneDNN sgemm failed with status "
                                          << st << " (m=" << g.m << " n=" << g.n << " k=" << g.k
                                          << ")");
      } else if (g.dtype == kBFloat16 && g.float32_c) {
        gemm_bf16_f32(g, static_cast<const BFloat16*>(g.a) + i * g.stride_a,
                      static_cast<const BFloat16*>(g.b) + i * g.stride_b,
                      static_cast<float*>(g.c) + i * g.stride_c);
      } else if (g.dtype == kFloat64) {
        dgemm(g, static_cast<const double*>(g.a) + i * g.stride_a,
              static_cast<const double*>(g.b) + i * g.stride_b,
              static_cast<double*>(g.c) + i * g.stride_c);
      } else {
        DDP_FAIL("gemm: unsupported dtype " << dtype_name(g.dtype));
      }
    }
  }

  void random(RandomKind kind, const Tensor& t, double a, double b, uint64_t seed,
              uint64_t offset) override {
    DDP_DISPATCH_NUMERIC(t.dtype(), "random", (random_loop<scalar_t>(kind, t, a, b, seed, offset)));
  }

  void index_select(const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer,
                    int64_t in_n, int64_t inner) override {
    const int64_t* idx = index.data_ptr<int64_t>();
    const int64_t n = index.numel();
    for (int64_t i = 0; i < n; ++i)
      DDP_CHECK(idx[i] >= 0 && idx[i] < in_n,
                "index_select: index " << idx[i] << " out of range for size " << in_n);
    const size_t es = element_size(in.dtype());
    const char* src = static_cast<const char*>(in.raw_data());
    char* dst = static_cast<char*>(out.raw_data());
#pragma omp parallel for schedule(static) if (outer * n * inner >= kParallelGrain)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(dst + ((o * n + i) * inner) * es, src + ((o * in_n + idx[i]) * inner) * es,
                    inner * es);
  }

  void gather(const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer, int64_t in_n,
              int64_t idx_n, int64_t inner) override {
    DDP_DISPATCH_ALL(in.dtype(), "gather", {
      const scalar_t* src = static_cast<const scalar_t*>(in.raw_data());
      scalar_t* dst = static_cast<scalar_t*>(out.raw_data());
      for_each_index(index.data_ptr<int64_t>(), outer, in_n, idx_n, inner, "gather",
                     [&](int64_t at_index, int64_t at_src) { dst[at_index] = src[at_src]; });
    });
  }

  void scatter_add(const Tensor& dst, const Tensor& src, const Tensor& index, int64_t outer,
                   int64_t dst_n, int64_t idx_n, int64_t inner) override {
    DDP_DISPATCH_NUMERIC(dst.dtype(), "scatter_add", {
      using C = compute_t<scalar_t>;
      const scalar_t* s = static_cast<const scalar_t*>(src.raw_data());
      scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
      for_each_index(index.data_ptr<int64_t>(), outer, dst_n, idx_n, inner, "scatter_add",
                     [&](int64_t at_index, int64_t at_dst) {
                       d[at_dst] = static_cast<scalar_t>(static_cast<C>(d[at_dst]) +
                                                         static_cast<C>(s[at_index]));
                     });
    });
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend b;
  return b;
}

}  // namespace ddplab::cpu
