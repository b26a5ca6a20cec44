// The inner loops of Winograd's F(2x2, 3x3) (Note [Winograd F(2x2, 3x3)] in nn/winograd.cpp), for
// one chunk of output tiles. nn/winograd.cpp includes this file once per instruction set, inside
// a namespace that defines kLanes (floats per vector register) and under a `#pragma GCC target`
// that lets the compiler use those registers; `vec`, `splat` and `fma` come from there too.
// Everything here works on whole vectors of channels, so channel counts are multiples of kLanes.
//
// Scratch layouts (one chunk of `rows` tiles, rows a multiple of kRows; tiles past the end of the
// problem are zero):
//   V  [16][rows][c]   the input tiles, transformed: B^T d B
//   Gy [16][rows][o]   the output-gradient tiles, transformed: A gy A^T
//   M  [16][rows][o]   their products with the weights, summed over the input channels
// and the weights U [16][c][o] (G g G^T per pair of channels), from nn/winograd.cpp.

// Tiles multiplied at once by one weight vector: enough independent sums to hide the latency of a
// fused multiply-add on both kinds of core, few enough to stay in registers with AVX2's 16.
constexpr int kRows = 8;

// The distance between two positions of a scratch array: one cache line more than the tiles take,
// so that the 16 positions of one tile do not fall into the same few sets of the level-1 cache
// (with 32 tiles of 16 channels they would be 2 KiB apart, a power of two).
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

// Transforms the 4x4 input patch of each tile of the chunk into V. A patch reaches one pixel past
// its 2x2 output tile on each side: the padding of 1, read as zeros. B^T d B is done in two
// halves, B^T on each column of the patch, then B on each row of the result; neighbouring tiles
// of an image row share two columns, so a tile that follows its left neighbour takes over that
// one's last two transformed columns and loads only two new ones.
inline void transform_inputs(const Activations& x, const Tiles& tiles, int64_t first, int rows,
                             float* v) {
  const int64_t c = x.c;
  const int64_t pos_stride = position_stride(rows, c);
  const int64_t dx = x.dx(), dy = x.dy();
  for (int64_t ch = 0; ch < c; ch += kLanes) {
    vec e[4][4] = {};  // B^T d: e[.][s] from column s of the patch
    Tile prev{0, 0, 0, false};
    Tile t = tiles.at(first);
    for (int i = 0; i < rows; ++i, prev = t, t = tiles.next(t)) {
      bool row_in[4];  // which rows of the patch lie in the image
      for (int r = 0; r < 4; ++r) row_in[r] = t.valid && t.y - 1 + r >= 0 && t.y - 1 + r < x.h;
      // The patch's top left pixel, which may lie in the padding: only pixels inside are read.
      const float* at = x.at(t.n, ch, t.y, t.x) - dy - dx;
      auto column = [&](int s) {
        const bool in = t.x - 1 + s >= 0 && t.x - 1 + s < x.w;
        vec d[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) d[r] = in && row_in[r] ? load(at + r * dy + s * dx) : vec{};
        e[0][s] = d[0] - d[2];
        e[1][s] = d[1] + d[2];
        e[2][s] = d[2] - d[1];
        e[3][s] = d[1] - d[3];
      };
      const bool follows = t.valid && prev.valid && t.n == prev.n && t.y == prev.y;
      if (follows) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          e[r][0] = e[r][2];
          e[r][1] = e[r][3];
        }
      } else {
        column(0);
        column(1);
      }
      column(2);
      column(3);
      float* out = v + static_cast<int64_t>(i) * c + ch;
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {  // (B^T d) B
        store(out + (4 * r + 0) * pos_stride, e[r][0] - e[r][2]);
        store(out + (4 * r + 1) * pos_stride, e[r][1] + e[r][2]);
        store(out + (4 * r + 2) * pos_stride, e[r][2] - e[r][1]);
        store(out + (4 * r + 3) * pos_stride, e[r][1] - e[r][3]);
      }
    }
  }
}

// Transforms the 2x2 output-gradient tile of each tile of the chunk into Gy.
inline void transform_output_grads(const Activations& gy, const Tiles& tiles, int64_t first,
                                   int rows, float* g) {
  const int64_t o = gy.c;
  const int64_t pos_stride = position_stride(rows, o);
  Tile t = tiles.at(first);
  for (int i = 0; i < rows; ++i, t = tiles.next(t)) {
    for (int64_t ch = 0; ch < o; ch += kLanes) {
      vec d[2][2] = {};
      if (t.valid) {
        const float* at = gy.at(t.n, ch, t.y, t.x);
        d[0][0] = load(at);
        d[0][1] = load(at + gy.dx());
        d[1][0] = load(at + gy.dy());
        d[1][1] = load(at + gy.dy() + gy.dx());
      }
      vec h[4][2];  // A d
      for (int b = 0; b < 2; ++b) {
        h[0][b] = d[0][b];
        h[1][b] = d[0][b] + d[1][b];
        h[2][b] = d[0][b] - d[1][b];
        h[3][b] = -d[1][b];
      }
      float* out = g + static_cast<int64_t>(i) * o + ch;
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {  // (A d) A^T
        store(out + (4 * r + 0) * pos_stride, h[r][0]);
        store(out + (4 * r + 1) * pos_stride, h[r][0] + h[r][1]);
        store(out + (4 * r + 2) * pos_stride, h[r][0] - h[r][1]);
        store(out + (4 * r + 3) * pos_stride, -h[r][1]);
      }
    }
  }
}

