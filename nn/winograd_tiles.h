// The inner loops of Winograd's F(m x m, 3x3) for m = 2 and 4 (Note [Winograd F(m x m, 3x3)] in
// nn/winograd.cpp), for one chunk of output tiles. nn/winograd.cpp includes this file once per
// instruction set, inside a namespace that defines kLanes (floats per vector register),
// kProductVectors (multiply_as) and kPrefetchTiles (how far Note [Prefetching] below asks ahead),
// under a `#pragma GCC target` that lets the compiler use those registers; `vec`, `splat` and
// `fma` come from there too. Everything here works on whole vectors of channels, so channel
// counts are multiples of kLanes.
//
// A tile is m x m outputs; its input patch has n = m + 2 rows and columns, so there are n * n
// positions in the transformed domain. Scratch layouts (one chunk of `rows` tiles, rows a multiple
// of kRows; tiles past the end of the problem are zero):
//   V  [n*n][rows][c]   the input patches, transformed: B^T d B
//   Gy [n*n][rows][o]   the output-gradient tiles, transformed: A gy A^T
//   M  [n*n][rows][o]   their products with the weights, summed over the input channels
// and the weights U [n*n][c][o] (G g G^T per pair of channels), from nn/winograd.cpp.

// Tiles multiplied at once by one weight vector: enough independent sums to hide the latency of a
// fused multiply-add on both kinds of core, few enough to stay in registers with AVX2's 16.
constexpr int kRows = 8;

// The distance between two positions of a scratch array: one cache line more than the tiles take,
// so that the positions of one tile do not fall into the same few sets of the level-1 cache (with
// 32 tiles of 16 channels they would be 2 KiB apart, a power of two).
inline int64_t position_stride(int rows, int64_t channels) {
  return rows * channels + 16;
}

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, vec v) {
  std::memcpy(p, &v, sizeof v);
}

// Activations are float32 or bfloat16 (Note [bfloat16 activations] in nn/winograd.cpp); either way
// the kernel computes in float32. These read one vector of them as floats and write one back.
using bits = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));
using bf16_bits = uint16_t __attribute__((vector_size(kLanes * sizeof(uint16_t))));

inline vec load_activation(const float* p) {
  return load(p);
}

// Exact: a bfloat16 is the upper half of the float32 with the same value.
inline vec load_activation(const uint16_t* p) {
  bf16_bits h;
  std::memcpy(&h, p, sizeof h);
  const bits u = __builtin_convertvector(h, bits) << 16;
  vec v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

inline void store_activation(float* p, vec v) {
  store(p, v);
}

// Rounded to the nearest bfloat16, ties to even, a NaN kept a quiet NaN: BFloat16::from_float
// (tensor/half.h) on a vector, so that the bits equal a float32 result converted afterwards.
inline void store_activation(uint16_t* p, vec v) {
  bits u;
  std::memcpy(&u, &v, sizeof u);
  const bits rounded = (u + 0x7fffU + ((u >> 16) & 1U)) >> 16;
  const bits out = (u & 0x7fffffffU) > 0x7f800000U ? (u >> 16) | 0x40U : rounded;
  const bf16_bits h = __builtin_convertvector(out, bf16_bits);
  std::memcpy(p, &h, sizeof h);
}

// Note [Prefetching]
// Tiles run along image rows and each one reads (or writes) a few pixels from each of n (or m)
// image rows: as many streams of memory as rows, which the hardware prefetchers pick up late.
// Where that shows, the transforms ask for the pixels of the tile `Ahead` tiles to the right
// (kPrefetchTiles of the namespace; past the row's end the addresses fall on the next pixel rows,
// which do no harm), a template parameter so that kernels_for (nn/winograd.cpp) picks per call:
//  * The AVX2 form always: it spends twice the instructions of the AVX-512 form per byte of
//    activations, so its out-of-order window reaches half as far ahead and the loads wait longer.
//    On a Zen 4 limited to AVX2 this made 16-channel calls 7-20% faster (none with 32 or 64
//    channels, whose images fit the caches) and resnet20's step 6-13%.
//  * The AVX-512 form with at most 16 channels in and out: there a tile does the least
//    arithmetic per byte, and resnet20's 16-channel images (32x32, 8 MiB a batch of 128 in
//    float32) come from memory. Per call on a Zen 4 (2 threads, batch 128, arrays rotated through
//    more memory than the caches hold, medians of 6 alternating runs, 2026-12-07): float32
//    backward data and weights 0.86x and 0.90x the time without, bfloat16 activations 0.92x and
//    0.90x; with 32 channels 0.98-1.04x, with 64 1.02-1.03x, so not there. resnet20's step
//    (bench_train.py --driver, build against build, 12 rounds twice): float32 0.88x and 0.95x at
//    2 threads, 0.96x and 0.94x at 1; bf16 (ours in the backward only) 0.98x and 0.95x, 1.00x
//    and 0.96x.
//
// Both helpers are always inlined: to GCC a prefetch has no effect, so a call to a function that
// only prefetches is dead code, and it deleted the call to prefetch_tile_ahead (before inlining it)
// when that was an ordinary inline function.
template <int Rows, int ForWrite, class T>
[[gnu::always_inline]] inline void prefetch_rows(const T* first, int64_t row_stride,
                                                 int64_t bytes) {
#pragma GCC unroll 6
  for (int r = 0; r < Rows; ++r) {
    const char* row = reinterpret_cast<const char*>(first + r * row_stride);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, ForWrite);
  }
}

