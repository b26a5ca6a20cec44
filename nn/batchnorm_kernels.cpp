// batch_norm: the CPU kernels (forward in training and eval mode, closed-form backward).
//
// The input is viewed as [N, C, S] (S = H*W for 4-D input, 1 for 2-D [N, C]); statistics are per
// channel, over N*S values. Every per-channel sum is accumulated in double, and the variance is
// taken in two passes per row (mean first, then squared deviations, the second from cache), which
// stays exact where the one-pass E[x^2] - E[x]^2 would cancel catastrophically. Channels are
// independent, so the parallel loops run over channels.
//
// A channels-last input (Note [Channels last] in tensor/ops_create.cpp) runs loops of its own,
// over the pixels in memory order ("channels-last input" below). Their per-value arithmetic is in
// the activation's compute type (float for float32), their sums in float within small blocks and
// in double across them (see there for why, and how a mean far from zero stays accurate). The output
// and input gradient are channels-last too, so the convolutions around them read and write NHWC
// without a reorder. A blocked input (oneDNN's nChw16c, Note [Blocked activations] in
// tensor/blocked.cpp) runs the same loops over the same blocks of pixels, the same bits, and its
// output and gradients are blocked too. Any other layout is made contiguous first.
//
// PyTorch's conventions, which we match exactly:
//   * normalization uses the biased batch variance (divide by M = N*S);
//   * running_var is updated with the unbiased one (divide by M - 1);
//   * running = (1 - momentum) * running + momentum * batch_stat.
//
// The end of the file exposes the steps of the training path one by one (nn/batchnorm_kernels.h)
// for SyncBatchNorm, which runs a collective between them; they share the per-channel loops.
//
// Element types: float64 (gradcheck), float32, and bfloat16 activations with float32 weight and
// bias (autocast, Note [Autocast] in nn/autocast.h). The kernels are templates over the
// activation type T; weight, bias, their gradients and the per-element arithmetic are
// compute_t<T> (float for bfloat16, which is only a storage type here), and the statistics are
// double whatever T is. So a bfloat16 batch norm is the float32 one applied to the bfloat16
// values, each output rounded to bfloat16 once.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "nn/batchnorm_kernels.h"

#include "autograd/function_node.h"
#include "nn/functional.h"
#include "nn/functional_util.h"
#include "tensor/blocked.h"
#include "tensor/functors.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

#if defined(DDP_CUDA)
#include "nn/cudnn.h"
#endif

namespace ddplab::nn::functional {

namespace {

struct BnShape {
  int64_t n, c, s;
  int64_t count() const { return n * s; }
};

BnShape bn_shape(const Tensor& x) {
  BnShape d{x.size(0), x.size(1), 1};
  for (int64_t k = 2; k < x.dim(); ++k) d.s *= x.size(k);
  return d;
}

// Row sums in double with eight independent accumulators: a single running sum is one long
// dependency chain (and may not be reordered without -ffast-math); eight chains keep the adders
// busy and let the compiler use vector lanes, several times faster on long rows.
template <class T, class F>
DDP_CPU_CLONES double row_sum(int64_t s, F term) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= s; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += term(i + k);
  }
  for (; i < s; ++i) acc[0] += term(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Per-channel mean and M2 = sum((x - mean)^2) of x viewed as [n, c, s] (d.count() > 0), reading
// x from memory once. Each row (one sample's plane of the channel, a few KB) gets its own mean and
// M2 in two passes, the second of which finds the row still in L1 cache; the rows then merge
// exactly: the channel's M2 is the rows' M2 plus s * sum((row_mean - mean)^2), the spread of the
// row means. As accurate as two passes over the whole channel, at the memory traffic of one.
template <class T>
DDP_CPU_CLONES void batch_moments(const T* x, const BnShape& d, double* mean, double* m2) {
  const double s = static_cast<double>(d.s);
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    std::vector<double> row_mean(static_cast<size_t>(d.n));
    double mean_sum = 0, rows_m2 = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      const T* p = x + (n * d.c + c) * d.s;
      const double rm = row_sum<T>(d.s, [p](int64_t i) { return static_cast<double>(p[i]); }) / s;
      rows_m2 += row_sum<T>(d.s, [p, rm](int64_t i) {
        const double dx = static_cast<double>(p[i]) - rm;
        return dx * dx;
      });
      row_mean[static_cast<size_t>(n)] = rm;
      mean_sum += rm;
    }
    const double m = mean_sum / static_cast<double>(d.n);
    double spread = 0;
    for (double rm : row_mean) spread += (rm - m) * (rm - m);
    mean[c] = m;
    m2[c] = rows_m2 + s * spread;
  }
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

// y = x * scale + shift per channel; with kRelu, also y = relu_clamp(y) in the same pass
// (batch_norm_relu).
template <class T, bool kRelu = false>
DDP_CPU_CLONES void normalize(const T* x, const BnShape& d, const double* mean,
                              const double* invstd, const compute_t<T>* weight,
                              const compute_t<T>* bias, T* y) {
  using P = compute_t<T>;
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    P sc, sh;
    scale_shift(mean, invstd, weight, bias, c, sc, sh);
    for (int64_t n = 0; n < d.n; ++n) {
      const T* p = x + (n * d.c + c) * d.s;
      T* q = y + (n * d.c + c) * d.s;
      if constexpr (kRelu) {
        for (int64_t i = 0; i < d.s; ++i) {
          q[i] = static_cast<T>(relu_clamp(static_cast<P>(p[i]) * sc + sh));
        }
      } else {
        for (int64_t i = 0; i < d.s; ++i) q[i] = static_cast<T>(static_cast<P>(p[i]) * sc + sh);
      }
    }
  }
}

// Backward. With xhat = (x - mean) * invstd and per-channel sums sum_dy = sum(dy),
// sum_dy_xhat = sum(dy * xhat):
//   dweight = sum_dy_xhat, dbias = sum_dy,
//   training: dx = weight * invstd / M * (M * dy - sum_dy - xhat * sum_dy_xhat)
//             (the batch statistics depend on x, hence the two correction terms);
//   eval:     dx = weight * invstd * dy (the running statistics are constants).
// The two steps are separate functions because SyncBatchNorm all-reduces the sums between them.

// The rows of the gradient that reaches batch norm's output. For batch_norm: dy itself. For
// batch_norm_relu, whose backward folds relu's in: dy where the fused output y is > 0 and 0
// elsewhere, exactly what relu_backward would have written into a tensor of its own. Here it is
// written one row at a time into a buffer that stays in L1 cache: no full-size tensor, one pass
// over memory fewer, and the sums below keep loops without a condition, which the compiler
// vectorizes (with the condition inside, it does not).
template <class T>
class GradRows {
 public:
  // y: the fused output, or nullptr (no relu); s: the length of a row.
  GradRows(const T* dy, const T* y, int64_t s) : dy_(dy), y_(y), buf_(y ? s : 0) {}
  // The row that starts at `offset` (s values).
  const T* row(int64_t offset, int64_t s) {
    if (y_ == nullptr) return dy_ + offset;
    const T *g = dy_ + offset, *out = y_ + offset;
    for (int64_t i = 0; i < s; ++i) {
      const T gi = g[i];  // loaded whatever the sign: a load under the condition stays scalar
      buf_[i] = static_cast<compute_t<T>>(out[i]) > 0 ? gi : T(0);
    }
    return buf_.data();
  }

 private:
  const T *dy_, *y_;
  std::vector<T> buf_;
};

// sum(dy) and sum(dy * (x - mu)) over channel c.
template <class T>
DDP_CPU_CLONES void channel_grad_sums(const T* x, GradRows<T>& dy, const BnShape& d, int64_t c,
                                      double mu, double& sum_dy, double& sum_dy_xmu) {
  sum_dy = 0;
  sum_dy_xmu = 0;
  for (int64_t n = 0; n < d.n; ++n) {
    const int64_t row = (n * d.c + c) * d.s;
    const T *px = x + row, *pg = dy.row(row, d.s);
    sum_dy += row_sum<T>(d.s, [pg](int64_t i) { return static_cast<double>(pg[i]); });
    sum_dy_xmu += row_sum<T>(d.s, [pg, px, mu](int64_t i) {
      return static_cast<double>(pg[i]) * (static_cast<double>(px[i]) - mu);
    });
  }
}

