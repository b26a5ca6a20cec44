// Our Winograd F(m x m, 3x3) (nn/winograd.h) against a direct convolution in float64, for both
// tile sizes and each instruction set this CPU has, in NHWC and blocked layouts, with tile counts
// that fill no chunk and tiles that reach past the image, on float32 and bfloat16 activations;
// and through conv2d, where it stands in for oneDNN's kernels.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "nn/functional.h"
#include "nn/onednn.h"
#include "nn/winograd.h"
#include "tensor/half.h"
#include "tensor/ops.h"
#include "tests/skip.h"

using namespace ddplab;
namespace W = nn::winograd;
namespace F = nn::functional;

namespace {

// The vector widths this CPU runs the kernel at: 16 (AVX-512) and 8 (AVX2 with FMA).
std::vector<int64_t> cpu_lanes() {
  std::vector<int64_t> out;
  for (int64_t lanes : {16, 8}) {
    if (W::fits({1, lanes, 4, 4, lanes, lanes, lanes, lanes})) out.push_back(lanes);
  }
  return out;
}

// Where element (i, ch, y, x) of an [n, c, h, w] array lies in NCHW order and in
// [n][c / block][h][w][block] order.
struct Index {
  int64_t n, c, h, w, block;
  size_t nchw(int64_t i, int64_t ch, int64_t y, int64_t x) const {
    return static_cast<size_t>(((i * c + ch) * h + y) * w + x);
  }
  size_t blocked(int64_t i, int64_t ch, int64_t y, int64_t x) const {
    return static_cast<size_t>((((i * (c / block) + ch / block) * h + y) * w + x) * block +
                               ch % block);
  }
  // Copies `from` into `to`, element by element, from one order into the other.
  template <class A, class B>
  void copy(const std::vector<A>& from, std::vector<B>& to, bool into_blocked) const {
    to.resize(from.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t ch = 0; ch < c; ++ch) {
        for (int64_t y = 0; y < h; ++y) {
          for (int64_t x = 0; x < w; ++x) {
            const size_t p = nchw(i, ch, y, x), q = blocked(i, ch, y, x);
            to[into_blocked ? q : p] = static_cast<B>(from[into_blocked ? p : q]);
          }
        }
      }
    }
  }
};

std::vector<float> to_blocked(const std::vector<double>& a, const Index& index) {
  std::vector<float> out;
  index.copy(a, out, true);
  return out;
}

std::vector<double> from_blocked(const std::vector<float>& a, const Index& index) {
  std::vector<double> out;
  index.copy(a, out, false);
  return out;
}

// Each value's bfloat16 bits (the values are bfloat16 already: exact), and the values back.
std::vector<uint16_t> to_bf16(const std::vector<float>& a) {
  std::vector<uint16_t> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = BFloat16(a[i]).x;
  return out;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& a) {
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = BFloat16::from_bits(a[i]);
  return out;
}

// A 3x3, stride-1, padding-1 convolution and its gradients, directly in float64 (NCHW, OIHW).
// All three are the same sum over the taps, y[i, k, r, s] += w[k, ch, u, v] x[i, ch, r+u-1, s+v-1],
// read three ways.
struct Direct {
  int64_t n, c, h, w, o;
  // f(y index, x index, w index) for every tap that lands inside the image.
  template <class F>
  void each_tap(F f) const {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < o; ++k) {
        for (int64_t r = 0; r < h; ++r) {
          for (int64_t s = 0; s < w; ++s) {
            for (int64_t ch = 0; ch < c; ++ch) {
              for (int64_t u = 0; u < 3; ++u) {
                for (int64_t v = 0; v < 3; ++v) {
                  const int64_t y = r + u - 1, x = s + v - 1;
                  if (y < 0 || y >= h || x < 0 || x >= w) continue;
                  f(static_cast<size_t>(((i * o + k) * h + r) * w + s),
                    static_cast<size_t>(((i * c + ch) * h + y) * w + x),
                    static_cast<size_t>(((k * c + ch) * 3 + u) * 3 + v));
                }
              }
            }
          }
        }
      }
    }
  }
  std::vector<double> forward(const std::vector<double>& x, const std::vector<double>& wt,
                              const std::vector<double>& b) const {
    std::vector<double> y(static_cast<size_t>(n * o * h * w));
    for (size_t i = 0; i < y.size(); ++i) y[i] = b[(i / static_cast<size_t>(h * w)) % o];
    each_tap([&](size_t yi, size_t xi, size_t wi) { y[yi] += wt[wi] * x[xi]; });
    return y;
  }
  std::vector<double> backward_data(const std::vector<double>& gy,
                                    const std::vector<double>& wt) const {
    std::vector<double> gx(static_cast<size_t>(n * c * h * w), 0.0);
    each_tap([&](size_t yi, size_t xi, size_t wi) { gx[xi] += gy[yi] * wt[wi]; });
    return gx;
  }
  std::vector<double> backward_weights(const std::vector<double>& x,
                                       const std::vector<double>& gy) const {
    std::vector<double> gw(static_cast<size_t>(o * c * 9), 0.0);
    each_tap([&](size_t yi, size_t xi, size_t wi) { gw[wi] += gy[yi] * x[xi]; });
    return gw;
  }
  // The bias gradient: gy summed over images and pixels, per output channel.
  std::vector<double> backward_bias(const std::vector<double>& gy) const {
    std::vector<double> gb(static_cast<size_t>(o), 0.0);
    for (size_t i = 0; i < gy.size(); ++i) {
      gb[(i / static_cast<size_t>(h * w)) % static_cast<size_t>(o)] += gy[i];
    }
    return gb;
  }
};

