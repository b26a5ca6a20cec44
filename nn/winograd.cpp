// Winograd's F(m x m, 3x3), m = 2 or 4: forward, backward data and backward weights of a 3x3
// convolution.
#include "nn/winograd.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/half.h"

namespace ddplab::nn::winograd {

// Note [Winograd F(m x m, 3x3)]
// A direct 3x3 convolution spends 9 multiply-adds per output pixel and pair of channels. Winograd's
// minimal filtering algorithm (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
// 2015) computes an m x m tile of outputs from the n x n patch of input under it (n = m + 2) with
// n * n products instead of 9 m * m:
//
//   y = A^T [ (G g G^T) (.) (B^T d B) ] A
//
// where d is the patch, g the 3x3 filter and (.) the element-wise product. For m = 2 (16 products
// instead of 36, 2.25x fewer):
//
//   B^T = | 1  0 -1  0 |    G = | 1    0    0   |    A^T = | 1  1  1  0 |
//         | 0  1  1  0 |        | 1/2  1/2  1/2 |          | 0  1 -1 -1 |
//         | 0 -1  1  0 |        | 1/2 -1/2  1/2 |
//         | 0  1  0 -1 |        | 0    0    1   |
//
// and for m = 4 (36 instead of 144, 4x fewer), built on the points 0, 1, -1, 2, -1/2 and infinity
// (Toom-Cook: A^T holds their powers):
//
//   B^T = | 1  3/2  -2   -3/2   1   0 |    G = |  1      0     0    |
//         | 0  -1   -5/2 -1/2   1   0 |        | -1/3  -1/3  -1/3   |
//         | 0   1    1/2 -5/2   1   0 |        |  1/3  -1/3   1/3   |
//         | 0  -1/2 -1    1/2   1   0 |        |  1/15  2/15  4/15  |
//         | 0   2   -1   -2     1   0 |        | -16/15 8/15 -4/15  |
//         | 0   1    3/2 -2    -3/2 1 |        |  0      0     1    |
//
//   A^T = | 1  1  1  1   1    0 |
//         | 0  1 -1  2  -1/2  0 |
//         | 0  1  1  4   1/4  0 |
//         | 0  1 -1  8  -1/8  1 |
//
// The usual points 0, 1, -1, 2, -2 (Lavin and Gray's matrices, oneDNN's) keep B^T and A^T in
// whole numbers, but rounded in float32 they err 2.5x more on random 16-channel tiles (mean 3.0e-6
// against 1.2e-6 of the largest output; of every pair of points from +-1/4 to +-4 beside 0, 1, -1
// this one erred least: bench/winograd_points.py derives the matrices and measures them), and
// they took the resnet20 parity run on AVX2, where every stage runs ours, to 0.57 of its bound
// (0.20 with these).
//
// With many channels the element-wise products become matrix products: at each of the n * n
// positions, the transformed patches of all tiles (rows) times the transformed filters (one
// column per output channel) summed over the input channels. The larger tile does 2.25x fewer
// products than the smaller but its transforms multiply by up to 8, so it rounds more: against a
// float64 convolution, up to 1.9e-6 of the largest output in the test against 5.9e-7 (a float32
// direct convolution: about 1e-7). Both are here (Problem::tile); convolutions run m = 4.
//
// Why our own: oneDNN 2.6 has Winograd only on AVX-512, where it pays from 32 channels on (Note
// [Winograd] in nn/onednn.cpp); resnet20's 16-channel stage, a third of its convolution work, ran
// directly at the machine's multiply-add peak, and below AVX-512 every stage did, so only fewer
// multiplications could make them faster. Here a 16x16 product per position is a register-sized
// job: 16 input channels by one vector of 16 output channels (AVX-512; two vectors of 8 with AVX2).
// Which convolutions run it: Note [Winograd of our own] in nn/onednn.cpp.
//
// Note [bfloat16 activations]
// Under autocast the activations between layers are bfloat16, and the kernel reads and writes
// them so (Problem::bf16), but computes in float32 throughout: a bfloat16 widens to float32
// exactly, the weights are rounded to bfloat16 once (autocast's cast of a convolution's weights),
// and each output is rounded to bfloat16 once, to nearest even, when it is stored. So the result
// is that of a float32 convolution of the bfloat16 operands, rounded: what a direct bfloat16
// kernel gives, which also sums in float32. The products could run on AVX512-BF16's dot products
// at twice the float32 rate, but then the transformed tiles and filters would be rounded to
// bfloat16 too, and the transforms magnify that rounding (F(4x4, 3x3): 6.7x the error of a direct
// bfloat16 convolution, `bench/winograd_points.py --bf16`). What bfloat16 saves here is memory
// traffic, half the bytes of activations read and written: with 16 channels at 32x32 (batch 128,
// 2 threads, Zen 4, 2026-12-07, 4 runs) a forward call took 1.42-1.50 ms on bfloat16 against
// 1.53-2.15 on float32, backward weights 2.19 against 2.52; with 32 and 64 channels, whose
// activations stay in the caches, 0-8% less.
//
// Backward data is the forward of gy with the filters turned: channels in and out swapped and
// each 3x3 filter rotated by 180 degrees (padding 1 stays 1). Backward weights is the same
// algorithm the other way round, F(3x3, m x m): a 3x3 filter gradient from an n x n input patch
// and an m x m output-gradient tile,
//
//   dw = G^T [ (A gy A^T) (.) (B^T d B) ] G,
//
// which follows from the forward identity (the matrices swap roles; see the test). The sum over
// tiles is taken in the transformed domain, so the last transform runs once per pair of channels.
//
// Work is split into chunks of kChunk consecutive tiles (image after image, row after row); each
// thread transforms, multiplies and transforms back one chunk at a time in scratch that fits in
// its caches. Tiles that reach past the image's edge read zeros there and write nothing, so any
// height and width work. The weight gradient is summed per thread and the threads' sums are added
// in thread order, so a run with the same thread count gives the same bits.

namespace {

// [n][c / block][h][w][block] of float (float32) or uint16_t (bfloat16's bits)
template <class T>
struct Activations {
  T* data;
  int64_t c, h, w, block;
  T* at(int64_t n, int64_t ch, int64_t y, int64_t x) const {
    return data + (((n * (c / block) + ch / block) * h + y) * w + x) * block + ch % block;
  }
  // Steps to the pixel to the right and to the one below, in elements.
  int64_t dx() const { return block; }
  int64_t dy() const { return w * block; }
};

struct Tile {
  int64_t n, y, x;  // the image and the top left output pixel
  bool valid;       // false past the last tile (a chunk's padding)
};

// The m x m output tiles of n images of h x w pixels, in order.
struct Tiles {
  int64_t n, th, tw, m;  // images, tiles per column, tiles per row, tile size
  Tiles(int64_t images, int64_t h, int64_t w, int64_t tile)
      : n(images), th((h + tile - 1) / tile), tw((w + tile - 1) / tile), m(tile) {}
  int64_t count() const { return n * th * tw; }
  Tile at(int64_t t) const {
    if (t >= count()) return {0, 0, 0, false};
    const int64_t r = t % (th * tw);
    return {t / (th * tw), m * (r / tw), m * (r % tw), true};
  }
  // The tile after `t`: to the right, else the next row's first, else the next image's.
  Tile next(Tile t) const {
    t.x += m;
    if (t.x < m * tw) return t;
    t.x = 0;
    t.y += m;
    if (t.y < m * th) return t;
    t.y = 0;
    t.n += 1;
    t.valid = t.valid && t.n < n;
    return t;
  }
};

}  // namespace

// The inner loops, once per instruction set: the same source, compiled for 16-float registers
// with AVX-512 and 8-float ones with AVX2. Fused multiply-adds are written out (fma), as the build
// otherwise keeps multiplies and adds apart (-ffp-contract=off in meson.build).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma")
namespace avx512 {
constexpr int kLanes = 16;
constexpr int kProductVectors = 1;  // multiply_as in nn/winograd_tiles.h
constexpr int kPrefetchTiles = 2;   // when prefetching: Note [Prefetching] there
using vec = float __attribute__((vector_size(kLanes * sizeof(float))));
inline vec fma(vec a, vec b, vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline vec splat(float s) {
  return _mm512_set1_ps(s);
}

#include "nn/winograd_tiles.h"  // NOLINT(bugprone-suspicious-include)
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
constexpr int kLanes = 8;
constexpr int kProductVectors = 2;
constexpr int kPrefetchTiles = 2;
using vec = float __attribute__((vector_size(kLanes * sizeof(float))));
inline vec fma(vec a, vec b, vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline vec splat(float s) {
  return _mm256_set1_ps(s);
}

#include "nn/winograd_tiles.h"  // NOLINT(bugprone-suspicious-include)
}  // namespace avx2
#pragma GCC pop_options

namespace {

// Output tiles per chunk: a multiple of kRows. 32 tiles of 16 channels keep V and M (32 KiB each
// for m = 2, 74 KiB for m = 4) in the level-2 cache.
constexpr int kChunk = 32;

// The per-chunk steps of one instruction set, tile size and activation type.
template <class T>
struct Kernels {
  int m;
  void (*transform_inputs)(const Activations<T>&, const Tiles&, int64_t, int, float*);
  void (*transform_output_grads)(const Activations<T>&, const Tiles&, int64_t, int, float*);
  void (*multiply)(const float*, const float*, int, int64_t, int64_t, float*);
  void (*accumulate_weight_grads)(const float*, const float*, int, int64_t, int64_t, float*);
  void (*transform_outputs)(const float*, const float*, const Tiles&, int64_t, int,
                            const Activations<T>&);
  void (*transform_filters)(const float*, int, const float*, int64_t, int64_t, int64_t, int64_t,
                            float*);
  void (*filters_from_sums)(const float*, int, const float*, int64_t, int64_t, int64_t, int64_t,
                            float*);
};

template <int M, class T, int Ahead>
Kernels<T> avx512_kernels() {
  return {M,
          avx512::transform_inputs<M, Ahead, T>,
          avx512::transform_output_grads<M, Ahead, T>,
          avx512::multiply<M>,
          avx512::accumulate_weight_grads<M>,
          avx512::transform_outputs<M, Ahead, T>,
          avx512::transform_filters,
          avx512::filters_from_sums};
}

// `narrow`: at most 16 channels in and out, where the AVX-512 form prefetches too (Note
// [Prefetching] in nn/winograd_tiles.h); the AVX2 form always does.
template <int M, class T>
Kernels<T> kernels_for(int64_t lanes, bool narrow) {
  if (lanes == 16) {
    return narrow ? avx512_kernels<M, T, avx512::kPrefetchTiles>() : avx512_kernels<M, T, 0>();
  }
  return {M,
          avx2::transform_inputs<M, avx2::kPrefetchTiles, T>,
          avx2::transform_output_grads<M, avx2::kPrefetchTiles, T>,
          avx2::multiply<M>,
          avx2::accumulate_weight_grads<M>,
          avx2::transform_outputs<M, avx2::kPrefetchTiles, T>,
          avx2::transform_filters,
          avx2::filters_from_sums};
}

// The tile size a problem runs with (Problem::tile).
template <class T>
Kernels<T> kernels_for(const Problem& p) {
  const bool narrow = p.c <= 16 && p.o <= 16;
  return p.tile == 2 ? kernels_for<2, T>(p.lanes, narrow) : kernels_for<4, T>(p.lanes, narrow);
}

// G of F(m x m, 3x3), n x 3, exact in double (1/3 and 1/15 are not in float32); TapMatrix below
// is built from it in double and rounded once.
template <int M>
struct FilterMatrix;
template <>
struct FilterMatrix<2> {
  static constexpr double kG[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
};
template <>
struct FilterMatrix<4> {
  static constexpr double kG[6][3] = {{1, 0, 0},
                                      {-1.0 / 3, -1.0 / 3, -1.0 / 3},
                                      {1.0 / 3, -1.0 / 3, 1.0 / 3},
                                      {1.0 / 15, 2.0 / 15, 4.0 / 15},
                                      {-16.0 / 15, 8.0 / 15, -4.0 / 15},
                                      {0, 0, 1}};
};

// `count` floats, not zeroed: for arrays whose every element is written before it is read. They
// come from the caching host allocator (tensor/allocator.h), which keeps freed blocks for the next
// call. From malloc, whether a block this large is reused or mapped afresh (and its pages faulted
// in again at every call) depends on glibc's thresholds and on what else the process allocated:
// resnet20 at batch 32 on one thread took 151,685 page faults in 32 steps with oneDNN limited to
// AVX2 and 18,731 without (Zen 4, `perf stat`); with these arrays here, 17,565, and the step 1.17x
// faster in the AVX2 case (6 interleaved rounds; the same time without the limit).
class Floats {
 public:
  Floats() = default;  // none yet
  explicit Floats(int64_t count)
      : block_(cpu_allocator().allocate(static_cast<size_t>(count) * sizeof(float))),
        count_(count) {}
  float* get() const { return static_cast<float*>(block_.get()); }
  float& operator[](int64_t i) const { return get()[i]; }
  int64_t size() const { return count_; }

 private:
  DataPtr block_;
  int64_t count_ = 0;
};

// The filter transform as one matrix: element (n p + q) of G g G^T is sum_ij G[p][i] g[i][j]
// G[q][j], so C[3 i + j][n p + q] = G[p][i] G[q][j] (computed in double, rounded once) maps the 9
// taps to the n * n positions, and the same C read the other way maps the positions' sums of a
// weight gradient back to the 9 taps.
template <int M>
struct TapMatrix {
  static constexpr int kPositions = (M + 2) * (M + 2);
  float at[9 * kPositions];
  TapMatrix() : at() {
    constexpr int N = M + 2;
    const auto& g = FilterMatrix<M>::kG;
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) {
        for (int p = 0; p < N; ++p) {
          for (int q = 0; q < N; ++q) {
            at[(3 * i + j) * kPositions + N * p + q] = static_cast<float>(g[p][i] * g[q][j]);
          }
        }
      }
    }
  }
};

const float* tap_matrix(int m) {
  static const TapMatrix<2> two;
  static const TapMatrix<4> four;
  return m == 2 ? two.at : four.at;
}

// U [n*n][in][out] from OIHW weights w [o][c][3][3], G g G^T per filter: for the forward (in = c,
// out = o) or, turned, for backward data (in = o, out = c, each filter rotated by 180 degrees:
// its taps in reverse order). The taps are first laid out [in][9][out], so that the transform
// runs on vectors of output channels; with bfloat16 activations they are rounded to bfloat16 on
// the way, as autocast rounds a convolution's weights.
template <class T>
Floats transform_weights(const Kernels<T>& k, const Problem& p, const float* w, bool turned) {
  const int positions = (k.m + 2) * (k.m + 2);
  const int64_t in = turned ? p.o : p.c, out = turned ? p.c : p.o;
  const Floats wt(in * 9 * out);
  for (int64_t ko = 0; ko < p.o; ++ko) {
    for (int64_t ch = 0; ch < p.c; ++ch) {
      const int64_t row = turned ? ko : ch, col = turned ? ch : ko;
      for (int t = 0; t < 9; ++t) {
        const float tap = w[(ko * p.c + ch) * 9 + (turned ? 8 - t : t)];
        wt[(row * 9 + t) * out + col] = p.bf16 ? static_cast<float>(BFloat16(tap)) : tap;
      }
    }
  }
  Floats u(positions * in * out);
  const float* taps = tap_matrix(k.m);
#pragma omp parallel for schedule(static) if (in * out > 1024)
  for (int64_t row = 0; row < in; ++row) {
    k.transform_filters(taps, positions, wt.get(), in, out, row, row + 1, u.get());
  }
  return u;
}

// One chunk's V, Gy or M (nn/winograd_tiles.h) with `channels` per tile, not cleared: the
// transforms write every float the products read. Each thread keeps its two (`slot` 0 and 1)
// from call to call, so it gets back the same memory, warm in its own caches (a block from the
// shared pool may have been another core's last), aligned to cache lines as the vectors are.
float* scratch(int slot, int m, int64_t channels) {
  thread_local Floats kept[2];
  const int64_t count = (m + 2) * (m + 2) * avx2::position_stride(kChunk, channels);
  if (kept[slot].size() < count) kept[slot] = Floats(count);
  return kept[slot].get();
}

// y = conv(x, U) + b over the tiles of n images: chunk after chunk, each thread with its own
// scratch.
template <class T>
void run_forward(const Kernels<T>& k, int64_t n, const Activations<T>& x, const float* u,
                 const float* b, const Activations<T>& y) {
  const Tiles tiles(n, y.h, y.w, k.m);
  const int64_t chunks = (tiles.count() + kChunk - 1) / kChunk;
#pragma omp parallel
  {
    float* v = scratch(0, k.m, x.c);
    float* m = scratch(1, k.m, y.c);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < chunks; ++i) {
      k.transform_inputs(x, tiles, i * kChunk, kChunk, v);
      k.multiply(v, u, kChunk, x.c, y.c, m);
      k.transform_outputs(m, b, tiles, i * kChunk, kChunk, y);
    }
  }
}

template <class T>
Activations<T> activations(const void* data, int64_t c, const Problem& p, int64_t block) {
  return {static_cast<T*>(const_cast<void*>(data)), c, p.h, p.w, block};
}

float to_float(float v) {
  return v;
}

float to_float(uint16_t bf16) {
  return BFloat16::from_bits(bf16);
}

template <class T>
void forward_as(const Problem& p, const void* x, const float* w, const float* b, void* y) {
  const Kernels<T> k = kernels_for<T>(p);
  run_forward(k, p.n, activations<T>(x, p.c, p, p.x_block), transform_weights(k, p, w, false).get(),
              b, activations<T>(y, p.o, p, p.y_block));
}

template <class T>
void backward_data_as(const Problem& p, const void* gy, const float* w, void* gx) {
  const Kernels<T> k = kernels_for<T>(p);
  run_forward(k, p.n, activations<T>(gy, p.o, p, p.y_block), transform_weights(k, p, w, true).get(),
              nullptr, activations<T>(gx, p.c, p, p.x_block));
}

template <class T>
void backward_weights_as(const Problem& p, const void* x, const void* gy, float* gw, float* gb) {
  const Kernels<T> k = kernels_for<T>(p);
  const Activations<T> xa = activations<T>(x, p.c, p, p.x_block);
  const Activations<T> ga = activations<T>(gy, p.o, p, p.y_block);

  const Tiles tiles(p.n, p.h, p.w, k.m);
  const int64_t chunks = (tiles.count() + kChunk - 1) / kChunk;
  const size_t per_thread = static_cast<size_t>((k.m + 2) * (k.m + 2) * p.c * p.o);
  // Each thread's sums, zeroed by the thread itself (the first touch also puts them near it).
  const Floats sums(static_cast<int64_t>(per_thread) * omp_get_max_threads());
  int threads = 1;
#pragma omp parallel
  {
#pragma omp single
    threads = omp_get_num_threads();
    float* v = scratch(0, k.m, p.c);
    float* g = scratch(1, k.m, p.o);
    float* s = sums.get() + per_thread * static_cast<size_t>(omp_get_thread_num());
    std::fill(s, s + per_thread, 0.0F);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < chunks; ++i) {
      k.transform_inputs(xa, tiles, i * kChunk, kChunk, v);
      k.transform_output_grads(ga, tiles, i * kChunk, kChunk, g);
      k.accumulate_weight_grads(v, g, kChunk, p.c, p.o, s);
    }
    // The threads' sums in thread order (so the same bits every run), each thread a slice.
#pragma omp for schedule(static)
    for (size_t i = 0; i < per_thread; ++i) {
      for (int t = 1; t < threads; ++t) sums[i] += sums[per_thread * static_cast<size_t>(t) + i];
    }
  }
  // dw = G^T S G, first as [c][9][o] (vectors of output channels), then into OIHW.
  const Floats gt(p.c * 9 * p.o);
  const int positions = (k.m + 2) * (k.m + 2);
#pragma omp parallel for schedule(static) if (p.c * p.o > 1024)
  for (int64_t ch = 0; ch < p.c; ++ch) {
    k.filters_from_sums(tap_matrix(k.m), positions, sums.get(), p.c, p.o, ch, ch + 1, gt.get());
  }
  for (int64_t ko = 0; ko < p.o; ++ko) {
    for (int64_t ch = 0; ch < p.c; ++ch) {
      for (int t = 0; t < 9; ++t) gw[(ko * p.c + ch) * 9 + t] = gt[(ch * 9 + t) * p.o + ko];
    }
  }
  if (gb != nullptr) {
    for (int64_t ko = 0; ko < p.o; ++ko) {
      double acc = 0;  // n * h * w terms: summed in double, then rounded once
      for (int64_t img = 0; img < p.n; ++img) {
        for (int64_t y = 0; y < p.h; ++y) {
          for (int64_t xx = 0; xx < p.w; ++xx) acc += to_float(*ga.at(img, ko, y, xx));
        }
      }
      gb[ko] = static_cast<float>(acc);
    }
  }
}

}  // namespace

