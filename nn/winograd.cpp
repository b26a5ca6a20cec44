// Winograd's F(2x2, 3x3): forward, backward data and backward weights of a 3x3 convolution.
#include "nn/winograd.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

namespace ddplab::nn::winograd {

// Note [Winograd F(2x2, 3x3)]
// A direct 3x3 convolution spends 9 multiply-adds per output pixel and pair of channels. Winograd's
// minimal filtering algorithm (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
// 2015) computes a 2x2 tile of outputs from the 4x4 patch of input under it with 16 products
// instead of 36, 2.25x fewer:
//
//   y = A^T [ (G g G^T) (.) (B^T d B) ] A
//
// where d is the 4x4 patch, g the 3x3 filter, (.) the element-wise product and
//
//   B^T = | 1  0 -1  0 |    G = | 1    0    0   |    A^T = | 1  1  1  0 |
//         | 0  1  1  0 |        | 1/2  1/2  1/2 |          | 0  1 -1 -1 |
//         | 0 -1  1  0 |        | 1/2 -1/2  1/2 |
//         | 0  1  0 -1 |        | 0    0    1   |
//
// With many channels the element-wise products become matrix products: at each of the 16
// positions, the transformed patches of all tiles (rows) times the transformed filters (one
// column per output channel) summed over the input channels. The transforms only add and subtract
// (G halves), so they cost little and lose little precision: F(2x2, 3x3) is the most accurate
// of the Winograd forms (oneDNN's uses F(4x4, 3x3), 4x fewer products, at some precision).
//
// Why our own: oneDNN 2.6 runs Winograd only on AVX-512 and only pays with 32 or more channels
// (Note [Winograd] in nn/onednn.cpp); resnet20's 16-channel stage, a third of its convolution
// work, ran directly at the machine's multiply-add peak, so only fewer multiplications could make
// it faster. Here a 16x16 product per position is a register-sized job: 16 input channels by one
// vector of 16 output channels (AVX-512; two vectors of 8 with AVX2).
//
// Backward data is the forward of gy with the filters turned: channels in and out swapped and
// each 3x3 filter rotated by 180 degrees (padding 1 stays 1). Backward weights is the same
// algorithm the other way round, F(3x3, 2x2): a 3x3 filter gradient from a 4x4 input patch and a
// 2x2 output-gradient tile,
//
//   dw = G^T [ (A gy A^T) (.) (B^T d B) ] G,
//
// which follows from the forward identity (the matrices swap roles; see the test). The sum over
// tiles is taken in the transformed domain, so the last transform runs once per pair of channels.
//
// Work is split into chunks of kChunk consecutive tiles (2x2 output blocks, image after image,
// row after row); each thread transforms, multiplies and transforms back one chunk at a time in
// scratch that fits in its caches. The weight gradient is summed per thread and the threads'
// sums are added in thread order, so a run with the same thread count gives the same bits.

namespace {

// [n][c / block][h][w][block]
struct Activations {
  float* data;
  int64_t c, h, w, block;
  float* at(int64_t n, int64_t ch, int64_t y, int64_t x) const {
    return data + (((n * (c / block) + ch / block) * h + y) * w + x) * block + ch % block;
  }
  // Steps to the pixel to the right and to the one below, in floats.
  int64_t dx() const { return block; }
  int64_t dy() const { return w * block; }
};

struct Tile {
  int64_t n, y, x;  // the image and the top left output pixel
  bool valid;       // false past the last tile (a chunk's padding)
};

struct Tiles {
  int64_t n, th, tw;  // images, tiles per column, tiles per row
  int64_t count() const { return n * th * tw; }
  Tile at(int64_t t) const {
    if (t >= count()) return {0, 0, 0, false};
    const int64_t r = t % (th * tw);
    return {t / (th * tw), 2 * (r / tw), 2 * (r % tw), true};
  }
  // The tile after `t`: to the right, else the next row's first, else the next image's.
  Tile next(Tile t) const {
    t.x += 2;
    if (t.x < 2 * tw) return t;
    t.x = 0;
    t.y += 2;
    if (t.y < 2 * th) return t;
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

// Output tiles per chunk: a multiple of kRows. 32 tiles of 16 channels keep V and M (32 KiB each)
// in the level-2 cache.
constexpr int kChunk = 32;

// The per-chunk steps of one instruction set.
struct Kernels {
  void (*transform_inputs)(const Activations&, const Tiles&, int64_t, int, float*);
  void (*transform_output_grads)(const Activations&, const Tiles&, int64_t, int, float*);
  void (*multiply)(const float*, const float*, int, int64_t, int64_t, float*);
  void (*accumulate_weight_grads)(const float*, const float*, int, int64_t, int64_t, float*);
  void (*transform_outputs)(const float*, const float*, const Tiles&, int64_t, int,
                            const Activations&);
};

Kernels kernels_for(int64_t lanes) {
  if (lanes == 16) {
    return {avx512::transform_inputs, avx512::transform_output_grads, avx512::multiply,
            avx512::accumulate_weight_grads, avx512::transform_outputs};
  }
  return {avx2::transform_inputs, avx2::transform_output_grads, avx2::multiply,
          avx2::accumulate_weight_grads, avx2::transform_outputs};
}

constexpr float kG[4][3] = {{1, 0, 0}, {0.5F, 0.5F, 0.5F}, {0.5F, -0.5F, 0.5F}, {0, 0, 1}};

// G g G^T of one 3x3 filter, the 16 positions in row-major order.
std::array<float, 16> transform_filter(const float g[3][3]) {
  float gg[4][3];  // G g
  for (int p = 0; p < 4; ++p) {
    for (int j = 0; j < 3; ++j)
      gg[p][j] = kG[p][0] * g[0][j] + kG[p][1] * g[1][j] + kG[p][2] * g[2][j];
  }
  std::array<float, 16> u{};
  for (int p = 0; p < 4; ++p) {
    for (int q = 0; q < 4; ++q)
      u[4 * p + q] = gg[p][0] * kG[q][0] + gg[p][1] * kG[q][1] + gg[p][2] * kG[q][2];
  }
  return u;
}

// U [16][in][out] from OIHW weights w [o][c][3][3]: for the forward (in = c, out = o) or, turned,
// for backward data (in = o, out = c, each filter rotated by 180 degrees).
std::vector<float> transform_weights(const float* w, int64_t o, int64_t c, bool turned) {
  const int64_t in = turned ? o : c, out = turned ? c : o;
  std::vector<float> u(static_cast<size_t>(16 * in * out));
  for (int64_t k = 0; k < o; ++k) {
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* f = w + (k * c + ch) * 9;
      float g[3][3];
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) g[i][j] = turned ? f[(2 - i) * 3 + (2 - j)] : f[i * 3 + j];
      }
      const std::array<float, 16> t = transform_filter(g);
      const int64_t row = turned ? k : ch, col = turned ? ch : k;
      for (int pos = 0; pos < 16; ++pos)
        u[static_cast<size_t>((pos * in + row) * out + col)] = t[pos];
    }
  }
  return u;
}

// The floats of one chunk's V, Gy or M (nn/winograd_tiles.h) with `channels` per tile.
size_t scratch_size(int64_t channels) {
  return static_cast<size_t>(16 * avx2::position_stride(kChunk, channels));
}

// y = conv(x, U) + b over the tiles of n images: chunk after chunk, each thread with its own
// scratch.
void run_forward(int64_t lanes, int64_t n, const Activations& x, const std::vector<float>& u,
                 const float* b, const Activations& y) {
  const Kernels k = kernels_for(lanes);
  const Tiles tiles{n, y.h / 2, y.w / 2};
  const int64_t chunks = (tiles.count() + kChunk - 1) / kChunk;
#pragma omp parallel
  {
    std::vector<float> v(scratch_size(x.c));
    std::vector<float> m(scratch_size(y.c));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < chunks; ++i) {
      k.transform_inputs(x, tiles, i * kChunk, kChunk, v.data());
      k.multiply(v.data(), u.data(), kChunk, x.c, y.c, m.data());
      k.transform_outputs(m.data(), b, tiles, i * kChunk, kChunk, y);
    }
  }
}