// Training-mode dx over channel c from the sums over all `count` values of the channel:
// dx = k * (dy - mean_dy - (x - mu) * proj), k = weight * invstd, proj = sum_dy_xhat * invstd / M.
// In double even for float32: the three terms can nearly cancel, and in float32 the rounding of
// each (~1e-7 of it) is then a large part of dx; over a few steps that moved DDP with
// SyncBatchNorm away from single-process training by 5e-4 (tests/distributed, ddp_train_syncbn).
template <class T>
DDP_CPU_CLONES void channel_input_grad(const T* x, GradRows<T>& dy, const BnShape& d, int64_t c,
                                       double mu, double is, double g, double sum_dy,
                                       double sum_dy_xmu, double count, T* dx) {
  const double k = g * is;
  const double mean_dy = sum_dy / count;
  const double proj = sum_dy_xmu * is * is / count;
  for (int64_t n = 0; n < d.n; ++n) {
    const int64_t row = (n * d.c + c) * d.s;
    const T *px = x + row, *pg = dy.row(row, d.s);
    T* q = dx + row;
    for (int64_t i = 0; i < d.s; ++i) {
      const double dy = static_cast<double>(pg[i]), xmu = static_cast<double>(px[i]) - mu;
      q[i] = static_cast<T>(k * (dy - mean_dy - xmu * proj));
    }
  }
}

// batch_norm's backward, one channel at a time (the channel's x and dy are still in cache when
// dx is written). y: batch_norm_relu's output, whose sign masks dy, or nullptr for batch_norm.
template <class T>
DDP_CPU_CLONES void backward(const T* x, const T* dy_in, const T* y, const BnShape& d,
                             const double* mean, const double* invstd, const compute_t<T>* weight,
                             bool training, T* dx, compute_t<T>* dweight, compute_t<T>* dbias) {
  using P = compute_t<T>;
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    GradRows<T> dy(dy_in, y, d.s);
    const double mu = mean[c], is = invstd[c];
    double sum_dy = 0, sum_dy_xmu = 0;
    channel_grad_sums(x, dy, d, c, mu, sum_dy, sum_dy_xmu);
    if (dweight) dweight[c] = static_cast<P>(sum_dy_xmu * is);
    if (dbias) dbias[c] = static_cast<P>(sum_dy);
    if (!dx) continue;
    const double g = weight ? static_cast<double>(weight[c]) : 1.0;
    if (training) {
      channel_input_grad(x, dy, d, c, mu, is, g, sum_dy, sum_dy_xmu, static_cast<double>(d.count()),
                         dx);
    } else {
      const P k = static_cast<P>(g * is);
      for (int64_t n = 0; n < d.n; ++n) {
        const int64_t row = (n * d.c + c) * d.s;
        const T* pg = dy.row(row, d.s);
        T* q = dx + row;
        for (int64_t i = 0; i < d.s; ++i) q[i] = static_cast<T>(static_cast<P>(pg[i]) * k);
      }
    }
  }
}

// The two backward steps over all channels, for SyncBatchNorm (sums: [sum_dy (C), sum_dy_xmu (C)]).
template <class T>
void grad_sums(const T* x, const T* dy, const BnShape& d, const double* mean, double* sums) {
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    GradRows<T> rows(dy, nullptr, d.s);
    channel_grad_sums(x, rows, d, c, mean[c], sums[c], sums[d.c + c]);
  }
}

template <class T>
void input_grad(const T* x, const T* dy, const BnShape& d, const double* mean, const double* invstd,
                const T* weight, const double* sums, double count, T* dx) {
#pragma omp parallel for if (d.n * d.c * d.s > kParallelGrain)
  for (int64_t c = 0; c < d.c; ++c) {
    const double g = weight ? static_cast<double>(weight[c]) : 1.0;
    GradRows<T> rows(dy, nullptr, d.s);
    channel_input_grad(x, rows, d, c, mean[c], invstd[c], g, sums[c], sums[d.c + c], count, dx);
  }
}

// --- channels-last input ---------------------------------------------------------------------
//
// A channels-last x of shape [N, C, H, W] (Note [Channels last] in tensor/ops_create.cpp) is, in
// memory, P = N*H*W pixels of C values each, a pixel's channels side by side. The loops above
// would read it with a stride of C; the ones below walk memory in order instead and keep C sums,
// one per channel.
//
//  * Blocks. The pixels are cut into blocks of a fixed number of pixels, a few KB of x, so that a
//    block is still in L1 cache when a second pass over it needs it. Each block's partial sums are
//    computed on their own, in parallel, into the block's own slot; then one thread adds the
//    blocks up in block order, in double. The block boundaries depend on C and the dtype only,
//    never on the number of threads, so every sum is taken in the same order on 1 thread or 16:
//    same bits.
//  * Lanes. Inside a block the sums are kept for K pixels at once ("lanes": acc[k*C + c] for
//    pixel k of each group of K), so the inner loop runs over K*C consecutive values, each with
//    its own accumulator: long enough for the vector unit, and no add waits for another. With
//    only C accumulators, every pixel's adds would wait for the previous pixel's. At the end of
//    the block the K lanes of each channel are added up (fold_lanes). When C divides 128 (every
//    layer of the ResNets), a group is exactly kLaneValues values and the loops are compiled for
//    that width (the template argument L): a constant trip count and accumulators in a local
//    array, which the compiler keeps in vector registers.
//  * Precision. Within a block the lanes add in the arithmetic type P (float for float32 and
//    bfloat16), at most a few dozen values each; the blocks are merged in double. Per-value
//    float arithmetic halves the vector work of converting every value to double, which made
//    these loops slower than memory. The sums around the mean are taken around the mean rounded
//    to P and corrected exactly for the rounding (below), so nothing cancels.
//  * Variance. A block's mean is taken first, then its M2 = sum((x - block_mean)^2) in a second
//    pass over the block, from L1. The blocks then merge exactly (Chan et al.'s formula for
//    combining groups): M2 = sum_b M2_b + sum_b n_b * (mean_b - mean)^2, the spread of the block
//    means around the overall mean being exactly the part that the blocks' own M2 leave out. One
//    read of x from memory.
//
// Backward reads x and dy twice from memory here (once for the sums, once for dx), where the
// loops above find a small channel still in cache the second time: the sums are over all pixels,
// and every pixel holds every channel. For batch_norm_relu the mask y > 0 is recomputed from x
// with the forward's own scale and shift (the same operations on the same values as
// normalize_nhwc, hence the same mask bit for bit), so y is never read.

constexpr int64_t kLaneValues = 128;  // 8 AVX-512 registers of floats

// How a channels-last x is walked: p pixels of c channels, `lane` = k*c values per group of
// lanes (k pixels), blocks of `block` pixels (a multiple of k; the last block may be shorter).
//
// A blocked x (Note [Blocked activations] in tensor/blocked.cpp) is walked in the very same
// blocks and lanes, so that every sum, and hence every result, is the same bits as for the
// channels-last x: a float sum taken in another order rounds differently, and then a relu's mask
// can flip on a value within an ulp of zero, which moves that pixel's gradient by all of dy (a
// blocked walk of its own drifted 1e-4 from the channels-last one in three resnet20 steps, on a
// check that DDP meets to 2e-7). Its channels come in `parts` groups of c = 16, each a 16-channel
// NHWC plane per sample: `run` pixels (H*W), the sample's next group `part_stride` values
// further, its next sample `run_stride` values further. Block b covers the pixels of
// channels-last block b / parts for group b % parts, in segments cut where a sample ends; within
// a block a pixel's lanes are those of its position in the block mod k, as in the channels-last
// walk. The blocks are numbered sample range by sample range, so one parallel loop covers every
// group and each thread gets the samples the convolution before it wrote, still in its cache.
struct NhwcBlocks {
  int64_t p, c, lane, block;
  int64_t k = 1;                       // pixels per group of lanes
  int64_t run = 0, run_stride = 0;     // blocked only
  int64_t parts = 1, part_stride = 0;  // groups of c channels (blocked: C / 16)
  int64_t channels() const { return c * parts; }
  int64_t group(int64_t b) const { return b % parts; }
  int64_t count() const { return (p + block - 1) / block * parts; }
  int64_t first_pixel(int64_t b) const { return b / parts * block; }
  int64_t pixels(int64_t b) const { return std::min(block, p - first_pixel(b)); }
  // Where block b's first pixel's values start.
  int64_t first_value(int64_t b) const {
    const int64_t q = first_pixel(b);
    if (run == 0) return q * c;
    return q / run * run_stride + group(b) * part_stride + q % run * c;
  }
};