// Every (vector width, tile size) pair to run.
std::vector<std::pair<int64_t, int>> pairs(const std::vector<int64_t>& widths) {
  std::vector<std::pair<int64_t, int>> out;
  for (int64_t lanes : widths) {
    for (int tile : {2, 4}) out.emplace_back(lanes, tile);
  }
  return out;
}

std::vector<double> randoms(size_t count, std::mt19937& rng) {
  std::normal_distribution<double> normal;
  std::vector<double> out(count);
  // Rounded to float first, so that the float64 reference sees exactly the kernel's inputs.
  for (double& v : out) v = static_cast<float>(normal(rng));
  return out;
}

// Each value rounded to the nearest bfloat16.
std::vector<double> rounded_to_bf16(std::vector<double> values) {
  for (double& v : values) v = static_cast<float>(BFloat16(static_cast<float>(v)));
  return values;
}

// `count` normal values rounded to bfloat16.
std::vector<double> bf16_randoms(size_t count, std::mt19937& rng) {
  return rounded_to_bf16(randoms(count, rng));
}

// The largest difference relative to the largest reference value.
double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("winograd: forward, backward data and backward weights equal a direct convolution") {
  const std::vector<int64_t> widths = cpu_lanes();
  DDP_SKIP_IF(widths.empty(), "this CPU has neither AVX-512 nor AVX2 with FMA");
  struct Shape {
    int64_t n, c, h, w, o;
  };
  // The error against float64, relative to the largest value: F(2x2, 3x3) only adds, subtracts
  // and halves; F(4x4, 3x3)'s transforms multiply by up to 8 (measured here: up to 5.9e-7 and
  // 1.9e-6).
  const double bound[5] = {0, 0, 2e-6, 0, 6e-6};
  std::mt19937 rng(5);
  for (const auto& pair : pairs(widths)) {
    const int64_t lanes = pair.first;
    const int tile = pair.second;
    CAPTURE(lanes);
    CAPTURE(tile);
    // One tile; one tile bigger than the image; a chunk's worth not filled; several chunks with a
    // partial last one; sides that are not multiples of the tile; more channels out than in and
    // the other way round; three vectors of channels out, then in (the AVX2 form's products take
    // two vectors at a time, then the one left).
    const std::vector<Shape> shapes = {{1, lanes, 4, 4, lanes},      {1, lanes, 3, 1, lanes},
                                       {1, lanes, 6, 10, lanes},     {3, lanes, 12, 8, 2 * lanes},
                                       {2, 2 * lanes, 7, 14, lanes}, {2, lanes, 6, 7, 3 * lanes},
                                       {2, 3 * lanes, 5, 9, lanes},  {5, lanes, 16, 16, lanes}};
    for (const Shape& s : shapes) {
      CAPTURE(s.n);
      CAPTURE(s.c);
      CAPTURE(s.h);
      CAPTURE(s.w);
      CAPTURE(s.o);
      const Direct d{s.n, s.c, s.h, s.w, s.o};
      const std::vector<double> x = randoms(static_cast<size_t>(s.n * s.c * s.h * s.w), rng);
      const std::vector<double> wt = randoms(static_cast<size_t>(s.o * s.c * 9), rng);
      const std::vector<double> b = randoms(static_cast<size_t>(s.o), rng);
      const std::vector<double> gy = randoms(static_cast<size_t>(s.n * s.o * s.h * s.w), rng);
      const std::vector<double> y_ref = d.forward(x, wt, b);
      const std::vector<double> gx_ref = d.backward_data(gy, wt);
      const std::vector<double> gw_ref = d.backward_weights(x, gy);
      std::vector<float> wf(wt.begin(), wt.end()), bf(b.begin(), b.end());
      // NHWC (the block is every channel) and blocked in vector-register-wide groups.
      for (bool nhwc : {true, false}) {
        CAPTURE(nhwc);
        const W::Problem p{s.n,   s.c, s.h, s.w, s.o, nhwc ? s.c : lanes, nhwc ? s.o : lanes,
                           lanes, tile};
        REQUIRE(W::fits(p));
        const Index xi{s.n, s.c, s.h, s.w, p.x_block}, yi{s.n, s.o, s.h, s.w, p.y_block};
        const std::vector<float> xb = to_blocked(x, xi), gyb = to_blocked(gy, yi);
        std::vector<float> y(gyb.size()), gx(xb.size()), gw(wf.size()), gb(bf.size());

        W::forward(p, xb.data(), wf.data(), bf.data(), y.data());
        CHECK(rel_error(from_blocked(y, yi), y_ref) < bound[tile]);
        W::backward_data(p, gyb.data(), wf.data(), gx.data());
        CHECK(rel_error(from_blocked(gx, xi), gx_ref) < bound[tile]);
        W::backward_weights(p, xb.data(), gyb.data(), gw.data(), gb.data());
        CHECK(rel_error(std::vector<double>(gw.begin(), gw.end()), gw_ref) < bound[tile]);
        CHECK(rel_error(std::vector<double>(gb.begin(), gb.end()), d.backward_bias(gy)) < 1e-6);
      }
    }
  }
}