// The m x m pixels, every block of channels, of the tile `Ahead` tiles to the right of t.
template <int M, int ForWrite, int Ahead, class T>
[[gnu::always_inline]] inline void prefetch_tile_ahead(const Activations<T>& a, const Tile& t) {
  for (int64_t ch = 0; ch < a.c; ch += a.block) {
    prefetch_rows<M, ForWrite>(a.at(t.n, ch, t.y, t.x + Ahead * M), a.dy(), M * a.dx() * sizeof(T));
  }
}

// The one-dimensional transforms, overloaded on the sizes of their arrays: F(2, 3) works on 4
// points, F(4, 3) on 6. Each is its matrix of Note [Winograd F(m x m, 3x3)] times a column of
// vectors, its sums shared where rows repeat them.

// t = B^T d
inline void input_1d(const vec (&d)[4], vec (&t)[4]) {
  t[0] = d[0] - d[2];
  t[1] = d[1] + d[2];
  t[2] = d[2] - d[1];
  t[3] = d[1] - d[3];
}

inline void input_1d(const vec (&d)[6], vec (&t)[6]) {
  const vec diff13 = d[1] - d[3], diff42 = d[4] - d[2];
  t[0] = fma(splat(1.5F), diff13, fma(splat(-2), d[2], d[0] + d[4]));
  t[1] = fma(splat(-0.5F), d[3], fma(splat(-2.5F), d[2], d[4] - d[1]));
  t[2] = fma(splat(-2.5F), d[3], fma(splat(0.5F), d[2], d[4] + d[1]));
  t[3] = fma(splat(-0.5F), diff13, diff42);
  t[4] = fma(splat(2), diff13, diff42);
  t[5] = fma(splat(1.5F), d[2] - d[4], fma(splat(-2), d[3], d[1] + d[5]));
}

// y = A^T m
inline void output_1d(const vec (&m)[4], vec (&y)[2]) {
  y[0] = m[0] + m[1] + m[2];
  y[1] = m[1] - m[2] - m[3];
}

inline void output_1d(const vec (&m)[6], vec (&y)[4]) {
  const vec sum12 = m[1] + m[2], diff12 = m[1] - m[2];
  y[0] = m[0] + sum12 + m[3] + m[4];
  y[1] = fma(splat(-0.5F), m[4], fma(splat(2), m[3], diff12));
  y[2] = fma(splat(0.25F), m[4], fma(splat(4), m[3], sum12));
  y[3] = fma(splat(-0.125F), m[4], fma(splat(8), m[3], diff12)) + m[5];
}

