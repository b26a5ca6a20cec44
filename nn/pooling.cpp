// Pooling over [N, C, H, W]: max_pool2d, avg_pool2d, adaptive_avg_pool2d (CPU kernels with
// hand-written backward).
//
// Every (n, c) plane is independent, so the parallel loops run over planes: in backward, no two
// threads ever add into the same input pixel. (The channels-last 2x2 max pool runs over rows of
// windows instead, each of which owns its two input rows.)
//
// PyTorch conventions matched here:
//   * stride {0, 0} means stride = kernel; output size uses floor mode (ceil_mode=False);
//   * max_pool2d: padded positions never win; ties go to the first maximum in row-major window
//     order; NaN propagates (a NaN is taken as the maximum);
//   * avg_pool2d: count_include_pad=True: the divisor counts padded positions inside the padded
//     input, but not the part of a window hanging past the padding;
//   * adaptive_avg_pool2d: window i spans [floor(i*In/Out), ceil((i+1)*In/Out)).
//
// bfloat16 input (autocast's activations, Note [Autocast] in nn/autocast.h) runs the float32
// kernels on a widened copy and rounds the result back, like PyTorch's CPU kernels, which also
// accumulate bfloat16 windows in float32: the output is the float32 op's, rounded. Pooling
// follows the last convolutions, where the tensors are small, so the extra pass costs little.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "autograd/function_node.h"
#include "autograd/functions.h"
#include "nn/functional.h"
#include "nn/functional_util.h"
#include "tensor/blocked.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

#if defined(DDP_CUDA)
#include "nn/cudnn.h"
#endif

namespace ddplab::nn::functional {

namespace {

struct PoolShape {
  int64_t planes, h, w, oh, ow;
};

// Common argument checks; returns N*C and fills oh/ow for a fixed-window pool.
PoolShape check_pool(const char* what, const Tensor& x, Pair kernel, Pair& stride, Pair padding) {
  DDP_CHECK(x.defined() && x.dim() == 4,
            what << ": expected a 4-D input [N, C, H, W], got shape "
                 << (x.defined() ? shape_str(x.shape()) : std::string("(undefined)")));
#if !defined(DDP_CUDA)
  DDP_CHECK(!x.is_cuda(), what << ": not implemented on CUDA yet; run it on the CPU");
#endif
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  for (int i = 0; i < 2; ++i) {
    DDP_CHECK(kernel[i] >= 1 && stride[i] >= 1,
              what << ": kernel and stride must be positive, got kernel [" << kernel[0] << ", "
                   << kernel[1] << "], stride [" << stride[0] << ", " << stride[1] << "]");
    DDP_CHECK(padding[i] >= 0 && 2 * padding[i] <= kernel[i],
              what << ": padding should be at most half of the kernel, got padding [" << padding[0]
                   << ", " << padding[1] << "] for kernel [" << kernel[0] << ", " << kernel[1]
                   << "]");
  }
  PoolShape s{x.size(0) * x.size(1), x.size(2), x.size(3), 0, 0};
  s.oh = (s.h + 2 * padding[0] - kernel[0]) / stride[0] + 1;
  s.ow = (s.w + 2 * padding[1] - kernel[1]) / stride[1] + 1;
  DDP_CHECK(s.h + 2 * padding[0] >= kernel[0] && s.w + 2 * padding[1] >= kernel[1],
            what << ": kernel [" << kernel[0] << ", " << kernel[1]
                 << "] is larger than the padded input " << shape_str(x.shape()));
  return s;
}

// --- max pooling -------------------------------------------------------------------------------

// Writes the max of each window and the flat index (h * W + w) within the plane of the winner.
template <class T>
void max_pool_forward(const T* x, const PoolShape& s, Pair k, Pair st, Pair pad, T* y,
                      int64_t* arg) {
#pragma omp parallel for if (s.planes * s.oh * s.ow * k[0] * k[1] > kParallelGrain)
  for (int64_t p = 0; p < s.planes; ++p) {
    const T* in = x + p * s.h * s.w;
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      for (int64_t ox = 0; ox < s.ow; ++ox) {
        const int64_t h0 = oy * st[0] - pad[0], w0 = ox * st[1] - pad[1];
        T best = -INFINITY;
        int64_t best_i = -1;
        for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + k[0], s.h); ++ih) {
          for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + k[1], s.w); ++iw) {
            const T v = in[ih * s.w + iw];
            // Strict > keeps the first of tied maxima; NaN wins once and stays.
            if (best_i < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
              best = v;
              best_i = ih * s.w + iw;
            }
          }
        }
        const int64_t o = (p * s.oh + oy) * s.ow + ox;
        y[o] = best;
        arg[o] = best_i;
      }
    }
  }
}