TEST_CASE("winograd: bfloat16 activations: float32 arithmetic, each output rounded once") {
  // The reference convolves the bfloat16 operands (the weights rounded to bfloat16, as the kernel
  // does) in float64. A float32 result rounded to the nearest bfloat16 is within half a bfloat16
  // step (2^-8 of its value: 8 significant bits) of it, plus the float32 Winograd's own error;
  // rounding by truncation would miss by up to a whole step. The weight gradient stays float32.
  const std::vector<int64_t> widths = cpu_lanes();
  DDP_SKIP_IF(widths.empty(), "this CPU has neither AVX-512 nor AVX2 with FMA");
  std::mt19937 rng(11);
  for (int64_t lanes : widths) {
    CAPTURE(lanes);
    struct Shape {
      int64_t n, c, h, w, o;
    };
    for (const Shape& s : {Shape{2, lanes, 6, 7, 3 * lanes}, Shape{3, 2 * lanes, 9, 5, lanes}}) {
      CAPTURE(s.c);
      CAPTURE(s.o);
      const Direct d{s.n, s.c, s.h, s.w, s.o};
      const std::vector<double> x = bf16_randoms(static_cast<size_t>(s.n * s.c * s.h * s.w), rng);
      const std::vector<double> gy = bf16_randoms(static_cast<size_t>(s.n * s.o * s.h * s.w), rng);
      const std::vector<double> wt = randoms(static_cast<size_t>(s.o * s.c * 9), rng);
      const std::vector<double> b = randoms(static_cast<size_t>(s.o), rng);
      const std::vector<double> wt_bf16 = rounded_to_bf16(wt);
      const std::vector<float> wf(wt.begin(), wt.end()), bf(b.begin(), b.end());
      const W::Problem p{s.n, s.c, s.h, s.w, s.o, s.c, s.o, lanes, 4, true};
      REQUIRE(W::fits(p));
      const Index xi{s.n, s.c, s.h, s.w, s.c}, yi{s.n, s.o, s.h, s.w, s.o};
      const std::vector<uint16_t> xb = to_bf16(to_blocked(x, xi)),
                                  gyb = to_bf16(to_blocked(gy, yi));
      std::vector<uint16_t> y(gyb.size()), gx(xb.size());
      std::vector<float> gw(wf.size()), gb(bf.size());
      W::forward(p, xb.data(), wf.data(), bf.data(), y.data());
      W::backward_data(p, gyb.data(), wf.data(), gx.data());
      W::backward_weights(p, xb.data(), gyb.data(), gw.data(), gb.data());

      // Every value within half a bfloat16 step, give or take 1e-5 of the largest; and nearly
      // every one the reference's own nearest bfloat16 (a value of the reference that lies
      // within float32 rounding of halfway between two may round either way).
      auto rounded_once = [](const std::vector<double>& got, const std::vector<double>& want) {
        double scale = 1e-30;
        for (double v : want) scale = std::max(scale, std::abs(v));
        size_t far = 0, other = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          if (std::abs(got[i] - want[i]) > std::ldexp(std::abs(want[i]), -8) + 1e-5 * scale) ++far;
          const float nearest = BFloat16(static_cast<float>(want[i]));
          if (static_cast<float>(got[i]) != nearest) ++other;
        }
        CHECK(far == 0);
        CHECK(other <= want.size() / 100);
      };
      rounded_once(from_blocked(from_bf16(y), yi), d.forward(x, wt_bf16, b));
      rounded_once(from_blocked(from_bf16(gx), xi), d.backward_data(gy, wt_bf16));
      CHECK(rel_error(std::vector<double>(gw.begin(), gw.end()), d.backward_weights(x, gy)) < 6e-6);
      CHECK(rel_error(std::vector<double>(gb.begin(), gb.end()), d.backward_bias(gy)) < 1e-6);
    }
  }
}