// Blocks for x of shape d: channels-last (block 0), or blocked in groups of `block` channels,
// walked as the channels-last x would be.
template <class T>
NhwcBlocks nhwc_blocks(const BnShape& d, int64_t block = 0) {
  constexpr int64_t kBlockBytes = 16384;
  const int64_t k = std::max<int64_t>(1, kLaneValues / d.c);
  const int64_t groups = std::max<int64_t>(1, kBlockBytes / (k * d.c * int64_t{sizeof(T)}));
  NhwcBlocks blk{d.n * d.s, d.c, k * d.c, k * groups, k};
  if (block != 0) {
    blk.c = block;
    blk.lane = k * block;
    blk.run = d.s;
    blk.run_stride = d.c * d.s;
    blk.parts = d.c / block;
    blk.part_stride = block * d.s;
  }
  return blk;
}

// Calls run(std::integral_constant<int64_t, L>) with L = kLaneValues when the lanes are that wide,
// else with L = 0 (the width known only at run time).
//
// The blocked loops of 32 and 64 channels have lanes of 64 and 32 values (k = 4 and 2 pixels of
// 16 channels), also compiled for their width.
template <class F>
void with_lane_width(const NhwcBlocks& blk, F run) {
  if (blk.lane == kLaneValues) {
    run(std::integral_constant<int64_t, kLaneValues>{});
  } else if (blk.lane == 64) {
    run(std::integral_constant<int64_t, 64>{});
  } else if (blk.lane == 32) {
    run(std::integral_constant<int64_t, 32>{});
  } else {
    run(std::integral_constant<int64_t, 0>{});
  }
}

// A lane's worth of values: on the stack when the width L is a constant, else on the heap.
template <class P, int64_t L>
class LaneArray {
 public:
  explicit LaneArray(int64_t /*lane*/) {}
  P* data() { return a_.data(); }

 private:
  alignas(64) std::array<P, static_cast<size_t>(L)> a_{};
};

template <class P>
class LaneArray<P, 0> {
 public:
  explicit LaneArray(int64_t lane) : v_(static_cast<size_t>(lane)) {}
  P* data() { return v_.data(); }

 private:
  std::vector<P> v_;
};

// The channel of lane j of group g's lanes.
inline int64_t lane_channel(const NhwcBlocks& blk, int64_t g, int64_t j) {
  return g * blk.c + j % blk.c;
}

// A per-channel value repeated over the lanes, in type P, one set of lanes per group:
// out[g * lane + j] = v[lane_channel(g, j)]. Block b reads the set at group(b) * lane.
template <class P, class V>
std::vector<P> over_lanes(const NhwcBlocks& blk, const V* v) {
  std::vector<P> out(static_cast<size_t>(blk.parts * blk.lane));
  for (int64_t g = 0; g < blk.parts; ++g) {
    for (int64_t j = 0; j < blk.lane; ++j) {
      out[static_cast<size_t>(g * blk.lane + j)] = static_cast<P>(v[lane_channel(blk, g, j)]);
    }
  }
  return out;
}

// Copies a per-channel value at lanes[0, c) to the rest of the lanes (per block: no j mod c).
template <class P>
inline void repeat_over_lanes(P* lanes, int64_t c, int64_t lane) {
  for (int64_t j = c; j < lane; ++j) lanes[j] = lanes[j - c];
}

// The segments of block b, one after the other: n values from offset `start` in the array, the
// first of them in lane j0. A channels-last block is one segment; a blocked one is cut where a
// sample's plane ends (a 16 KB block spans four 8x8 planes of resnet20's last stage). The
// kernels loop over them with a plain `for (Segments sg(blk, b); sg.next();)` and run
// for_lanes_from on each: one lambda deep, which the compiler inlines into the AVX-512 copy of
// the kernel and vectorizes (with the segment walk in a helper taking a lambda of its own, it did
// not: resnet20's batch_norm_relu backward took twice as long).
class Segments {
 public:
  int64_t start = 0, n = 0, j0 = 0;
  Segments(const NhwcBlocks& blk, int64_t b)
      : blk_(blk), b_(b), first_(blk.first_pixel(b)), q_(first_), end_(first_ + blk.pixels(b)) {}
  bool next() {
    if (q_ >= end_) return false;
    if (blk_.run == 0) {
      start = q_ * blk_.c;
      n = (end_ - q_) * blk_.c;
      j0 = 0;
      q_ = end_;
      return true;
    }
    const int64_t sample = q_ / blk_.run, at = q_ % blk_.run;
    const int64_t len = std::min(end_ - q_, blk_.run - at);
    start = sample * blk_.run_stride + blk_.group(b_) * blk_.part_stride + at * blk_.c;
    n = len * blk_.c;
    j0 = (q_ - first_) % blk_.k * blk_.c;
    q_ += len;
    return true;
  }

 private:
  const NhwcBlocks& blk_;
  int64_t b_, first_, q_, end_;
};

// Calls body(i, j) for the values [0, n) of a segment (whole pixels), i the value's offset and j
// its lane, the first value in lane j0: the rest of that group of lanes, then whole groups (a
// constant trip count when lane is one), then the last, shorter group. The inner loops carry
// nothing from one j to the next, so they vectorize.
template <class F>
DDP_ALWAYS_INLINE void for_lanes_from(int64_t j0, int64_t n, int64_t lane, F body) {
  int64_t i = 0;
  if (j0 != 0) {
    for (int64_t j = j0; j < lane && i < n; ++j, ++i) body(i, j);
  }
  for (; i + lane <= n; i += lane) {
    for (int64_t j = 0; j < lane; ++j) body(i + j, j);
  }
  for (int64_t j = 0; i + j < n; ++j) body(i + j, j);
}

// out[ch] = the sum of a block's lanes of channel ch, lane by lane in order, in double.
template <class P>
inline void fold_lanes(const P* acc, int64_t lane, int64_t c, double* out) {
  std::fill(out, out + c, 0.0);
  for (int64_t k = 0; k < lane; k += c) {
    for (int64_t ch = 0; ch < c; ++ch) out[ch] += static_cast<double>(acc[k + ch]);
  }
}

// Whether the block loops are worth waking the thread pool for.
bool parallel(const NhwcBlocks& blk) {
  return blk.p * blk.channels() > kParallelGrain;
}

// Adds the blocks' per-channel partial sums up, in block order, into out[what * C + channel]:
// part holds `width` sums of c values per block ([blocks][width][c]); C = blk.channels().
inline void merge_blocks(const NhwcBlocks& blk, const std::vector<double>& part, int64_t width,
                         double* out) {
  const int64_t c = blk.c, C = blk.channels();
  std::fill(out, out + width * C, 0.0);
  for (int64_t b = 0; b < blk.count(); ++b) {
    const double* sum = &part[static_cast<size_t>(b * width * c)];
    for (int64_t w = 0; w < width; ++w) {
      double* o = out + w * C + blk.group(b) * c;
      for (int64_t ch = 0; ch < c; ++ch) o[ch] += sum[w * c + ch];
    }
  }
}