// The common case - a 2x2 window, stride 2, no padding (every CNN's "halve the resolution") -
// without the general kernel's window clipping and its compare-and-branch per element, which is
// a coin flip on real activations: the mispredictions made it a quarter of the small CNN's step
// at batch 128. Here each row of windows takes two passes with no data-dependent branch:
//   1. the maxima, as max(max(a, b), max(c, d)) for the window [a b; c d]: a loop of plain max
//      operations the compiler turns into vector instructions;
//   2. the winners' positions: the first of a, b, c, d that equals the maximum (so the first of
//      tied maxima in row-major order, as in the general kernel), counted with arithmetic on the
//      comparisons' 0/1 results.
// A NaN makes every comparison false, so pass 2 checks each window for one (rare; the branch is
// always predicted) and gives such a window the general rule's answer: the first NaN.
template <class T>
void max_pool_2x2_forward(const T* x, const PoolShape& s, T* y, int64_t* arg) {
  const int64_t w = s.w;
#pragma omp parallel for if (s.planes * s.oh * s.ow * 4 > kParallelGrain)
  for (int64_t row = 0; row < s.planes * s.oh; ++row) {
    const int64_t p = row / s.oh, oy = row % s.oh;
    const T* r0 = x + p * s.h * w + 2 * oy * w;
    const T* r1 = r0 + w;
    T* yo = y + row * s.ow;
    int64_t* ao = arg + row * s.ow;
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      const T a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
      const T ab = b > a ? b : a, cd = d > c ? d : c;
      yo[ox] = cd > ab ? cd : ab;
    }
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      const T a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
      const T m = yo[ox];
      // Window position k (0..3 in row-major order) -> flat index within the plane.
      auto flat = [&](int64_t k) { return (2 * oy + k / 2) * w + 2 * ox + k % 2; };
      // k = 0 if a is the maximum, else 1 if b is, else 2 if c is, else 3.
      const int64_t k = static_cast<int64_t>(a != m) *
                        (1 + static_cast<int64_t>(b != m) * (1 + static_cast<int64_t>(c != m)));
      ao[ox] = flat(k);
      if ((a != a) | (b != b) | (c != c) | (d != d)) {  // a NaN: the first one wins
        const int64_t n = a != a ? 0 : b != b ? 1 : c != c ? 2 : 3;
        ao[ox] = flat(n);
        yo[ox] = (n < 2 ? r0 : r1)[2 * ox + n % 2];
      }
    }
  }
}

// The 2x2 pool of a channels-last x ([N, H, W, C] in memory): a window's four pixels are four
// rows of C values, and the rule is applied channel by channel along them, so the loop runs over
// C contiguous values with no branch and vectorizes (see replaces). The winners are kept as
// positions in the window (0..3, row-major), one byte per output value (an int64 flat index, as
// the general kernel keeps, would be 8).

// 1 if v replaces best (v greater, or v a NaN while best is not), else 0, as a T: g++ 12 does not
// vectorize the same test written as a bool expression of the comparisons.
template <class T>
DDP_ALWAYS_INLINE T replaces(T v, T best) {
  const T not_greater = v <= best ? T(1) : T(0);  // 0 also for a NaN v
  return best != best ? T(0) : T(1) - not_greater;
}