TEST_CASE("winograd: bfloat16 outputs keep a NaN a NaN") {
  // A NaN whose low bits are all ones (here from the bias, which stays float32) would round up
  // into the sign bit and come out -0 if rounded like a number.
  const std::vector<int64_t> widths = cpu_lanes();
  DDP_SKIP_IF(widths.empty(), "this CPU has neither AVX-512 nor AVX2 with FMA");
  for (int64_t lanes : widths) {
    CAPTURE(lanes);
    const int64_t n = 1, c = lanes, h = 5, w = 6, o = lanes;
    const W::Problem p{n, c, h, w, o, c, o, lanes, 4, true};
    const std::vector<uint16_t> x(static_cast<size_t>(n * c * h * w), BFloat16(1.0F).x);
    const std::vector<float> wt(static_cast<size_t>(o * c * 9), 0.5F);
    std::vector<float> b(static_cast<size_t>(o), 0.0F);
    const uint32_t nan_bits = 0x7fffffffU;
    std::memcpy(&b[0], &nan_bits, sizeof nan_bits);
    std::vector<uint16_t> y(static_cast<size_t>(n * o * h * w));
    W::forward(p, x.data(), wt.data(), b.data(), y.data());
    size_t nan0 = 0, nan_other = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const bool nan = std::isnan(static_cast<float>(BFloat16::from_bits(y[i])));
      (i % static_cast<size_t>(o) == 0 ? nan0 : nan_other) += nan ? 1 : 0;
    }
    CHECK(nan0 == static_cast<size_t>(n * h * w));  // channel 0 of every pixel (NHWC)
    CHECK(nan_other == 0);
  }
}

