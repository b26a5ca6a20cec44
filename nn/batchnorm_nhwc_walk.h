// Private to nn/batchnorm_channels_last.cpp and nn/batchnorm_channels_last_backward.cpp: how
// their loops walk a channels-last or blocked x. The walk decides the order of every sum, hence
// the bits; its loops are tested equal to the reference kernels (nn/batchnorm_contiguous.cpp) in
// tests/nn/test_batchnorm_channels_last.cpp ("batch_norm channels-last: float32 matches the
// contiguous input" and the cases after it), and its blocked walk equal to the channels-last one
// bit for bit in tests/nn/test_blocked_activations.cpp ("batch norm on blocked x: the
// channels-last results, forward and backward").
//
// A channels-last x of shape [N, C, H, W] (Note [Channels last] in tensor/ops_create.cpp) is, in
// memory, P = N*H*W pixels of C values each, a pixel's channels side by side. The reference loops
// would read it with a stride of C; these walk memory in order instead and keep C sums, one per
// channel.
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
//    to P and corrected exactly for the rounding (moments_lanes, grad_sums_lanes), so nothing
//    cancels.
//  * Variance. A block's mean is taken first, then its M2 = sum((x - block_mean)^2) in a second
//    pass over the block, from L1. The blocks then merge exactly (Chan et al.'s formula for
//    combining groups): M2 = sum_b M2_b + sum_b n_b * (mean_b - mean)^2, the spread of the block
//    means around the overall mean being exactly the part that the blocks' own M2 leave out. One
//    read of x from memory.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "nn/batchnorm_internal.h"
#include "tensor/macros.h"
#include "tensor/threads.h"

namespace ddplab::nn::batchnorm_detail {

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
inline bool parallel(const NhwcBlocks& blk) {
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

}  // namespace ddplab::nn::batchnorm_detail