// The winner of each of a window's c channels (kC: c known when compiled, else 0).
template <class T, int64_t kC>
DDP_ALWAYS_INLINE void pool_window(const T* p0, const T* p1, const T* p2, const T* p3, int64_t c,
                                   T* yo, uint8_t* ko) {
  using P = compute_t<T>;
  for (int64_t j = 0; j < (kC != 0 ? kC : c); ++j) {
    // In P (float for bfloat16, whose own selects compile to branches); the winner is one
    // of the inputs, so rounding it back to T is exact.
    const P v1 = static_cast<P>(p1[j]), v2 = static_cast<P>(p2[j]), v3 = static_cast<P>(p3[j]);
    P best = static_cast<P>(p0[j]), k = P(0);  // k: the winner's position, as a P
    P r = replaces(v1, best);
    best = r != P(0) ? v1 : best;
    k = r != P(0) ? P(1) : k;
    r = replaces(v2, best);
    best = r != P(0) ? v2 : best;
    k = r != P(0) ? P(2) : k;
    r = replaces(v3, best);
    best = r != P(0) ? v3 : best;
    k = r != P(0) ? P(3) : k;
    yo[j] = static_cast<T>(best);
    ko[j] = static_cast<uint8_t>(k);
  }
}

// 16 channels (the blocked layout's groups, Note [Blocked activations]) get a loop of that
// constant length: with c only known at run time g++ vectorizes for 64 one-byte positions at a
// time, and 16 channels then ran in the scalar remainder loop, 7x slower.
template <class T>
DDP_CPU_CLONES void max_pool_2x2_nhwc_forward(const T* x, int64_t n, int64_t h, int64_t w,
                                              int64_t c, T* y, uint8_t* pos) {
  const int64_t oh = h / 2, ow = w / 2;
#pragma omp parallel for if (n * oh * ow * c * 4 > kParallelGrain)
  for (int64_t row = 0; row < n * oh; ++row) {
    const int64_t b = row / oh, oy = row % oh;
    for (int64_t ox = 0; ox < ow; ++ox) {
      const T* p0 = x + ((b * h + 2 * oy) * w + 2 * ox) * c;  // the window's top-left pixel
      const T* p1 = p0 + c;
      const T* p2 = p0 + w * c;
      const T* p3 = p2 + c;
      T* yo = y + (row * ow + ox) * c;
      uint8_t* ko = pos + (row * ow + ox) * c;
      if (c == 16) {
        pool_window<T, 16>(p0, p1, p2, p3, c, yo, ko);
      } else {
        pool_window<T, 0>(p0, p1, p2, p3, c, yo, ko);
      }
    }
  }
}

// out[j] = g[j] where window position k[j] is `at` (that input won), else 0, for the c channels of
// one input pixel: a loop per pixel, with one store each. (One loop storing both pixels of a
// window row ran its scalar version: 3x slower, perf, 2026-12-03, Intel Xeon with AMX.)
// kC: c known when compiled (16, as in the forward), else 0.
template <class T, int64_t kC = 0>
DDP_ALWAYS_INLINE void winner_gradient(const T* g, const uint8_t* k, uint8_t at, int64_t c,
                                       T* out) {
  using P = compute_t<T>;  // the select in P, as in the forward; exact
  if constexpr (kC != 0) {
    // As bits: the winner's value or +0 (the select's result, bit for bit). A select of
    // floating values on a one-byte comparison, 16 at a time, compiled to scalar code with a
    // branch per value (4.8x slower than 32-channel pixels); AND-ing with a mask vectorizes.
    using U = std::conditional_t<sizeof(T) == 2, uint16_t,
                                 std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    static_assert(sizeof(U) == sizeof(T));
    U bits[kC], r[kC];
    std::memcpy(bits, g, sizeof bits);
    for (int64_t j = 0; j < kC; ++j) r[j] = bits[j] & static_cast<U>(U(0) - U(k[j] == at));
    std::memcpy(out, r, sizeof r);
  } else {
    for (int64_t j = 0; j < c; ++j) {
      out[j] = static_cast<T>(k[j] == at ? static_cast<P>(g[j]) : P(0));
    }
  }
}