// h = A g
inline void grad_1d(const vec (&g)[2], vec (&h)[4]) {
  h[0] = g[0];
  h[1] = g[0] + g[1];
  h[2] = g[0] - g[1];
  h[3] = -g[1];
}

inline void grad_1d(const vec (&g)[4], vec (&h)[6]) {
  const vec even = g[0] + g[2], odd = g[1] + g[3];
  h[0] = g[0];
  h[1] = even + odd;
  h[2] = even - odd;
  h[3] = fma(splat(2), fma(splat(4), g[3], g[1]), fma(splat(4), g[2], g[0]));
  h[4] = fma(splat(-0.5F), fma(splat(0.25F), g[3], g[1]), fma(splat(0.25F), g[2], g[0]));
  h[5] = g[3];
}

// The second half of a two-dimensional transform, whose first half left the transformed columns
// in cols[s]: row r of the result is element r of every column, transformed by `f`; it is stored
// at positions n r .. n r + n - 1 of a scratch array (`pos_stride` floats apart).
template <int S, int N, class F>
inline void store_rows(const vec (&cols)[S][N], F f, float* out, int64_t pos_stride) {
#pragma GCC unroll 6
  for (int r = 0; r < N; ++r) {
    vec row[S], tr[N];
#pragma GCC unroll 6
    for (int s = 0; s < S; ++s) row[s] = cols[s][r];
    f(row, tr);
#pragma GCC unroll 6
    for (int q = 0; q < N; ++q) store(out + (N * r + q) * pos_stride, tr[q]);
  }
}

// Transforms the n x n input patch of each tile of the chunk into V. A patch reaches one pixel
// past its m x m output tile on each side: the padding of 1, read as zeros, as is everything past
// the image's edge. B^T d B is done in two halves, B^T on each column of the patch, then B on
// each row of the result; neighbouring tiles of an image row share two columns, so a tile that
// follows its left neighbour takes over that one's last two transformed columns and loads only
// m new ones.
template <int M, int Ahead, class T>
inline void transform_inputs(const Activations<T>& x, const Tiles& tiles, int64_t first, int rows,
                             float* v) {
  constexpr int N = M + 2;
  const int64_t c = x.c;
  const int64_t pos_stride = position_stride(rows, c);
  const int64_t dx = x.dx(), dy = x.dy();
  for (int64_t ch = 0; ch < c; ch += kLanes) {
    vec e[N][N] = {};  // B^T d, e[s] from column s of the patch
    Tile prev{0, 0, 0, false};
    Tile t = tiles.at(first);
    for (int i = 0; i < rows; ++i, prev = t, t = tiles.next(t)) {
      bool row_in[N];  // which rows of the patch lie in the image
      for (int r = 0; r < N; ++r) row_in[r] = t.valid && t.y - 1 + r >= 0 && t.y - 1 + r < x.h;
      // The patch's top left pixel, which may lie in the padding: only pixels inside are read.
      const T* at = x.at(t.n, ch, t.y, t.x) - dy - dx;
      if (Ahead > 0) {  // the m new columns of that tile's patch
        prefetch_rows<N, 0>(at + (Ahead * M + 2) * dx, dy, M * dx * sizeof(T));
      }
      auto column = [&](int s) {
        const bool in = t.x - 1 + s >= 0 && t.x - 1 + s < x.w;
        vec d[N];
#pragma GCC unroll 6
        for (int r = 0; r < N; ++r) {
          d[r] = in && row_in[r] ? load_activation(at + r * dy + s * dx) : vec{};
        }
        input_1d(d, e[s]);
      };
      const bool follows = t.valid && prev.valid && t.n == prev.n && t.y == prev.y;
      if (follows) {
        std::memcpy(e[0], e[M], sizeof e[0]);
        std::memcpy(e[1], e[M + 1], sizeof e[1]);
      } else {
        column(0);
        column(1);
      }
#pragma GCC unroll 4
      for (int s = 2; s < N; ++s) column(s);
      // (B^T d) B
      store_rows(
          e, [](const vec(&a)[N], vec(&b)[N]) { input_1d(a, b); },
          v + static_cast<int64_t>(i) * c + ch, pos_stride);
    }
  }
}