// batch_moments for channels-last x: each block's sum and M2 into part ([blocks][2][C]), then
// the merge in block order.
template <class T, int64_t L>
DDP_CPU_CLONES void moments_lanes(const T* x, const NhwcBlocks& blk, double* mean, double* m2) {
  using P = compute_t<T>;
  const int64_t c = blk.c, lane = L ? L : blk.lane;
  std::vector<double> part(static_cast<size_t>(blk.count() * 2 * c));
#pragma omp parallel if (parallel(blk))
  {
    LaneArray<P, L> acc_lanes(lane), mu_lanes(lane);
    P *acc = acc_lanes.data(), *mu = mu_lanes.data();
    std::vector<double> block_mean(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blk.count(); ++b) {
      const T* xb = x + blk.first_value(b);
      double* sum = &part[static_cast<size_t>(b * 2 * c)];
      const double nb = static_cast<double>(blk.pixels(b));
      // The sum is taken of x - ref, ref = the block's first pixel: values near the mean then
      // add as small deviations, not as offsets that a float sum would round away.
      for (int64_t ch = 0; ch < c; ++ch) mu[ch] = static_cast<P>(xb[ch]);
      repeat_over_lanes(mu, c, lane);
      std::fill(acc, acc + lane, P(0));
      for (Segments sg(blk, b); sg.next();) {
        const T* px = x + sg.start;
        for_lanes_from(sg.j0, sg.n, lane,
                       [&](int64_t i, int64_t j) { acc[j] += static_cast<P>(px[i]) - mu[j]; });
      }
      fold_lanes(acc, lane, c, sum);
      for (int64_t ch = 0; ch < c; ++ch) {
        block_mean[static_cast<size_t>(ch)] = sum[ch] / nb + static_cast<double>(mu[ch]);
        sum[ch] = block_mean[static_cast<size_t>(ch)] * nb;
      }
      for (int64_t ch = 0; ch < c; ++ch)
        mu[ch] = static_cast<P>(block_mean[static_cast<size_t>(ch)]);
      repeat_over_lanes(mu, c, lane);
      std::fill(acc, acc + lane, P(0));
      for (Segments sg(blk, b); sg.next();) {
        const T* px = x + sg.start;
        for_lanes_from(sg.j0, sg.n, lane, [&](int64_t i, int64_t j) {
          const P dx = static_cast<P>(px[i]) - mu[j];
          acc[j] += dx * dx;
        });
      }
      fold_lanes(acc, lane, c, sum + c);
      // The squares were taken around mu, the block mean rounded to P: sum((x - mu)^2) =
      // M2_b + n_b * (mean_b - mu)^2, since the deviations from mean_b sum to zero.
      for (int64_t ch = 0; ch < c; ++ch) {
        const double off = block_mean[static_cast<size_t>(ch)] - static_cast<double>(mu[ch]);
        sum[c + ch] -= nb * off * off;
      }
    }
  }
  const int64_t channels = blk.channels();
  std::fill(mean, mean + channels, 0.0);
  std::fill(m2, m2 + channels, 0.0);
  for (int64_t b = 0; b < blk.count(); ++b) {
    double* m = mean + blk.group(b) * c;
    for (int64_t ch = 0; ch < c; ++ch) m[ch] += part[static_cast<size_t>(b * 2 * c + ch)];
  }
  for (int64_t ch = 0; ch < channels; ++ch) mean[ch] /= static_cast<double>(blk.p);
  for (int64_t b = 0; b < blk.count(); ++b) {
    const double nb = static_cast<double>(blk.pixels(b));
    const double* sum = &part[static_cast<size_t>(b * 2 * c)];
    const double* m = mean + blk.group(b) * c;
    double* q = m2 + blk.group(b) * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      const double spread = sum[ch] / nb - m[ch];
      q[ch] += sum[c + ch] + nb * spread * spread;
    }
  }
}

// block: 0 for channels-last x, else the blocked layout's (nhwc_blocks); likewise below.
template <class T>
void batch_moments_nhwc(const T* x, const BnShape& d, double* mean, double* m2, int64_t block = 0) {
  const NhwcBlocks blk = nhwc_blocks<T>(d, block);
  with_lane_width(blk, [&](auto L) { moments_lanes<T, L.value>(x, blk, mean, m2); });
}

// normalize's scale and shift (scale_shift) over the lanes.
template <class P>
struct ScaleShiftLanes {
  std::vector<P> sc, sh;
  ScaleShiftLanes(const NhwcBlocks& blk, const double* mean, const double* invstd, const P* weight,
                  const P* bias)
      : sc(static_cast<size_t>(blk.parts * blk.lane)), sh(sc.size()) {
    for (int64_t g = 0; g < blk.parts; ++g) {
      for (int64_t j = 0; j < blk.lane; ++j) {
        const auto at = static_cast<size_t>(g * blk.lane + j);
        scale_shift(mean, invstd, weight, bias, lane_channel(blk, g, j), sc[at], sh[at]);
      }
    }
  }
};

// normalize for channels-last x: the same scale and shift per channel, the same clamp. With a
// residual r (batch_norm_add_relu): y = relu(normalized + r), rounded and clamped exactly as
// add_relu does it after a separate batch_norm, without writing and reading back the normalized
// tensor.
template <class T, bool kRelu, bool kAdd, int64_t L>
DDP_CPU_CLONES void normalize_lanes(const T* x, const T* residual, const NhwcBlocks& blk,
                                    const ScaleShiftLanes<compute_t<T>>& lanes, T* y) {
  using P = compute_t<T>;
  const int64_t lane = L ? L : blk.lane;
#pragma omp parallel for schedule(static) if (parallel(blk))
  for (int64_t b = 0; b < blk.count(); ++b) {
    const P* psc = lanes.sc.data() + blk.group(b) * lane;
    const P* psh = lanes.sh.data() + blk.group(b) * lane;
    for (Segments sg(blk, b); sg.next();) {
      const T* p = x + sg.start;
      const T* r = kAdd ? residual + sg.start : nullptr;
      T* q = y + sg.start;
      for_lanes_from(sg.j0, sg.n, lane, [&](int64_t i, int64_t j) {
        const P v = static_cast<P>(p[i]) * psc[j] + psh[j];
        if constexpr (kAdd) {
          // The normalized value rounded to T, as batch_norm stores it; the sum rounded to T
          // once, after the clamp, which is the same number (rounding keeps the sign; NaN stays
          // NaN) and lets the loop vectorize.
          const P sum = static_cast<P>(static_cast<T>(v)) + static_cast<P>(r[i]);
          q[i] = static_cast<T>(relu_clamp(sum));
        } else {
          q[i] = static_cast<T>(kRelu ? relu_clamp(v) : v);
        }
      });
    }
  }
}

template <class T, bool kRelu = false>
void normalize_nhwc(const T* x, const BnShape& d, const double* mean, const double* invstd,
                    const compute_t<T>* weight, const compute_t<T>* bias, T* y, int64_t block = 0) {
  const NhwcBlocks blk = nhwc_blocks<T>(d, block);
  const ScaleShiftLanes<compute_t<T>> lanes(blk, mean, invstd, weight, bias);
  with_lane_width(
      blk, [&](auto L) { normalize_lanes<T, kRelu, false, L.value>(x, nullptr, blk, lanes, y); });
}

template <class T>
void normalize_add_relu_nhwc(const T* x, const T* residual, const BnShape& d, const double* mean,
                             const double* invstd, const compute_t<T>* weight,
                             const compute_t<T>* bias, T* y, int64_t block = 0) {
  const NhwcBlocks blk = nhwc_blocks<T>(d, block);
  const ScaleShiftLanes<compute_t<T>> lanes(blk, mean, invstd, weight, bias);
  with_lane_width(
      blk, [&](auto L) { normalize_lanes<T, true, true, L.value>(x, residual, blk, lanes, y); });
}

// dy as the backward sees it: for batch_norm_relu (relu: normalize's scale and shift over the
// lanes) zero where the forward's output was not positive. The mask y > 0 is v > 0 for the same
// v = x * scale + shift that normalize_nhwc clamped (NaN: neither), so no y is read. sc, sh: the
// lanes of the block's group.
template <class T, bool kRelu>
DDP_ALWAYS_INLINE compute_t<T> masked_grad(const T* x, const T* dy, const compute_t<T>* sc,
                                           const compute_t<T>* sh, int64_t i, int64_t j) {
  using P = compute_t<T>;
  const P g = static_cast<P>(dy[i]);
  if constexpr (kRelu) {
    const P v = static_cast<P>(x[i]) * sc[j] + sh[j];
    return v > P(0) ? g : P(0);
  }
  return g;
}