// Its backward: every input value gets its window's gradient if it won, else 0 (also the last
// row or column of an odd size, in no window); each input value is written once.
template <class T>
DDP_CPU_CLONES void max_pool_2x2_nhwc_backward(const T* gy, const uint8_t* pos, int64_t n,
                                               int64_t h, int64_t w, int64_t c, T* gx) {
  const int64_t oh = h / 2, ow = w / 2;
#pragma omp parallel for if (n * h * w * c > kParallelGrain)
  for (int64_t row = 0; row < n * oh; ++row) {
    const int64_t b = row / oh, oy = row % oh;
    T* top = gx + (b * h + 2 * oy) * w * c;
    for (int64_t i = 0; i < 2; ++i) {
      T* out = top + i * w * c;
      for (int64_t ox = 0; ox < ow; ++ox) {
        const T* g = gy + (row * ow + ox) * c;
        const uint8_t* k = pos + (row * ow + ox) * c;
        const auto left = static_cast<uint8_t>(2 * i), right = static_cast<uint8_t>(2 * i + 1);
        if (c == 16) {
          winner_gradient<T, 16>(g, k, left, c, out + 2 * ox * c);
          winner_gradient<T, 16>(g, k, right, c, out + (2 * ox + 1) * c);
        } else {
          winner_gradient(g, k, left, c, out + 2 * ox * c);
          winner_gradient(g, k, right, c, out + (2 * ox + 1) * c);
        }
      }
      if (w % 2 != 0) std::fill(out + (w - 1) * c, out + w * c, T(0));
    }
    if (h % 2 != 0 && oy == oh - 1) {
      T* last = gx + (b * h + h - 1) * w * c;
      std::fill(last, last + w * c, T(0));
    }
  }
}

template <class T>
void max_pool_backward(const T* gy, const int64_t* arg, const PoolShape& s, T* gx) {
#pragma omp parallel for if (s.planes * s.h * s.w > kParallelGrain)
  for (int64_t p = 0; p < s.planes; ++p) {
    T* out = gx + p * s.h * s.w;
    for (int64_t i = 0; i < s.h * s.w; ++i) out[i] = T(0);
    for (int64_t o = 0; o < s.oh * s.ow; ++o) {
      const int64_t i = arg[p * s.oh * s.ow + o];
      if (i >= 0) out[i] += gy[p * s.oh * s.ow + o];
    }
  }
}

// --- average pooling (fixed and adaptive windows) -------------------------------------------
// Both are "sum the window, times a per-output weight", so one kernel serves both: a window
// table gives [h0, h1) x [w0, w1) and the divisor of each output pixel.
struct Windows {
  std::vector<int64_t> h0, h1, w0, w1;  // per output row / column, clipped to the input
  std::vector<double> inv_div;          // per output pixel (oh * ow)
};

Windows avg_windows(const PoolShape& s, Pair k, Pair st, Pair pad) {
  Windows win;
  std::vector<int64_t> hsize(s.oh), wsize(s.ow);
  for (int64_t oy = 0; oy < s.oh; ++oy) {
    int64_t a = oy * st[0] - pad[0], b = std::min(a + k[0], s.h + pad[0]);
    hsize[oy] = b - a;  // counts padding (count_include_pad=True), not overhang past it
    win.h0.push_back(std::max<int64_t>(a, 0));
    win.h1.push_back(std::min(b, s.h));
  }
  for (int64_t ox = 0; ox < s.ow; ++ox) {
    int64_t a = ox * st[1] - pad[1], b = std::min(a + k[1], s.w + pad[1]);
    wsize[ox] = b - a;
    win.w0.push_back(std::max<int64_t>(a, 0));
    win.w1.push_back(std::min(b, s.w));
  }
  for (int64_t oy = 0; oy < s.oh; ++oy)
    for (int64_t ox = 0; ox < s.ow; ++ox)
      win.inv_div.push_back(1.0 / static_cast<double>(hsize[oy] * wsize[ox]));
  return win;
}