TEST_CASE("winograd: the AVX-512 and AVX2 forms give the same bits") {
  // Each lane of a vector computes one channel with the same operations in the same order,
  // whatever the vector's width: a model computes alike on both kinds of CPU.
  const std::vector<int64_t> widths = cpu_lanes();
  DDP_SKIP_IF(widths.size() < 2, "this CPU does not run both forms (it needs AVX-512)");
  std::mt19937 rng(9);
  const int64_t n = 3, c = 32, h = 12, w = 10, o = 16;
  const std::vector<double> x = randoms(static_cast<size_t>(n * c * h * w), rng);
  const std::vector<double> gy = randoms(static_cast<size_t>(n * o * h * w), rng);
  const std::vector<double> wt = randoms(static_cast<size_t>(o * c * 9), rng);
  const std::vector<float> wf(wt.begin(), wt.end());
  const std::vector<float> xb = to_blocked(x, {n, c, h, w, c}),
                           gyb = to_blocked(gy, {n, o, h, w, o});
  const std::vector<uint16_t> xh = to_bf16(xb), gyh = to_bf16(gyb);  // rounded: not exact here
  std::vector<std::vector<float>> results[2];
  for (int i = 0; i < 2; ++i) {
    const W::Problem p{n, c, h, w, o, c, o, widths[static_cast<size_t>(i)]};
    std::vector<float> y(gyb.size()), gx(xb.size()), gw(wf.size()), gw_bf16(wf.size());
    W::forward(p, xb.data(), wf.data(), nullptr, y.data());
    W::backward_data(p, gyb.data(), wf.data(), gx.data());
    W::backward_weights(p, xb.data(), gyb.data(), gw.data(), nullptr);
    W::Problem q = p;
    q.bf16 = true;
    std::vector<uint16_t> yh(gyb.size()), gxh(xb.size());
    W::forward(q, xh.data(), wf.data(), nullptr, yh.data());
    W::backward_data(q, gyh.data(), wf.data(), gxh.data());
    W::backward_weights(q, xh.data(), gyh.data(), gw_bf16.data(), nullptr);
    results[i] = {y, gx, gw, from_bf16(yh), from_bf16(gxh), gw_bf16};
  }
  for (size_t k = 0; k < results[0].size(); ++k) {
    CAPTURE(k);  // y, gx, gw in float32, then in bfloat16
    CHECK(results[0][k] == results[1][k]);
  }
}

TEST_CASE("winograd: runs only what it can: whole vectors of channels, a known width and tile") {
  const std::vector<int64_t> widths = cpu_lanes();
  DDP_SKIP_IF(widths.empty(), "this CPU has neither AVX-512 nor AVX2 with FMA");
  const int64_t l = widths.front();
  CHECK(W::fits({2, l, 8, 8, l, l, l, l, 4}));
  CHECK(W::fits({2, l, 7, 5, l, l, l, l, 2}));             // sides need not fill the tiles
  CHECK_FALSE(W::fits({2, l, 8, 8, l, l, l, l, 3}));       // no F(3x3, 3x3)
  CHECK_FALSE(W::fits({2, l + 1, 8, 8, l, l + 1, l, l}));  // channels not in whole vectors
  CHECK_FALSE(W::fits({2, l, 8, 8, l, 0, l, l}));          // x in NCHW (no block)
  CHECK_FALSE(W::fits({2, 2 * l, 8, 8, l, l / 2, l, l}));  // a block narrower than a vector
  CHECK_FALSE(W::fits({2, l, 8, 8, l, l, l, 4}));          // no kernel 4 floats wide
  CHECK_FALSE(W::fits({0, l, 8, 8, l, l, l, l}));          // nothing to do
}

TEST_CASE("winograd: conv2d runs it for 3x3 convolutions oneDNN runs directly, same results") {
  using nn::onednn::ConvAlgorithm;
  const std::vector<int64_t> widths = cpu_lanes();
  DDP_SKIP_IF(widths.empty(), "this CPU has neither AVX-512 nor AVX2 with FMA");
  const ConvAlgorithm before = nn::onednn::conv_algorithm();
  nn::onednn::Conv2dParams p;
  p.n = 4, p.c = 16, p.h = 10, p.w = 12, p.o = 16, p.kh = 3, p.kw = 3, p.pad_h = 1, p.pad_w = 1;
  Generator g(3);
  const Tensor x0 = ops::randn({p.n, p.c, p.h, p.w}, kFloat32, &g);
  const Tensor w0 = ops::randn({p.o, p.c, 3, 3}, kFloat32, &g);
  const Tensor gy = ops::randn({p.n, p.o, p.h, p.w}, kFloat32, &g);
  // [y, gx, gw] under one algorithm setting.
  auto run = [&](ConvAlgorithm a) {
    nn::onednn::set_conv_algorithm(a);
    // Channels-last: our kernel does not read NCHW.
    Tensor x = ops::contiguous(x0, ops::MemoryFormat::ChannelsLast).set_requires_grad(true);
    Tensor w = ops::clone(w0).set_requires_grad(true);
    Tensor y = F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
    y.backward(gy);
    return std::vector<Tensor>{ops::contiguous(y), ops::contiguous(x.grad()), w.grad()};
  };
  nn::onednn::ConvTypes nhwc;
  nhwc.x_nhwc = true;
  nn::onednn::set_conv_algorithm(ConvAlgorithm::Auto);
  CHECK(nn::onednn::conv_uses_winograd(p, nhwc));
  nn::onednn::set_conv_algorithm(ConvAlgorithm::OneDnnOnly);
  CHECK_FALSE(nn::onednn::conv_uses_winograd(p, nhwc));
  const std::vector<Tensor> ours = run(ConvAlgorithm::Auto);
  const std::vector<Tensor> again = run(ConvAlgorithm::Auto);
  const std::vector<Tensor> direct = run(ConvAlgorithm::OneDnnOnly);
  nn::onednn::set_conv_algorithm(before);
  const char* names[] = {"output", "grad input", "grad weight"};
  for (int i = 0; i < 3; ++i) {
    CAPTURE(names[i]);
    CHECK(ops::max_rel_error(ours[i], direct[i]) < 1e-5);
    // Rounded differently from the direct kernel, so it did run; the same bits when run again.
    CHECK(ops::max_abs_diff(ours[i], direct[i]) > 0);
    CHECK(ops::max_abs_diff(ours[i], again[i]) == 0);
  }
}