Activations activations(const void* data, int64_t c, const Problem& p, int64_t block) {
  return {static_cast<float*>(const_cast<void*>(data)), c, p.h, p.w, block};
}

}  // namespace

bool fits(const Problem& p) {
  bool cpu = false;
  if (p.lanes == 16) cpu = __builtin_cpu_supports("avx512f") != 0;
  if (p.lanes == 8) cpu = __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  auto whole = [&](int64_t channels, int64_t block) {
    return block > 0 && channels % block == 0 && block % p.lanes == 0;
  };
  return cpu && p.n > 0 && p.h > 0 && p.w > 0 && p.h % 2 == 0 && p.w % 2 == 0 &&
         whole(p.c, p.x_block) && whole(p.o, p.y_block);
}

void forward(const Problem& p, const float* x, const float* w, const float* b, float* y) {
  const std::vector<float> u = transform_weights(w, p.o, p.c, false);
  run_forward(p.lanes, p.n, activations(x, p.c, p, p.x_block), u, b,
              activations(y, p.o, p, p.y_block));
}

void backward_data(const Problem& p, const float* gy, const float* w, float* gx) {
  const std::vector<float> u = transform_weights(w, p.o, p.c, true);
  run_forward(p.lanes, p.n, activations(gy, p.o, p, p.y_block), u, nullptr,
              activations(gx, p.c, p, p.x_block));
}