Windows adaptive_windows(const PoolShape& s) {
  Windows win;
  for (int64_t oy = 0; oy < s.oh; ++oy) {
    win.h0.push_back(oy * s.h / s.oh);                     // floor(i * In / Out)
    win.h1.push_back(((oy + 1) * s.h + s.oh - 1) / s.oh);  // ceil((i + 1) * In / Out)
  }
  for (int64_t ox = 0; ox < s.ow; ++ox) {
    win.w0.push_back(ox * s.w / s.ow);
    win.w1.push_back(((ox + 1) * s.w + s.ow - 1) / s.ow);
  }
  for (int64_t oy = 0; oy < s.oh; ++oy)
    for (int64_t ox = 0; ox < s.ow; ++ox)
      win.inv_div.push_back(
          1.0 / static_cast<double>((win.h1[oy] - win.h0[oy]) * (win.w1[ox] - win.w0[ox])));
  return win;
}

template <class T>
void avg_pool_forward(const T* x, const PoolShape& s, const Windows& win, T* y) {
#pragma omp parallel for if (s.planes * s.h * s.w > kParallelGrain)
  for (int64_t p = 0; p < s.planes; ++p) {
    const T* in = x + p * s.h * s.w;
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      for (int64_t ox = 0; ox < s.ow; ++ox) {
        double sum = 0;
        for (int64_t ih = win.h0[oy]; ih < win.h1[oy]; ++ih)
          for (int64_t iw = win.w0[ox]; iw < win.w1[ox]; ++iw) sum += in[ih * s.w + iw];
        y[(p * s.oh + oy) * s.ow + ox] = static_cast<T>(sum * win.inv_div[oy * s.ow + ox]);
      }
    }
  }
}

template <class T>
void avg_pool_backward(const T* gy, const PoolShape& s, const Windows& win, T* gx) {
#pragma omp parallel for if (s.planes * s.h * s.w > kParallelGrain)
  for (int64_t p = 0; p < s.planes; ++p) {
    T* out = gx + p * s.h * s.w;
    for (int64_t i = 0; i < s.h * s.w; ++i) out[i] = T(0);
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      for (int64_t ox = 0; ox < s.ow; ++ox) {
        const T g = static_cast<T>(gy[(p * s.oh + oy) * s.ow + ox] * win.inv_div[oy * s.ow + ox]);
        for (int64_t ih = win.h0[oy]; ih < win.h1[oy]; ++ih)
          for (int64_t iw = win.w0[ox]; iw < win.w1[ox]; ++iw) out[ih * s.w + iw] += g;
      }
    }
  }
}

// pool(x) for a bfloat16 x: in float32, then rounded back (both casts differentiable, so the
// gradient reaching x is bfloat16 too).
template <class Pool>
Tensor pool_in_float32(const Tensor& x, Pool pool) {
  return ddplab::to(pool(ddplab::to(x, kFloat32)), kBFloat16);
}

// Runs an average pool given its windows, and records the backward.
Tensor avg_pool_with(const char* name, const Tensor& x_in, const PoolShape& s, Windows win) {
  if (x_in.dtype() == kBFloat16) {
    return pool_in_float32(x_in, [&](const Tensor& x) { return avg_pool_with(name, x, s, win); });
  }
  Tensor x = ops::contiguous(x_in);
  Tensor y = ops::empty({x.size(0), x.size(1), s.oh, s.ow}, x.options());
  DDP_NN_DISPATCH(x.dtype(), name,
                  avg_pool_forward(x.data_ptr<scalar_t>(), s, win, y.data_ptr<scalar_t>()));
  if (!autograd::needs_grad({x_in})) return y;
  const Shape& in_shape = x.shape();
  return autograd::record(name, y, {x_in}, {},
                          [s, win = std::move(win), in_shape](
                              const Tensor& grad, const autograd::Saved&, const autograd::Needs&) {
                            Tensor gy = ops::contiguous(grad);
                            Tensor gx = ops::empty(in_shape, gy.options());
                            DDP_NN_DISPATCH(gy.dtype(), "avg_pool backward",
                                            avg_pool_backward(gy.data_ptr<scalar_t>(), s, win,
                                                              gx.data_ptr<scalar_t>()));
                            return autograd::Grads{gx};
                          });
}