// Calls run(L, kRelu) with the lane width as with_lane_width and kRelu = (relu != nullptr).
template <class T, class F>
void with_lanes_and_mask(const NhwcBlocks& blk, const ScaleShiftLanes<compute_t<T>>* relu, F run) {
  with_lane_width(blk, [&](auto L) {
    if (relu) {
      run(L, std::true_type{});
    } else {
      run(L, std::false_type{});
    }
  });
}

// relu's backward, dy_masked = y > 0 ? dy : 0 for n values: ReluBackwardOp itself, applied in P
// and rounded back to T, which is exact (a select on bfloat16 values compiles to scalar code with
// a branch per value: the bfloat16 node took 3.5x as long).
template <class T>
DDP_ALWAYS_INLINE void mask_by_output(const T* dy, const T* y, int64_t n, T* dy_masked) {
  using P = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    dy_masked[i] = static_cast<T>(
        functors::ReluBackwardOp::apply(static_cast<P>(dy[i]), static_cast<P>(y[i]), P(0), P(0)));
  }
}

// grad_sums for channels-last x: sums = [sum_dy (C), sum_dy_xmu (C)], per block, then merged in
// block order. The products are taken around the mean rounded to P (mu) and corrected after the
// merge: sum(dy * (x - mean)) = sum(dy * (x - mu)) + sum(dy) * (mu - mean).
// kMaskY (batch_norm_add_relu): dy is masked by its own output y first, relu's backward, and the
// masked dy is written to dy_masked on the way (the residual's gradient, and what dx is computed
// from), which saves that pass reading its result back.
template <class T, bool kRelu, bool kMaskY, int64_t L>
DDP_CPU_CLONES void grad_sums_lanes(const T* x, const T* dy,
                                    const ScaleShiftLanes<compute_t<T>>* relu, const T* y,
                                    T* dy_masked, const NhwcBlocks& blk, const double* mean,
                                    double* sums) {
  using P = compute_t<T>;
  const int64_t c = blk.c, lane = L ? L : blk.lane;
  const std::vector<P> mu = over_lanes<P>(blk, mean);
  std::vector<double> part(static_cast<size_t>(blk.count() * 2 * c));
#pragma omp parallel if (parallel(blk))
  {
    LaneArray<P, L> dy_lanes(lane), dy_xmu_lanes(lane);
    P *acc_dy = dy_lanes.data(), *acc_dy_xmu = dy_xmu_lanes.data();
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blk.count(); ++b) {
      std::fill(acc_dy, acc_dy + lane, P(0));
      std::fill(acc_dy_xmu, acc_dy_xmu + lane, P(0));
      const int64_t at = blk.group(b) * lane;
      const P* pmu = mu.data() + at;
      const P* rsc = kRelu ? relu->sc.data() + at : nullptr;
      const P* rsh = kRelu ? relu->sh.data() + at : nullptr;
      for (Segments sg(blk, b); sg.next();) {
        const T* px = x + sg.start;
        const T* pdy = dy + sg.start;
        if constexpr (kMaskY) {
          // Masked into dy_masked first, then summed from there: the segment is still in cache,
          // and each loop stays simple enough to vectorize (writing dy_masked from inside the
          // sums loop made bfloat16's step 30% longer).
          T* masked = dy_masked + sg.start;
          mask_by_output(pdy, y + sg.start, sg.n, masked);
          pdy = masked;
        }
        for_lanes_from(sg.j0, sg.n, lane, [&](int64_t i, int64_t j) {
          const P g = masked_grad<T, kRelu>(px, pdy, rsc, rsh, i, j);
          acc_dy[j] += g;
          acc_dy_xmu[j] += g * (static_cast<P>(px[i]) - pmu[j]);
        });
      }
      double* out = &part[static_cast<size_t>(b * 2 * c)];
      fold_lanes(acc_dy, lane, c, out);
      fold_lanes(acc_dy_xmu, lane, c, out + c);
    }
  }
  merge_blocks(blk, part, 2, sums);
  const int64_t channels = blk.channels();
  for (int64_t ch = 0; ch < channels; ++ch) {
    sums[channels + ch] += sums[ch] * (static_cast<double>(static_cast<P>(mean[ch])) - mean[ch]);
  }
}

// y, dy_masked: as kMaskY above, or both nullptr.
template <class T>
void grad_sums_nhwc(const T* x, const T* dy, const ScaleShiftLanes<compute_t<T>>* relu, const T* y,
                    T* dy_masked, const NhwcBlocks& blk, const double* mean, double* sums) {
  if (y != nullptr) {
    with_lane_width(blk, [&](auto L) {
      grad_sums_lanes<T, false, true, L.value>(x, dy, nullptr, y, dy_masked, blk, mean, sums);
    });
    return;
  }
  with_lanes_and_mask<T>(blk, relu, [&](auto L, auto relu_on) {
    grad_sums_lanes<T, relu_on.value, false, L.value>(x, dy, relu, nullptr, nullptr, blk, mean,
                                                      sums);
  });
}

// dx for channels-last x. Training (kTraining), from the sums over all pixels, as
// channel_input_grad: dx = k * (dy - mean_dy - (x - mean) * proj); eval: dx = k * dy (the
// statistics are constants). f: k, and for training mean_dy, proj and the mean, over the lanes;
// the per-channel factors are taken in double, the per-value arithmetic in P.
template <class T, bool kRelu, bool kTraining, int64_t L>
DDP_CPU_CLONES void input_grad_lanes(const T* x, const T* dy,
                                     const ScaleShiftLanes<compute_t<T>>* relu,
                                     const NhwcBlocks& blk, const std::vector<compute_t<T>>* f,
                                     T* dx) {
  using P = compute_t<T>;
  const int64_t lane = L ? L : blk.lane;
#pragma omp parallel for schedule(static) if (parallel(blk))
  for (int64_t b = 0; b < blk.count(); ++b) {
    const int64_t at = blk.group(b) * lane;
    const P* pk = f[0].data() + at;
    const P *pmdy = kTraining ? f[1].data() + at : nullptr,
            *pproj = kTraining ? f[2].data() + at : nullptr,
            *pmu = kTraining ? f[3].data() + at : nullptr;
    const P* rsc = kRelu ? relu->sc.data() + at : nullptr;
    const P* rsh = kRelu ? relu->sh.data() + at : nullptr;
    for (Segments sg(blk, b); sg.next();) {
      const T* px = x + sg.start;
      const T* pdy = dy + sg.start;
      T* q = dx + sg.start;
      for_lanes_from(sg.j0, sg.n, lane, [&](int64_t i, int64_t j) {
        const P g = masked_grad<T, kRelu>(px, pdy, rsc, rsh, i, j);
        if constexpr (kTraining) {
          const P xmu = static_cast<P>(px[i]) - pmu[j];
          q[i] = static_cast<T>(pk[j] * (g - pmdy[j] - xmu * pproj[j]));
        } else {
          q[i] = static_cast<T>(g * pk[j]);
        }
      });
    }
  }
}

template <class T>
void input_grad_nhwc(const T* x, const T* dy, const ScaleShiftLanes<compute_t<T>>* relu,
                     const NhwcBlocks& blk, const BnShape& d, const double* mean,
                     const double* invstd, const compute_t<T>* weight, const double* sums,
                     double count, T* dx) {
  using P = compute_t<T>;
  const size_t c = static_cast<size_t>(d.c);
  std::vector<double> k(c), mean_dy(c), proj(c);
  for (size_t ch = 0; ch < c; ++ch) {
    const double g = weight ? static_cast<double>(weight[ch]) : 1.0, is = invstd[ch];
    k[ch] = g * is;
    mean_dy[ch] = sums[ch] / count;
    proj[ch] = sums[c + ch] * is * is / count;
  }
  const std::vector<P> f[4] = {over_lanes<P>(blk, k.data()), over_lanes<P>(blk, mean_dy.data()),
                               over_lanes<P>(blk, proj.data()), over_lanes<P>(blk, mean)};
  with_lanes_and_mask<T>(blk, relu, [&](auto L, auto relu_on) {
    input_grad_lanes<T, relu_on.value, true, L.value>(x, dy, relu, blk, f, dx);
  });
}