TEST_CASE("winograd: bfloat16 conv2d runs it where the CPU has no AMX, same results") {
  using nn::onednn::ConvAlgorithm;
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), "oneDNN runs no bfloat16 on this CPU");
  DDP_SKIP_IF(!W::fits({1, 16, 4, 4, 16, 16, 16, 16}), "our kernel needs AVX-512 here");
  const bool amx = nn::onednn::cpu_isa_name() == "avx512_core_amx";
  const ConvAlgorithm before = nn::onednn::conv_algorithm();
  nn::onednn::Conv2dParams p;
  p.n = 4, p.c = 16, p.h = 10, p.w = 12, p.o = 32, p.kh = 3, p.kw = 3, p.pad_h = 1, p.pad_w = 1;
  nn::onednn::ConvTypes types;
  types.prec = nn::onednn::Precision::BFloat16;
  types.x = types.y = nn::onednn::Element::BFloat16;
  types.x_nhwc = true;
  std::mt19937 rng(13);
  auto bf16_array = [&](int64_t count) {
    const std::vector<double> v = bf16_randoms(static_cast<size_t>(count), rng);
    return to_bf16(std::vector<float>(v.begin(), v.end()));
  };
  const std::vector<uint16_t> x = bf16_array(p.n * p.c * p.h * p.w);
  const std::vector<uint16_t> gy = bf16_array(p.n * p.o * p.h * p.w);
  const std::vector<double> wd = randoms(static_cast<size_t>(p.o * p.c * 9), rng);
  const std::vector<float> w(wd.begin(), wd.end());
  struct Result {
    std::vector<float> y, gx, gw;
  };
  auto run = [&](ConvAlgorithm a) {
    nn::onednn::set_conv_algorithm(a);
    std::vector<uint16_t> y(gy.size()), gx(x.size());
    std::vector<float> gw(w.size());
    nn::onednn::conv2d_forward(p, x.data(), w.data(), nullptr, y.data(), types);
    nn::onednn::conv2d_backward(p, x.data(), nullptr, gy.data(), w.data(), gx.data(), gw.data(),
                                nullptr, types);
    return Result{from_bf16(y), from_bf16(gx), gw};
  };
  const Result ours = run(ConvAlgorithm::Auto);
  nn::onednn::set_conv_algorithm(ConvAlgorithm::Auto);
  CHECK(nn::onednn::conv_uses_winograd(p, types) == !amx);
  const Result theirs = run(ConvAlgorithm::OneDnnOnly);
  nn::onednn::set_conv_algorithm(before);
  // Both are float32 sums of the same bfloat16 products, in another order; y and gx are then
  // rounded to bfloat16, so the two can differ by one bfloat16 step.
  auto error = [](const std::vector<float>& got, const std::vector<float>& want) {
    return rel_error(std::vector<double>(got.begin(), got.end()),
                     std::vector<double>(want.begin(), want.end()));
  };
  CHECK(error(ours.y, theirs.y) <= std::ldexp(1.0, -7));
  CHECK(error(ours.gx, theirs.gx) <= std::ldexp(1.0, -7));
  const double gw_error = error(ours.gw, theirs.gw);
  CHECK(gw_error <= 1e-5);
  // Ours ran (other float32 rounding) where there is no AMX; with AMX oneDNN's kernels did.
  CHECK((gw_error > 0) == !amx);
}