// adaptive_avg_pool2d to 1x1 of a channels-last or blocked x (resnet's last pool), without
// making x row-major first: images of c values per pixel (channels-last: N images of C; blocked:
// N * C/16 images of 16, Note [Blocked activations] in tensor/blocked.cpp), y[image * c + j] the
// mean of value j over the image's pixels, which is y[n, ch] in either case. Each mean is the
// same sum in double, in the same pixel order, as the row-major kernel's, so the same bits; the
// gradient is written in x's layout (gy times 1/(H*W), rounded to T, as there).
// How the pools below see x's memory: images of pixels of `c` values each. Channels-last: N
// images of C; blocked (block B, Note [Blocked activations] in tensor/blocked.cpp): N * C/B
// images of B, which is byte for byte the blocked layout.
struct NhwcImages {
  int64_t images, c;
};
NhwcImages nhwc_images(const Tensor& x, int64_t block) {
  const int64_t n = x.size(0), c = x.size(1);
  return block != 0 ? NhwcImages{n * (c / block), block} : NhwcImages{n, c};
}

struct GlobalPool {
  int64_t images, pixels, c;                                        // c values per pixel
  double inv() const { return 1.0 / static_cast<double>(pixels); }  // as avg_windows' inv_div
  bool parallel() const { return images * pixels * c > kParallelGrain; }
};

template <class T>
DDP_CPU_CLONES void global_avg_pool_nhwc_forward(const T* x, const GlobalPool& g, T* y) {
#pragma omp parallel for if (g.parallel())
  for (int64_t i = 0; i < g.images; ++i) {
    std::vector<double> sum(static_cast<size_t>(g.c), 0.0);
    for (const T* row = x + i * g.pixels * g.c; row != x + (i + 1) * g.pixels * g.c; row += g.c) {
      for (int64_t j = 0; j < g.c; ++j) sum[static_cast<size_t>(j)] += static_cast<double>(row[j]);
    }
    for (int64_t j = 0; j < g.c; ++j) {
      y[i * g.c + j] = static_cast<T>(sum[static_cast<size_t>(j)] * g.inv());
    }
  }
}

// Every pixel of image i gets gy[i] / pixels, rounded to T once and copied.
template <class T>
DDP_CPU_CLONES void global_avg_pool_nhwc_backward(const T* gy, const GlobalPool& g, T* gx) {
#pragma omp parallel for if (g.parallel())
  for (int64_t i = 0; i < g.images; ++i) {
    std::vector<T> share(static_cast<size_t>(g.c));
    for (int64_t j = 0; j < g.c; ++j) {
      share[static_cast<size_t>(j)] =
          static_cast<T>(static_cast<double>(gy[i * g.c + j]) * g.inv());
    }
    T* out = gx + i * g.pixels * g.c;
    for (int64_t p = 0; p < g.pixels; ++p) std::copy(share.begin(), share.end(), out + p * g.c);
  }
}

Tensor global_avg_pool_channels_last(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), pixels = x.size(2) * x.size(3);
  const int64_t block = ops::blocked_block(x);
  const NhwcImages im = nhwc_images(x, block);
  const GlobalPool pool{im.images, pixels, im.c};
  Tensor y = ops::empty({n, c, 1, 1}, x.options());
  DDP_NN_DISPATCH(x.dtype(), "adaptive_avg_pool2d",
                  global_avg_pool_nhwc_forward(ops::in_layout(x, block).data_ptr<scalar_t>(), pool,
                                               y.data_ptr<scalar_t>()));
  if (!autograd::needs_grad({x})) return y;
  const Shape& shape = x.shape();
  return autograd::record(
      "AdaptiveAvgPool2DBackward", y, {x}, {},
      [shape, block, pool](const Tensor& grad, const autograd::Saved&, const autograd::Needs&) {
        Tensor gy = ops::contiguous(grad);  // [N, C, 1, 1]: the same bytes in every layout
        Tensor gx =
            ops::empty_in_layout(shape, gy.options(), block, ops::MemoryFormat::ChannelsLast);
        DDP_NN_DISPATCH(
            gy.dtype(), "adaptive_avg_pool2d backward",
            global_avg_pool_nhwc_backward(gy.data_ptr<scalar_t>(), pool,
                                          ops::in_layout(gx, block).data_ptr<scalar_t>()));
        return autograd::Grads{gx};
      });
}