template <class T>
void eval_input_grad_nhwc(const T* x, const T* dy, const ScaleShiftLanes<compute_t<T>>* relu,
                          const NhwcBlocks& blk, const BnShape& d, const double* invstd,
                          const compute_t<T>* weight, T* dx) {
  using P = compute_t<T>;
  std::vector<double> k(static_cast<size_t>(d.c));
  for (int64_t ch = 0; ch < d.c; ++ch) {
    k[static_cast<size_t>(ch)] = (weight ? static_cast<double>(weight[ch]) : 1.0) * invstd[ch];
  }
  const std::vector<P> f[1] = {over_lanes<P>(blk, k.data())};
  with_lanes_and_mask<T>(blk, relu, [&](auto L, auto relu_on) {
    input_grad_lanes<T, relu_on.value, false, L.value>(x, dy, relu, blk, f, dx);
  });
}

// backward for channels-last x: the sums in one pass over x and dy, dx in a second. relu: for
// batch_norm_relu, whose mask is recomputed from x with the forward's weight and bias (bias: may
// be nullptr, as in the forward). y: for batch_norm_add_relu, its output, whose sign masks dy;
// the masked dy (relu's backward, the residual's gradient) goes to dy_masked, in the sums pass
// when there is one, and batch norm's own backward is the plain one from it.
template <class T>
void backward_nhwc(const T* x, const T* dy, bool relu, const compute_t<T>* bias, const T* y,
                   T* dy_masked, const BnShape& d, const double* mean, const double* invstd,
                   const compute_t<T>* weight, bool training, T* dx, compute_t<T>* dweight,
                   compute_t<T>* dbias, int64_t block = 0) {
  using P = compute_t<T>;
  const NhwcBlocks blk = nhwc_blocks<T>(d, block);
  std::unique_ptr<ScaleShiftLanes<P>> lanes;
  if (relu) lanes = std::make_unique<ScaleShiftLanes<P>>(blk, mean, invstd, weight, bias);
  const ScaleShiftLanes<P>* r = lanes.get();
  std::vector<double> sums(static_cast<size_t>(2 * d.c));
  if (dweight || dbias || (dx && training)) {
    grad_sums_nhwc(x, dy, r, y, dy_masked, blk, mean, sums.data());
  } else if (y != nullptr) {
#pragma omp parallel for schedule(static) if (parallel(blk))
    for (int64_t b = 0; b < blk.count(); ++b) {
      for (Segments sg(blk, b); sg.next();) {
        mask_by_output(dy + sg.start, y + sg.start, sg.n, dy_masked + sg.start);
      }
    }
  }
  if (y != nullptr) dy = dy_masked;
  for (int64_t c = 0; c < d.c; ++c) {
    if (dweight) dweight[c] = static_cast<P>(sums[static_cast<size_t>(d.c + c)] * invstd[c]);
    if (dbias) dbias[c] = static_cast<P>(sums[static_cast<size_t>(c)]);
  }
  if (!dx) return;
  if (training) {
    input_grad_nhwc(x, dy, r, blk, d, mean, invstd, weight, sums.data(),
                    static_cast<double>(d.count()), dx);
  } else {
    eval_input_grad_nhwc(x, dy, r, blk, d, invstd, weight, dx);
  }
}

// The values of t as they lie: blocked bytes not rearranged when block != 0 (the loops walk them
// blocked), else t's data as any kernel reads it.
template <class T>
T* stored(const Tensor& t, int64_t block) {
  return ops::in_layout(t, block).data_ptr<T>();
}

// A new tensor of x's shape and dtype in x's layout: blocked like x, or `format`.
Tensor like(const Tensor& x, int64_t block, ops::MemoryFormat format) {
  return ops::empty_in_layout(x.shape(), x.options(), block, format);
}

// The dtype of weight and bias (and their gradients) for input x: x's, except that bfloat16
// activations take float32 ones (the master weights of autocast).
DType param_dtype(const Tensor& x) {
  return x.dtype() == kBFloat16 ? kFloat32 : x.dtype();
}

// A defined [C] tensor as a contiguous one of param_dtype(x) (or undefined).
Tensor param_or_none(const Tensor& t, const Tensor& x, int64_t c, const char* name) {
  if (!t.defined()) return t;
  DDP_CHECK(t.dim() == 1 && t.size(0) == c,
            "batch_norm: " << name << " has shape " << shape_str(t.shape()) << " but input "
                           << shape_str(x.shape()) << " has " << c << " channels");
  DDP_CHECK(t.dtype() == param_dtype(x),
            "batch_norm: " << name << " is " << dtype_name(t.dtype()) << " but the input is "
                           << dtype_name(x.dtype()) << " (expected a " << name << " of "
                           << dtype_name(param_dtype(x)) << ")");
  DDP_CHECK(t.device() == x.device(), "batch_norm: " << name << " is on " << t.device()
                                                     << " but the input on " << x.device());
  return ops::contiguous(t);
}

std::vector<double> to_doubles(const Tensor& t) {
  return t.to_vector<double>();
}