// Transforms the m x m output-gradient tile of each tile of the chunk into Gy (zeros past the
// image's edge).
template <int M, int Ahead, class T>
inline void transform_output_grads(const Activations<T>& gy, const Tiles& tiles, int64_t first,
                                   int rows, float* g) {
  constexpr int N = M + 2;
  const int64_t o = gy.c;
  const int64_t pos_stride = position_stride(rows, o);
  Tile t = tiles.at(first);
  for (int i = 0; i < rows; ++i, t = tiles.next(t)) {
    if (Ahead > 0) prefetch_tile_ahead<M, 0, Ahead>(gy, t);
    for (int64_t ch = 0; ch < o; ch += kLanes) {
      vec h[M][N];  // A d, h[b] from column b of the tile
#pragma GCC unroll 4
      for (int b = 0; b < M; ++b) {
        vec d[M];
#pragma GCC unroll 4
        for (int a = 0; a < M; ++a) {
          const bool in = t.valid && t.y + a < gy.h && t.x + b < gy.w;
          d[a] = in ? load_activation(gy.at(t.n, ch, t.y, t.x) + a * gy.dy() + b * gy.dx()) : vec{};
        }
        grad_1d(d, h[b]);
      }
      // (A d) A^T
      store_rows(
          h, [](const vec(&a)[M], vec(&b)[N]) { grad_1d(a, b); },
          g + static_cast<int64_t>(i) * o + ch, pos_stride);
    }
  }
}

// R x W vectors to and from p, row r at p + r * stride, vector j kLanes floats further along.
template <int R, int W>
inline void load_block(vec (&acc)[R][W], const float* p, int64_t stride) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int j = 0; j < W; ++j) acc[r][j] = load(p + r * stride + j * kLanes);
  }
}

template <int R, int W>
inline void store_block(const vec (&acc)[R][W], float* p, int64_t stride) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int j = 0; j < W; ++j) store(p + r * stride + j * kLanes, acc[r][j]);
  }
}

// One block of the product M = V U at one position: R tiles (rows of V, c apart) by W vectors of
// output channels (columns of U, o apart), R W = kRows sums in registers. Each input channel's
// weight vectors are loaded once for the R tiles and each tile's value broadcast once for the W
// vectors.
template <int R, int W, int kC>
inline void multiply_block(const float* vr, const float* up, int64_t c, int64_t o, float* mp) {
  vec acc[R][W] = {};
#pragma GCC unroll 16
  for (int64_t ch = 0; ch < (kC != 0 ? kC : c); ++ch) {
    vec w[W];
#pragma GCC unroll 2
    for (int j = 0; j < W; ++j) w[j] = load(up + ch * o + j * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vec b = splat(vr[r * c + ch]);
#pragma GCC unroll 2
      for (int j = 0; j < W; ++j) acc[r][j] = fma(b, w[j], acc[r][j]);
    }
  }
  store_block(acc, mp, o);
}