// max_pool2d's 2x2 pool of a channels-last x: y stays channels-last (no transposes either way).
// A blocked x (Note [Blocked activations] in tensor/blocked.cpp) is, byte for byte, a
// channels-last tensor of N * C/16 images of 16 channels each: the same kernel pools that, and y
// (and backward, gx) comes out blocked alike. The small CNN's pools sit between a convolution that
// writes blocked and one that reads it; had they rearranged it, its float32 step would have taken
// 1.16x as long as with the blocked layout off.
Tensor max_pool_2x2_channels_last(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t block = ops::blocked_block(x);
  const NhwcImages im = nhwc_images(x, block);
  const Shape y_shape{n, c, h / 2, w / 2};
  Tensor y = ops::empty_in_layout(y_shape, x.options(), block, ops::MemoryFormat::ChannelsLast);
  Tensor pos = ops::empty(y_shape, kUInt8, ops::MemoryFormat::ChannelsLast);  // in y's order
  DDP_NN_DISPATCH_BF16(x.dtype(), "max_pool2d",
                       max_pool_2x2_nhwc_forward(
                           ops::in_layout(x, block).data_ptr<scalar_t>(), im.images, h, w, im.c,
                           ops::in_layout(y, block).data_ptr<scalar_t>(), pos.data_ptr<uint8_t>()));
  if (!autograd::needs_grad({x})) return y;
  return autograd::record(
      "MaxPool2DBackward", y, {x}, {pos},
      [n, c, h, w, block, im](const Tensor& grad, const autograd::Saved& saved,
                              const autograd::Needs&) {
        Tensor gy = ops::contiguous(grad, ops::MemoryFormat::ChannelsLast);
        if (block != 0) gy = ops::to_blocked(gy, block);  // the order of y, and of pos
        Tensor gx = ops::empty_in_layout({n, c, h, w}, gy.options(), block,
                                         ops::MemoryFormat::ChannelsLast);
        DDP_NN_DISPATCH_BF16(
            gy.dtype(), "max_pool2d backward",
            max_pool_2x2_nhwc_backward(ops::in_layout(gy, block).data_ptr<scalar_t>(),
                                       saved[0].data_ptr<uint8_t>(), im.images, h, w, im.c,
                                       ops::in_layout(gx, block).data_ptr<scalar_t>()));
        return autograd::Grads{gx};
      });
}

}  // namespace