// batch_norm, and with fuse_relu batch_norm_relu: relu(batch_norm(...)) with the clamp in the
// normalize pass and relu's backward folded into batch norm's (GradRows above). With a residual
// as well, batch_norm_add_relu: relu(batch_norm(...) + residual), x channels-last and the
// residual of x's shape and dtype (the caller checks).
Tensor batch_norm_impl(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight_in, const Tensor& bias_in, bool training,
                       double momentum, double eps, bool fuse_relu,
                       const Tensor& residual_in = Tensor()) {
  DDP_CHECK(x_in.defined(), "batch_norm: input is undefined");
  DDP_CHECK(x_in.dim() == 2 || x_in.dim() == 4 || x_in.dim() == 3,
            "batch_norm: expected input [N, C], [N, C, L] or [N, C, H, W], got shape "
                << shape_str(x_in.shape()));
#if !defined(DDP_CUDA)
  DDP_CHECK(!x_in.is_cuda(), "batch_norm: not implemented on CUDA yet; run it on the CPU");
#endif
  DDP_CHECK(x_in.dtype() == kFloat32 || x_in.dtype() == kFloat64 || x_in.dtype() == kBFloat16,
            "batch_norm: supports float32, float64 and bfloat16, got " << dtype_name(x_in.dtype()));
  const BnShape d = bn_shape(x_in);
  Tensor weight = param_or_none(weight_in, x_in, d.c, "weight");
  Tensor bias = param_or_none(bias_in, x_in, d.c, "bias");
  DDP_CHECK(running_mean.defined() == running_var.defined(),
            "batch_norm: pass both running_mean and running_var, or neither");
  if (running_mean.defined()) {
    for (const Tensor* r : {&running_mean, &running_var}) {
      DDP_CHECK(r->numel() == d.c, "batch_norm: running statistics of shape "
                                       << shape_str(r->shape()) << " do not match input "
                                       << shape_str(x_in.shape()) << " (" << d.c << " channels)");
    }
  }
  // Without running statistics, eval mode normalizes with the batch's own (as PyTorch).
  const bool use_batch_stats = training || !running_mean.defined();
  if (use_batch_stats) {
    DDP_CHECK(d.count() > 1,
              "batch_norm: expected more than 1 value per channel when training, "
              "got input of shape "
                  << shape_str(x_in.shape()));
  }

#if defined(DDP_CUDA)
  if (x_in.is_cuda()) {
    Tensor y = cudnn::batch_norm(x_in, running_mean, running_var, weight_in, bias_in, weight, bias,
                                 training, use_batch_stats, momentum, eps);
    return fuse_relu ? relu(y) : y;  // cuDNN's own fused mode is not wired up: two kernels
  }
#endif

  // A channels-last x stays so and runs the NHWC loops; anything else is made contiguous. A
  // blocked x (Note [Blocked activations] in tensor/blocked.cpp) runs them too (NhwcBlocks), and
  // its output, residual and gradients are blocked alike.
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;
  const bool add = residual_in.defined();
  Tensor residual = add ? ops::contiguous(residual_in, format) : Tensor();
  if (add && block != 0) residual = ops::to_blocked(residual, block);
  std::vector<double> mean(static_cast<size_t>(d.c)), var(static_cast<size_t>(d.c));
  if (use_batch_stats) {
    DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm", {
      if (nhwc) {
        batch_moments_nhwc(stored<scalar_t>(x, block), d, mean.data(), var.data(), block);
      } else {
        batch_moments(x.data_ptr<scalar_t>(), d, mean.data(), var.data());
      }
    });
    for (double& v : var) v /= static_cast<double>(d.count());  // M2 -> biased variance
  } else {
    mean = to_doubles(running_mean);
    var = to_doubles(running_var);
  }
  std::vector<double> invstd(mean.size());
  for (size_t c = 0; c < mean.size(); ++c) invstd[c] = 1.0 / std::sqrt(var[c] + eps);

  if (training && running_mean.defined()) {
    // In place, outside the graph: running statistics are buffers, not parameters.
    std::vector<double> rm = to_doubles(running_mean), rv = to_doubles(running_var);
    const double unbias = static_cast<double>(d.count()) / static_cast<double>(d.count() - 1);
    for (size_t c = 0; c < rm.size(); ++c) {
      rm[c] = (1 - momentum) * rm[c] + momentum * mean[c];
      rv[c] = (1 - momentum) * rv[c] + momentum * var[c] * unbias;
    }
    ops::copy_(running_mean, ops::from_vector(rm, running_mean.shape()));
    ops::copy_(running_var, ops::from_vector(rv, running_var.shape()));
  }

  Tensor y = like(x, block, format);
  DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm", {
    using param_t = compute_t<scalar_t>;
    const param_t* w = weight.defined() ? weight.data_ptr<param_t>() : nullptr;
    const param_t* b = bias.defined() ? bias.data_ptr<param_t>() : nullptr;
    const scalar_t* px = stored<scalar_t>(x, block);
    scalar_t* py = stored<scalar_t>(y, block);
    if (add) {
      normalize_add_relu_nhwc(px, stored<scalar_t>(residual, block), d, mean.data(), invstd.data(),
                              w, b, py, block);
    } else if (nhwc && fuse_relu) {
      normalize_nhwc<scalar_t, true>(px, d, mean.data(), invstd.data(), w, b, py, block);
    } else if (nhwc) {
      normalize_nhwc(px, d, mean.data(), invstd.data(), w, b, py, block);
    } else if (fuse_relu) {
      normalize<scalar_t, true>(x.data_ptr<scalar_t>(), d, mean.data(), invstd.data(), w, b,
                                y.data_ptr<scalar_t>());
    } else {
      normalize(x.data_ptr<scalar_t>(), d, mean.data(), invstd.data(), w, b,
                y.data_ptr<scalar_t>());
    }
  });

  std::vector<Tensor> inputs{x_in};
  if (weight.defined()) inputs.push_back(weight_in);
  if (bias.defined()) inputs.push_back(bias_in);
  if (add) inputs.push_back(residual_in);
  if (!autograd::needs_grad(inputs)) return y;
  Tensor stats = ops::from_vector(mean, {d.c}, kFloat64);
  Tensor stats_invstd = ops::from_vector(invstd, {d.c}, kFloat64);
  const bool has_w = weight.defined(), has_b = bias.defined();
  autograd::Saved saved{x, stats, stats_invstd};
  if (has_w) saved.push_back(weight);
  // The fused op's mask is its own output's sign (as relu's backward, which saves its output).
  // For channels-last x, the backward recomputes the mask from x, with the bias (masked_grad),
  // except with a residual, which the mask depends on too.
  const size_t iy = saved.size();
  if (fuse_relu && (!nhwc || add)) saved.push_back(y);
  if (fuse_relu && nhwc && !add && has_b) saved.push_back(bias);
  const char* name = add         ? "NativeBatchNormAddReluBackward"
                     : fuse_relu ? "NativeBatchNormReluBackward"
                                 : "NativeBatchNormBackward";
  return autograd::record(
      name, y, inputs, std::move(saved),
      [d, use_batch_stats, has_w, has_b, fuse_relu, add, iy, format, nhwc](
          const Tensor& grad, const autograd::Saved& s, const autograd::Needs& needs) {
        const Tensor& x = s[0];
        // dy in the output's dtype, x's (a float32 consumer of a bfloat16 output sends float32).
        Tensor dy = ops::contiguous(ops::to(grad, x.dtype()), format);
        // x may have been rearranged since the forward (by a reader unaware of the blocked
        // layout); if it is still blocked, dy (and y) are brought to its layout.
        const int64_t block = nhwc ? ops::blocked_block(x) : 0;
        if (block != 0) dy = ops::to_blocked(dy, block);
        const Tensor y_saved = add && block != 0 ? ops::to_blocked(s[iy], block)
                               : add             ? s[iy]
                                                 : Tensor();
        // With a residual, relu's masked gradient is what both batch norm and the residual get
        // (add_relu's backward); backward_nhwc computes it.
        Tensor dy_masked = add ? like(x, block, format) : Tensor();
        const bool relu_in_bn = fuse_relu && !add;
        autograd::Grads g(needs.size());
        Tensor dx = needs[0] ? like(x, block, format) : Tensor();
        const size_t iw = 1, ib = has_w ? 2 : 1;
        const TensorOptions param_options = x.options().with_dtype(param_dtype(x));
        Tensor dw = has_w && needs[iw] ? ops::empty({d.c}, param_options) : Tensor();
        Tensor db = has_b && needs[ib] ? ops::empty({d.c}, param_options) : Tensor();
        const double* mean = s[1].data_ptr<double>();
        const double* invstd = s[2].data_ptr<double>();
        DDP_NN_DISPATCH_BF16(x.dtype(), "batch_norm backward", {
          using param_t = compute_t<scalar_t>;
          const param_t* w = has_w ? s[3].data_ptr<param_t>() : nullptr;
          scalar_t* pdx = dx.defined() ? stored<scalar_t>(dx, block) : nullptr;
          param_t* pdw = dw.defined() ? dw.data_ptr<param_t>() : nullptr;
          param_t* pdb = db.defined() ? db.data_ptr<param_t>() : nullptr;
          if (nhwc) {
            const param_t* b = relu_in_bn && has_b ? s[iy].data_ptr<param_t>() : nullptr;
            const scalar_t* y = add ? stored<scalar_t>(y_saved, block) : nullptr;
            scalar_t* pmasked = add ? stored<scalar_t>(dy_masked, block) : nullptr;
            backward_nhwc(stored<scalar_t>(x, block), stored<scalar_t>(dy, block), relu_in_bn, b, y,
                          pmasked, d, mean, invstd, w, use_batch_stats, pdx, pdw, pdb, block);
          } else {
            backward(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                     relu_in_bn ? s[iy].data_ptr<scalar_t>() : nullptr, d, mean, invstd, w,
                     use_batch_stats, pdx, pdw, pdb);
          }
        });
        g[0] = dx;
        if (has_w) g[iw] = dw;
        if (has_b) g[ib] = db;
        if (add) g[ib + (has_b ? 1 : 0)] = dy_masked;
        return g;
      });
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         /*fuse_relu=*/false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum,
                       double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         /*fuse_relu=*/true);
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                           bool training, double momentum, double eps) {
  DDP_CHECK(x.defined() && residual.defined(),
            "batch_norm_add_relu: input and residual must be defined");
  // One pass for what the NHWC loops serve; anything else takes the separate calls.
  const bool fusable = !x.is_cuda() && x.dim() == 4 && residual.shape() == x.shape() &&
                       residual.dtype() == x.dtype() && residual.device() == x.device() &&
                       ops::suggest_memory_format(x) == ops::MemoryFormat::ChannelsLast &&
                       (x.dtype() == kFloat32 || x.dtype() == kFloat64 || x.dtype() == kBFloat16);
  if (!fusable) {
    return add_relu(batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps),
                    residual);
  }
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         /*fuse_relu=*/true, residual);
}