// M[pos] = V[pos] U[pos] for each of the 16 positions: a [rows x c] by [c x o] product, done as
// kRows tiles by one vector of output channels at a time, each input channel's weights loaded
// once and multiplied into every tile. kC is c when known at compile time (the loop over the
// channels then unrolls completely), else 0.
template <int kC>
inline void multiply_as(const float* v, const float* u, int rows, int64_t c, int64_t o, float* m) {
  if (kC != 0) c = kC;
  for (int pos = 0; pos < 16; ++pos) {
    const float* vp = v + pos * position_stride(rows, c);
    const float* up = u + pos * c * o;
    float* mp = m + pos * position_stride(rows, o);
    for (int64_t k = 0; k < o; k += kLanes) {
      for (int i0 = 0; i0 < rows; i0 += kRows) {
        vec acc[kRows] = {};
        const float* vr = vp + i0 * c;
#pragma GCC unroll 16
        for (int64_t ch = 0; ch < c; ++ch) {
          const vec w = load(up + ch * o + k);
#pragma GCC unroll 8
          for (int r = 0; r < kRows; ++r) acc[r] = fma(splat(vr[r * c + ch]), w, acc[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) store(mp + (i0 + r) * o + k, acc[r]);
      }
    }
  }
}

inline void multiply(const float* v, const float* u, int rows, int64_t c, int64_t o, float* m) {
  if (c == 16) {
    multiply_as<16>(v, u, rows, c, o, m);
  } else {
    multiply_as<0>(v, u, rows, c, o, m);
  }
}

// S[pos] += V[pos]^T Gy[pos] for each position: the weight gradient of the chunk, still in the
// transformed domain. A [c x rows] by [rows x o] product: kRows input channels by one vector of
// output channels at a time, summed over the chunk's tiles in registers.
inline void accumulate_weight_grads(const float* v, const float* g, int rows, int64_t c, int64_t o,
                                    float* s) {
  for (int pos = 0; pos < 16; ++pos) {
    const float* vp = v + pos * position_stride(rows, c);
    const float* gp = g + pos * position_stride(rows, o);
    float* sp = s + pos * c * o;
    for (int64_t k = 0; k < o; k += kLanes) {
      for (int64_t c0 = 0; c0 < c; c0 += kRows) {
        vec acc[kRows];
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) acc[r] = load(sp + (c0 + r) * o + k);
        for (int i = 0; i < rows; ++i) {
          const vec gv = load(gp + i * o + k);
          const float* vi = vp + i * c + c0;
#pragma GCC unroll 8
          for (int r = 0; r < kRows; ++r) acc[r] = fma(splat(vi[r]), gv, acc[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) store(sp + (c0 + r) * o + k, acc[r]);
      }
    }
  }
}

// y = A^T M A (+ bias) for each tile of the chunk: the 2x2 outputs, written into y.
inline void transform_outputs(const float* m, const float* bias, const Tiles& tiles, int64_t first,
                              int rows, const Activations& y) {
  const int64_t o = y.c;
  const int64_t pos_stride = position_stride(rows, o);
  Tile t = tiles.at(first);
  for (int i = 0; i < rows && t.valid; ++i, t = tiles.next(t)) {
    for (int64_t ch = 0; ch < o; ch += kLanes) {
      const float* in = m + static_cast<int64_t>(i) * o + ch;
      vec f[2][4];  // A^T M
#pragma GCC unroll 4
      for (int s = 0; s < 4; ++s) {
        const vec m0 = load(in + s * pos_stride), m1 = load(in + (4 + s) * pos_stride);
        const vec m2 = load(in + (8 + s) * pos_stride), m3 = load(in + (12 + s) * pos_stride);
        f[0][s] = m0 + m1 + m2;
        f[1][s] = m1 - m2 - m3;
      }
      vec out[2][2];  // (A^T M) A
      for (int a = 0; a < 2; ++a) {
        out[a][0] = f[a][0] + f[a][1] + f[a][2];
        out[a][1] = f[a][1] - f[a][2] - f[a][3];
      }
      if (bias != nullptr) {
        const vec b = load(bias + ch);
        for (auto& row : out) {
          for (vec& o : row) o += b;
        }
      }
      float* at = y.at(t.n, ch, t.y, t.x);
      store(at, out[0][0]);
      store(at + y.dx(), out[0][1]);
      store(at + y.dy(), out[1][0]);
      store(at + y.dy() + y.dx(), out[1][1]);
    }
  }
}