Tensor max_pool2d(const Tensor& x_in, Pair kernel, Pair stride, Pair padding) {
  PoolShape s = check_pool("max_pool2d", x_in, kernel, stride, padding);
#if defined(DDP_CUDA)
  if (x_in.is_cuda()) {
    return cudnn::pool2d(cudnn::PoolMode::Max, "max_pool2d", x_in, kernel, stride, padding, s.oh,
                         s.ow);
  }
#endif
  // The channels-last 2x2 kernel takes bfloat16 as it is (a max is exact in any precision).
  const bool two_by_two = kernel == Pair{2, 2} && stride == Pair{2, 2} && padding == Pair{0, 0};
  if (two_by_two && ops::suggest_memory_format(x_in) == ops::MemoryFormat::ChannelsLast) {
    return max_pool_2x2_channels_last(x_in);
  }
  if (x_in.dtype() == kBFloat16) {
    return pool_in_float32(x_in,
                           [&](const Tensor& x) { return max_pool2d(x, kernel, stride, padding); });
  }
  Tensor x = ops::contiguous(x_in);
  Tensor y = ops::empty({x.size(0), x.size(1), s.oh, s.ow}, x.options());
  Tensor arg = ops::empty(y.shape(), kInt64);
  DDP_NN_DISPATCH(x.dtype(), "max_pool2d",
                  two_by_two ? max_pool_2x2_forward(x.data_ptr<scalar_t>(), s,
                                                    y.data_ptr<scalar_t>(), arg.data_ptr<int64_t>())
                             : max_pool_forward(x.data_ptr<scalar_t>(), s, kernel, stride, padding,
                                                y.data_ptr<scalar_t>(), arg.data_ptr<int64_t>()));
  if (!autograd::needs_grad({x_in})) return y;
  const Shape& in_shape = x.shape();
  return autograd::record(
      "MaxPool2DBackward", y, {x_in}, {arg},
      [s, in_shape](const Tensor& grad, const autograd::Saved& saved, const autograd::Needs&) {
        Tensor gy = ops::contiguous(grad);
        Tensor gx = ops::empty(in_shape, gy.options());
        DDP_NN_DISPATCH(gy.dtype(), "max_pool2d backward",
                        max_pool_backward(gy.data_ptr<scalar_t>(), saved[0].data_ptr<int64_t>(), s,
                                          gx.data_ptr<scalar_t>()));
        return autograd::Grads{gx};
      });
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  PoolShape s = check_pool("avg_pool2d", x, kernel, stride, padding);
#if defined(DDP_CUDA)
  if (x.is_cuda()) {
    return cudnn::pool2d(cudnn::PoolMode::AvgIncludePadding, "avg_pool2d", x, kernel, stride,
                         padding, s.oh, s.ow);
  }
#endif
  return avg_pool_with("AvgPool2DBackward", x, s, avg_windows(s, kernel, stride, padding));
}

Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size) {
  DDP_CHECK(x.defined() && x.dim() == 4,
            "adaptive_avg_pool2d: expected a 4-D input [N, C, H, W], got shape "
                << (x.defined() ? shape_str(x.shape()) : std::string("(undefined)")));
#if !defined(DDP_CUDA)
  DDP_CHECK(!x.is_cuda(), "adaptive_avg_pool2d: not implemented on CUDA yet; run it on the CPU");
#endif
  DDP_CHECK(output_size[0] >= 1 && output_size[1] >= 1,
            "adaptive_avg_pool2d: output size must be positive, got [" << output_size[0] << ", "
                                                                       << output_size[1] << "]");
  PoolShape s{x.size(0) * x.size(1), x.size(2), x.size(3), output_size[0], output_size[1]};
  DDP_CHECK(s.h >= 1 && s.w >= 1,
            "adaptive_avg_pool2d: input " << shape_str(x.shape()) << " has an empty plane");
#if defined(DDP_CUDA)
  if (x.is_cuda()) {
    // Output sizes dividing the input make every adaptive window [i*k, (i+1)*k): a plain average
    // pool with kernel = stride = k. Other sizes have overlapping, uneven windows.
    DDP_CHECK(s.h % s.oh == 0 && s.w % s.ow == 0,
              "adaptive_avg_pool2d: not implemented on CUDA yet for output size ["
                  << s.oh << ", " << s.ow << "] that does not divide the input "
                  << shape_str(x.shape()) << "; run it on the CPU");
    const Pair k{s.h / s.oh, s.w / s.ow};
    return cudnn::pool2d(cudnn::PoolMode::AvgIncludePadding, "adaptive_avg_pool2d", x, k, k, {0, 0},
                         s.oh, s.ow);
  }
#endif
  const bool nhwc = ops::blocked_block(x) != 0 ||
                    ops::suggest_memory_format(x) == ops::MemoryFormat::ChannelsLast;
  if (output_size == Pair{1, 1} && nhwc && x.dtype() != kBFloat16) {
    return global_avg_pool_channels_last(x);
  }
  return avg_pool_with("AdaptiveAvgPool2DBackward", x, s, adaptive_windows(s));
}

}  // namespace ddplab::nn::functional