// --- the steps, for SyncBatchNorm (nn/batchnorm_kernels.h) --------------------------------------
//
// First in generic tensor ops (any device; what CUDA runs), then the CPU kernels (the NHWC ones
// for a channels-last or blocked x, whose results keep its layout).

namespace {

// [1, C, 1, 1] (for a 4-D x): a per-channel vector shaped to broadcast against x.
Tensor per_channel(const Tensor& v, const Tensor& x) {
  Shape shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  return ops::reshape(v, shape);
}

// Every dim but the channel dim: what the statistics sum over.
std::vector<int64_t> reduced_dims(const Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t k = 2; k < x.dim(); ++k) dims.push_back(k);
  return dims;
}

BatchNormMoments moments_generic(const Tensor& x) {
  DDP_CHECK(x.numel() > 0, "batch_norm_moments: empty input " << shape_str(x.shape()));
  Tensor x64 = ops::to(x, kFloat64);
  Tensor mean = ops::mean(x64, reduced_dims(x), /*keepdim=*/true);
  Tensor m2 = ops::sum(ops::square(ops::sub(x64, mean)), reduced_dims(x));
  return {ops::reshape(mean, {x.size(1)}), m2};
}

Tensor normalize_generic(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                         const Tensor& weight, const Tensor& bias) {
  // y = x * scale + shift, with scale and shift rounded to x's dtype once (as the kernel does).
  Tensor scale = weight.defined() ? ops::mul(ops::to(weight, kFloat64), invstd) : invstd;
  Tensor shift = ops::neg(ops::mul(mean, scale));
  if (bias.defined()) shift = ops::add(shift, ops::to(bias, kFloat64));
  return ops::add(ops::mul(x, per_channel(ops::to(scale, x.dtype()), x)),
                  per_channel(ops::to(shift, x.dtype()), x));
}

Tensor grad_sums_generic(const Tensor& x, const Tensor& dy, const Tensor& mean) {
  Tensor dy64 = ops::to(dy, kFloat64);
  Tensor xmu = ops::sub(ops::to(x, kFloat64), per_channel(mean, x));
  return ops::cat(
      {ops::sum(dy64, reduced_dims(x)), ops::sum(ops::mul(dy64, xmu), reduced_dims(x))});
}

Tensor input_grad_generic(const Tensor& x, const Tensor& dy, const Tensor& mean,
                          const Tensor& invstd, const Tensor& weight, const Tensor& sums,
                          double count) {
  const int64_t c = x.size(1);
  Tensor xmu = ops::sub(ops::to(x, kFloat64), per_channel(mean, x));
  Tensor mean_dy = per_channel(ops::div(ops::narrow(sums, 0, 0, c), count), x);
  Tensor proj =
      per_channel(ops::div(ops::mul(ops::narrow(sums, 0, c, c), ops::square(invstd)), count), x);
  Tensor k = weight.defined() ? ops::mul(invstd, ops::to(weight, kFloat64)) : invstd;
  // dx = k * (dy - mean_dy - (x - mean) * proj), in float64, then x's dtype.
  Tensor dx = ops::sub(ops::sub(ops::to(dy, kFloat64), mean_dy), ops::mul(xmu, proj));
  return ops::to(ops::mul(dx, per_channel(k, x)), x.dtype());
}

const double* doubles(const Tensor& t) {
  return t.data_ptr<double>();
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace

BatchNormMoments batch_norm_moments(const Tensor& x_in, bool generic) {
  if (generic || x_in.is_cuda()) return moments_generic(x_in);
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;  // as batch_norm_impl
  const BnShape d = bn_shape(x);
  DDP_CHECK(d.count() > 0, "batch_norm_moments: empty input " << shape_str(x.shape()));
  BatchNormMoments out{ops::empty({d.c}, kFloat64), ops::empty({d.c}, kFloat64)};
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_moments", {
    if (nhwc) {
      batch_moments_nhwc(stored<scalar_t>(x, block), d, out.mean.data_ptr<double>(),
                         out.m2.data_ptr<double>(), block);
    } else {
      batch_moments(x.data_ptr<scalar_t>(), d, out.mean.data_ptr<double>(),
                    out.m2.data_ptr<double>());
    }
  });
  return out;
}

Tensor batch_norm_normalize(const Tensor& x_in, const Tensor& mean, const Tensor& invstd,
                            const Tensor& weight_in, const Tensor& bias_in, bool generic) {
  if (generic || x_in.is_cuda()) return normalize_generic(x_in, mean, invstd, weight_in, bias_in);
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;
  const BnShape d = bn_shape(x);
  Tensor weight = param_or_none(weight_in, x, d.c, "weight");
  Tensor bias = param_or_none(bias_in, x, d.c, "bias");
  Tensor y = like(x, block, format);
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_normalize", {
    const scalar_t *w = data_or_null<scalar_t>(weight), *b = data_or_null<scalar_t>(bias);
    if (nhwc) {
      normalize_nhwc(stored<scalar_t>(x, block), d, doubles(mean), doubles(invstd), w, b,
                     stored<scalar_t>(y, block), block);
    } else {
      normalize(x.data_ptr<scalar_t>(), d, doubles(mean), doubles(invstd), w, b,
                y.data_ptr<scalar_t>());
    }
  });
  return y;
}

Tensor batch_norm_grad_sums(const Tensor& x_in, const Tensor& dy_in, const Tensor& mean,
                            bool generic) {
  if (generic || x_in.is_cuda()) return grad_sums_generic(x_in, dy_in, mean);
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format), dy = ops::contiguous(dy_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;
  if (block != 0) dy = ops::to_blocked(dy, block);
  const BnShape d = bn_shape(x);
  Tensor sums = ops::empty({2 * d.c}, kFloat64);
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_grad_sums", {
    const scalar_t *px = stored<scalar_t>(x, block), *pdy = stored<scalar_t>(dy, block);
    if (nhwc) {
      grad_sums_nhwc<scalar_t>(px, pdy, nullptr, nullptr, nullptr, nhwc_blocks<scalar_t>(d, block),
                               doubles(mean), sums.data_ptr<double>());
    } else {
      grad_sums(px, pdy, d, doubles(mean), sums.data_ptr<double>());
    }
  });
  return sums;
}

Tensor batch_norm_input_grad(const Tensor& x_in, const Tensor& dy_in, const Tensor& mean,
                             const Tensor& invstd, const Tensor& weight_in, const Tensor& sums,
                             double count, bool generic) {
  if (generic || x_in.is_cuda()) {
    return input_grad_generic(x_in, dy_in, mean, invstd, weight_in, sums, count);
  }
  const ops::MemoryFormat format = ops::suggest_memory_format(x_in);
  const bool nhwc = format == ops::MemoryFormat::ChannelsLast;
  Tensor x = ops::contiguous(x_in, format), dy = ops::contiguous(dy_in, format);
  const int64_t block = nhwc ? ops::blocked_block(x) : 0;
  if (block != 0) dy = ops::to_blocked(dy, block);
  const BnShape d = bn_shape(x);
  Tensor weight = param_or_none(weight_in, x, d.c, "weight");
  Tensor dx = like(x, block, format);
  DDP_NN_DISPATCH(x.dtype(), "batch_norm_input_grad", {
    const scalar_t *px = stored<scalar_t>(x, block), *pdy = stored<scalar_t>(dy, block);
    if (nhwc) {
      input_grad_nhwc<scalar_t>(px, pdy, nullptr, nhwc_blocks<scalar_t>(d, block), d, doubles(mean),
                                doubles(invstd), data_or_null<scalar_t>(weight), doubles(sums),
                                count, stored<scalar_t>(dx, block));
    } else {
      input_grad(px, pdy, d, doubles(mean), doubles(invstd), data_or_null<scalar_t>(weight),
                 doubles(sums), count, dx.data_ptr<scalar_t>());
    }
  });
  return dx;
}

}  // namespace ddplab::nn::functional