// M[pos] = V[pos] U[pos] for each position: a [rows x c] by [c x o] product, in blocks of
// kProductVectors vectors of output channels (the rest one at a time) by kRows / kProductVectors
// tiles. kC is c when known at compile time (the loop over the channels then unrolls completely),
// else 0. Two vectors per block load fewer broadcasts per multiply-add: with AVX2 (eight
// broadcasts and a weight load per eight multiply-adds otherwise) forward calls took 5% less time
// with 32 channels and 12% with 64 on a Zen 4 (16 channels: the same, their calls wait on
// memory); with AVX-512, whose multiply-adds take their broadcast from memory in the same
// instruction, 32 and 64 channels measured the same.
template <int kPositions, int kC>
inline void multiply_as(const float* v, const float* u, int rows, int64_t c, int64_t o, float* m) {
  if (kC != 0) c = kC;
  constexpr int kWide = kProductVectors * kLanes;
  for (int pos = 0; pos < kPositions; ++pos) {
    const float* vp = v + pos * position_stride(rows, c);
    const float* up = u + pos * c * o;
    float* mp = m + pos * position_stride(rows, o);
    int64_t k = 0;
    for (; k + kWide <= o; k += kWide) {
      for (int i0 = 0; i0 < rows; i0 += kRows / kProductVectors) {
        multiply_block<kRows / kProductVectors, kProductVectors, kC>(vp + i0 * c, up + k, c, o,
                                                                     mp + i0 * o + k);
      }
    }
    for (; k < o; k += kLanes) {
      for (int i0 = 0; i0 < rows; i0 += kRows) {
        multiply_block<kRows, 1, kC>(vp + i0 * c, up + k, c, o, mp + i0 * o + k);
      }
    }
  }
}

template <int M>
inline void multiply(const float* v, const float* u, int rows, int64_t c, int64_t o, float* m) {
  constexpr int kPositions = (M + 2) * (M + 2);
  if (c == 16) {
    multiply_as<kPositions, 16>(v, u, rows, c, o, m);
  } else {
    multiply_as<kPositions, 0>(v, u, rows, c, o, m);
  }
}

// One block of S += V^T Gy at one position: R input channels (columns of V, c apart) by W vectors
// of output channels (columns of Gy, o apart), summed over the chunk's `rows` tiles in registers.
template <int R, int W>
inline void accumulate_block(const float* vp, const float* gp, int rows, int64_t c, int64_t o,
                             float* sp) {
  vec acc[R][W];
  load_block(acc, sp, o);
  for (int i = 0; i < rows; ++i) {
    vec gv[W];
#pragma GCC unroll 2
    for (int j = 0; j < W; ++j) gv[j] = load(gp + i * o + j * kLanes);
    const float* vi = vp + i * c;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vec b = splat(vi[r]);
#pragma GCC unroll 2
      for (int j = 0; j < W; ++j) acc[r][j] = fma(b, gv[j], acc[r][j]);
    }
  }
  store_block(acc, sp, o);
}

// S[pos] += V[pos]^T Gy[pos] for each position: the weight gradient of the chunk, still in the
// transformed domain. A [c x rows] by [rows x o] product, in blocks of kProductVectors vectors of
// output channels (the rest one at a time) by kRows / kProductVectors input channels, as in
// multiply_as.
template <int M>
inline void accumulate_weight_grads(const float* v, const float* g, int rows, int64_t c, int64_t o,
                                    float* s) {
  constexpr int kPositions = (M + 2) * (M + 2);
  constexpr int kWide = kProductVectors * kLanes;
  for (int pos = 0; pos < kPositions; ++pos) {
    const float* vp = v + pos * position_stride(rows, c);
    const float* gp = g + pos * position_stride(rows, o);
    float* sp = s + pos * c * o;
    int64_t k = 0;
    for (; k + kWide <= o; k += kWide) {
      for (int64_t c0 = 0; c0 < c; c0 += kRows / kProductVectors) {
        accumulate_block<kRows / kProductVectors, kProductVectors>(vp + c0, gp + k, rows, c, o,
                                                                   sp + c0 * o + k);
      }
    }
    for (; k < o; k += kLanes) {
      for (int64_t c0 = 0; c0 < c; c0 += kRows) {
        accumulate_block<kRows, 1>(vp + c0, gp + k, rows, c, o, sp + c0 * o + k);
      }
    }
  }
}