bool fits(const Problem& p) {
  bool cpu = false;
  if (p.lanes == 16) cpu = __builtin_cpu_supports("avx512f") != 0;
  if (p.lanes == 8) cpu = __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  auto whole = [&](int64_t channels, int64_t block) {
    return block > 0 && channels % block == 0 && block % p.lanes == 0;
  };
  return cpu && (p.tile == 2 || p.tile == 4) && p.n > 0 && p.h > 0 && p.w > 0 &&
         whole(p.c, p.x_block) && whole(p.o, p.y_block);
}

void forward(const Problem& p, const void* x, const float* w, const float* b, void* y) {
  if (p.bf16) {
    forward_as<uint16_t>(p, x, w, b, y);
  } else {
    forward_as<float>(p, x, w, b, y);
  }
}

void backward_data(const Problem& p, const void* gy, const float* w, void* gx) {
  if (p.bf16) {
    backward_data_as<uint16_t>(p, gy, w, gx);
  } else {
    backward_data_as<float>(p, gy, w, gx);
  }
}

void backward_weights(const Problem& p, const void* x, const void* gy, float* gw, float* gb) {
  if (p.bf16) {
    backward_weights_as<uint16_t>(p, x, gy, gw, gb);
  } else {
    backward_weights_as<float>(p, x, gy, gw, gb);
  }
}

}  // namespace ddplab::nn::winograd