void backward_weights(const Problem& p, const float* x, const float* gy, float* gw, float* gb) {
  const Kernels k = kernels_for(p.lanes);
  const Activations xa = activations(x, p.c, p, p.x_block);
  const Activations ga = activations(gy, p.o, p, p.y_block);
  const Tiles tiles{p.n, p.h / 2, p.w / 2};
  const int64_t chunks = (tiles.count() + kChunk - 1) / kChunk;
  const size_t per_thread = static_cast<size_t>(16 * p.c * p.o);
  std::vector<float> sums(per_thread * static_cast<size_t>(omp_get_max_threads()), 0.0F);
  int threads = 1;
#pragma omp parallel
  {
#pragma omp single
    threads = omp_get_num_threads();
    std::vector<float> v(scratch_size(p.c));
    std::vector<float> g(scratch_size(p.o));
    float* s = sums.data() + per_thread * static_cast<size_t>(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t i = 0; i < chunks; ++i) {
      k.transform_inputs(xa, tiles, i * kChunk, kChunk, v.data());
      k.transform_output_grads(ga, tiles, i * kChunk, kChunk, g.data());
      k.accumulate_weight_grads(v.data(), g.data(), kChunk, p.c, p.o, s);
    }
  }
  // The threads' sums in thread order, then dw = G^T S G per pair of channels.
  for (int t = 1; t < threads; ++t) {
    const float* s = sums.data() + per_thread * static_cast<size_t>(t);
    for (size_t i = 0; i < per_thread; ++i) sums[i] += s[i];
  }
  for (int64_t ko = 0; ko < p.o; ++ko) {
    for (int64_t ch = 0; ch < p.c; ++ch) {
      float sp[4][4];
      for (int pos = 0; pos < 16; ++pos) sp[pos / 4][pos % 4] = sums[(pos * p.c + ch) * p.o + ko];
      float* f = gw + (ko * p.c + ch) * 9;
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
          float acc = 0;
          for (int a = 0; a < 4; ++a) {
            for (int q = 0; q < 4; ++q) acc += kG[a][i] * sp[a][q] * kG[q][j];
          }
          f[i * 3 + j] = acc;
        }
      }
    }
  }
  if (gb != nullptr) {
    for (int64_t ko = 0; ko < p.o; ++ko) {
      double acc = 0;  // n * h * w terms: summed in double, then rounded once
      for (int64_t img = 0; img < p.n; ++img) {
        for (int64_t y = 0; y < p.h; ++y) {
          for (int64_t xx = 0; xx < p.w; ++xx) acc += *ga.at(img, ko, y, xx);
        }
      }
      gb[ko] = static_cast<float>(acc);
    }
  }
}

}  // namespace ddplab::nn::winograd