// y = A^T M A (+ bias) for each tile of the chunk: the m x m outputs, written into y where they
// lie inside it.
template <int M, int Ahead, class T>
inline void transform_outputs(const float* m, const float* bias, const Tiles& tiles, int64_t first,
                              int rows, const Activations<T>& y) {
  constexpr int N = M + 2;
  const int64_t o = y.c;
  const int64_t pos_stride = position_stride(rows, o);
  Tile t = tiles.at(first);
  for (int i = 0; i < rows && t.valid; ++i, t = tiles.next(t)) {
    if (Ahead > 0) prefetch_tile_ahead<M, 1, Ahead>(y, t);
    for (int64_t ch = 0; ch < o; ch += kLanes) {
      const float* in = m + static_cast<int64_t>(i) * o + ch;
      vec f[N][M];  // A^T M, f[s] from column s
#pragma GCC unroll 6
      for (int s = 0; s < N; ++s) {
        vec col[N];
#pragma GCC unroll 6
        for (int r = 0; r < N; ++r) col[r] = load(in + (N * r + s) * pos_stride);
        output_1d(col, f[s]);
      }
      const vec b = bias != nullptr ? load(bias + ch) : vec{};
      T* at = y.at(t.n, ch, t.y, t.x);
#pragma GCC unroll 4
      for (int a = 0; a < M; ++a) {  // (A^T M) A, row a of the tile
        vec row[N], out[M];
#pragma GCC unroll 6
        for (int s = 0; s < N; ++s) row[s] = f[s][a];
        output_1d(row, out);
#pragma GCC unroll 4
        for (int q = 0; q < M; ++q) {
          if (t.y + a < y.h && t.x + q < y.w) {
            store_activation(at + a * y.dy() + q * y.dx(), bias != nullptr ? out[q] + b : out[q]);
          }
        }
      }
    }
  }
}

// U[pos][row][.] = sum_t C[t][pos] wt[row][t][.] for rows [first, last): the filters in the
// transformed domain, `taps` being C [9][positions] (TapMatrix in nn/winograd.cpp) and wt the
// filters' taps with their output channels innermost, [rows][9][out].
inline void transform_filters(const float* taps, int positions, const float* wt, int64_t rows,
                              int64_t out, int64_t first, int64_t last, float* u) {
  for (int64_t row = first; row < last; ++row) {
    for (int64_t k = 0; k < out; k += kLanes) {
      vec taps_of_row[9];  // loaded once for all n * n positions
#pragma GCC unroll 9
      for (int t = 0; t < 9; ++t) taps_of_row[t] = load(wt + (row * 9 + t) * out + k);
      for (int pos = 0; pos < positions; ++pos) {
        vec acc{};
#pragma GCC unroll 9
        for (int t = 0; t < 9; ++t) {
          acc = fma(splat(taps[t * positions + pos]), taps_of_row[t], acc);
        }
        store(u + (pos * rows + row) * out + k, acc);
      }
    }
  }
}

// gt[ch][t][.] = sum_pos C[t][pos] S[pos][ch][.] for input channels [first, last): weight
// gradients back from the transformed domain, output channels innermost.
inline void filters_from_sums(const float* taps, int positions, const float* s, int64_t c,
                              int64_t o, int64_t first, int64_t last, float* gt) {
  for (int64_t ch = first; ch < last; ++ch) {
    for (int64_t k = 0; k < o; k += kLanes) {
      // The nine taps' sums side by side: nine independent chains of multiply-adds, where one
      // tap at a time would wait out each one's latency (a chain of n * n).
      vec acc[9] = {};
      for (int pos = 0; pos < positions; ++pos) {
        const vec sum = load(s + (pos * c + ch) * o + k);
#pragma GCC unroll 9
        for (int t = 0; t < 9; ++t) acc[t] = fma(splat(taps[t * positions + pos]), sum, acc[t]);
      }
#pragma GCC unroll 9
      for (int t = 0; t < 9; ++t) store(gt + (ch * 9 + t) * o + k, acc[t]);
    }
  }
}
