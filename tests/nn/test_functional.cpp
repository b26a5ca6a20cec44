// Tests of nn/functional.h: every op's hand-written backward against finite differences
// (gradcheck, float64), the oneDNN convolution against the im2col reference, PyTorch's
// conventions where they are easy to get subtly wrong (running statistics, count_include_pad,
// adaptive windows, tie-breaking, label smoothing), and error messages.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "nn/conv.h"
#include "nn/functional.h"
#include "nn/onednn.h"
#include "tensor/ops.h"
#include "tensor/threads.h"
#include "tests/test_util.h"

using namespace ddplab;
using F::Pair;
using F::Reduction;
using testing::error_of;

namespace {

Tensor randn64(const Shape& s, uint64_t seed, bool grad = true) {
  Generator g(seed);
  Tensor t = ops::randn(s, kFloat64, &g);
  if (grad) t.set_requires_grad(true);
  return t;
}

// Distinct values (a shuffled ramp) so that max pooling has no near-ties for finite differences.
Tensor distinct64(const Shape& s, uint64_t seed) {
  Generator g(seed);
  int64_t n = shape_numel(s);
  Tensor perm = ops::randperm(n, &g);
  Tensor t = ops::reshape(ops::div(ops::to(perm, kFloat64), static_cast<double>(n)), s);
  t = ops::clone(t);
  t.set_requires_grad(true);
  return t;
}

void check_grad(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                const std::vector<Tensor>& inputs) {
  autograd::GradcheckResult r = autograd::gradcheck(f, inputs);
  CHECK_MESSAGE(r.ok, r.message);
}

struct ConvCfg {
  int64_t n, c, h, w, o, kh, kw;
  Pair stride, padding, dilation;
  int64_t groups;
  bool bias;
};

const std::vector<ConvCfg> kConvCfgs = {
    {2, 3, 6, 5, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {2, 3, 7, 7, 4, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, true},
    {1, 2, 7, 6, 3, 3, 2, {1, 2}, {2, 1}, {2, 1}, 1, false},
    {2, 4, 5, 5, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true},
    {1, 4, 6, 6, 4, 3, 3, {2, 1}, {1, 1}, {1, 2}, 4, false},  // depthwise
    {2, 3, 5, 5, 2, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},   // 1x1
};

}  // namespace

TEST_CASE("conv2d: gradcheck of the im2col path (float64), stride/padding/dilation/groups") {
  for (const ConvCfg& c : kConvCfgs) {
    CAPTURE(c.groups);
    CAPTURE(c.stride[0]);
    Tensor x = randn64({c.n, c.c, c.h, c.w}, 1);
    Tensor w = randn64({c.o, c.c / c.groups, c.kh, c.kw}, 2);
    std::vector<Tensor> in{x, w};
    if (c.bias) in.push_back(randn64({c.o}, 3));
    check_grad(
        [&c](const std::vector<Tensor>& v) {
          return F::conv2d(v[0], v[1], v.size() > 2 ? v[2] : Tensor(), c.stride, c.padding,
                           c.dilation, c.groups);
        },
        in);
  }
}

TEST_CASE("conv2d_reference: gradcheck, and the im2col path agrees with it in float64") {
  const ConvCfg& c = kConvCfgs[3];
  Tensor x = randn64({c.n, c.c, c.h, c.w}, 4);
  Tensor w = randn64({c.o, c.c / c.groups, c.kh, c.kw}, 5);
  Tensor b = randn64({c.o}, 6);
  check_grad(
      [&c](const std::vector<Tensor>& v) {
        return F::conv2d_reference(v[0], v[1], v[2], c.stride, c.padding, c.dilation, c.groups);
      },
      {x, w, b});
  for (const ConvCfg& k : kConvCfgs) {
    Tensor xi = randn64({k.n, k.c, k.h, k.w}, 7, false);
    Tensor wi = randn64({k.o, k.c / k.groups, k.kh, k.kw}, 8, false);
    Tensor a = F::conv2d(xi, wi, Tensor(), k.stride, k.padding, k.dilation, k.groups);
    Tensor r = F::conv2d_reference(xi, wi, Tensor(), k.stride, k.padding, k.dilation, k.groups);
    CHECK(a.shape() == r.shape());
    CHECK(ops::max_abs_diff(a, r) < 1e-12);
  }
}

namespace {

// Forward and all three gradients of F::conv2d (oneDNN in float32) against conv2d_reference.
// Returns F::conv2d's [output, grad input, grad weight, grad bias].
std::vector<Tensor> check_onednn_matches_reference(const ConvCfg& c) {
  CAPTURE(c.c);
  CAPTURE(c.o);
  CAPTURE(c.groups);
  Generator g(11);
  Tensor x0 = ops::randn({c.n, c.c, c.h, c.w}, kFloat32, &g);
  Tensor w0 = ops::randn({c.o, c.c / c.groups, c.kh, c.kw}, kFloat32, &g);
  Tensor b0 = ops::randn({c.o}, kFloat32, &g);
  Tensor gy;
  std::vector<std::vector<Tensor>> results;
  for (bool fast : {true, false}) {
    Tensor x = ops::clone(x0).set_requires_grad(true);
    Tensor w = ops::clone(w0).set_requires_grad(true);
    Tensor b = ops::clone(b0).set_requires_grad(true);
    Tensor y = fast ? F::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups)
                    : F::conv2d_reference(x, w, b, c.stride, c.padding, c.dilation, c.groups);
    if (!gy.defined()) gy = ops::randn(y.shape(), kFloat32, &g);
    y.backward(gy);
    results.push_back({y, x.grad(), w.grad(), b.grad()});
  }
  const char* names[] = {"output", "grad input", "grad weight", "grad bias"};
  for (int i = 0; i < 4; ++i) {
    CAPTURE(names[i]);
    REQUIRE(results[0][i].shape() == results[1][i].shape());
    CHECK(ops::max_rel_error(results[0][i], results[1][i]) < 1e-5);
  }
  return results[0];
}

}  // namespace

TEST_CASE("conv2d: oneDNN (float32) matches conv2d_reference: forward and all three gradients") {
  std::vector<ConvCfg> cfgs = kConvCfgs;
  cfgs.push_back({4, 16, 12, 12, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false});  // blocked layout
  cfgs.push_back({4, 16, 12, 12, 32, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, true});
  for (const ConvCfg& c : cfgs) check_onednn_matches_reference(c);
}

TEST_CASE(
    "conv2d: Winograd for 3x3 stride-1 convolutions of >= 32 channels, both algorithms "
    "match conv2d_reference") {
  using nn::onednn::ConvAlgorithm;
  struct Case {
    ConvCfg cfg;
    bool eligible;  // by the rule of Note [Winograd]
  };
  const std::vector<Case> cases = {
      {{4, 32, 12, 12, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true}, true},
      {{2, 64, 8, 8, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false}, true},
      {{4, 16, 12, 12, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false}, false},  // 16 channels in
      {{4, 32, 12, 12, 32, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false}, false},  // stride 2
      {{4, 32, 12, 12, 32, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false}, false},  // 1x1
  };
  // oneDNN 2.x has Winograd kernels for AVX-512 only, 3.x none on x86; elsewhere everything
  // stays direct.
  const bool has_kernels =
      nn::onednn::cpu_isa_name().rfind("avx512_core", 0) == 0 && nn::onednn::major_version() < 3;
  const ConvAlgorithm before = nn::onednn::conv_algorithm();
  for (const Case& k : cases) {
    const ConvCfg& c = k.cfg;
    nn::onednn::Conv2dParams p;
    p.n = c.n, p.c = c.c, p.h = c.h, p.w = c.w, p.o = c.o, p.kh = c.kh, p.kw = c.kw;
    p.stride_h = c.stride[0], p.stride_w = c.stride[1];
    p.pad_h = c.padding[0], p.pad_w = c.padding[1];
    p.has_bias = c.bias;

    nn::onednn::set_conv_algorithm(ConvAlgorithm::Auto);
    CHECK(nn::onednn::conv_uses_winograd(p) == (k.eligible && has_kernels));
    std::vector<Tensor> fast = check_onednn_matches_reference(c);

    nn::onednn::set_conv_algorithm(ConvAlgorithm::Direct);
    CHECK_FALSE(nn::onednn::conv_uses_winograd(p));
    std::vector<Tensor> direct = check_onednn_matches_reference(c);
    // The setting reaches the kernels: Winograd rounds differently from the direct algorithm.
    if (k.eligible && has_kernels) CHECK(ops::max_abs_diff(fast[0], direct[0]) > 0);
  }
  nn::onednn::set_conv_algorithm(before);
}

TEST_CASE("conv2d: channels-last in and out on the CPU, the same numbers as row-major") {
  // Note [Channels last]: a convolution whose oneDNN kernel writes NHWC returns its output
  // channels-last, and a channels-last input is read as it is. The kernels see the same data
  // either way, so the results are bit for bit those of row-major tensors. Our own Winograd
  // (Note [Winograd of our own]) reads channels-last inputs only, so it would run for
  // one of the pair and not the other: oneDNN's kernels only here.
  using nn::onednn::ConvAlgorithm;
  const ConvAlgorithm before = nn::onednn::conv_algorithm();
  nn::onednn::set_conv_algorithm(ConvAlgorithm::OneDnnOnly);
  const ops::MemoryFormat kLast = ops::MemoryFormat::ChannelsLast;
  const std::vector<ConvCfg> cfgs = {
      {4, 16, 12, 12, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},  // NHWC kernels on AVX-512
      {4, 3, 12, 12, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},   // stem: blocked nChw16c out
      {4, 16, 12, 12, 32, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, true},   // 16 in, 32 out
      {4, 32, 8, 8, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},    // Winograd on AVX-512
      {2, 4, 7, 7, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true},       // groups
      {4, 1, 12, 12, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},    // one channel in
  };
  for (const ConvCfg& c : cfgs) {
    CAPTURE(c.c);
    CAPTURE(c.o);
    Generator g(5);
    Tensor x0 = ops::randn({c.n, c.c, c.h, c.w}, kFloat32, &g);
    Tensor w0 = ops::randn({c.o, c.c / c.groups, c.kh, c.kw}, kFloat32, &g);
    std::vector<std::vector<Tensor>> results;
    Tensor gy;
    for (bool last_in : {false, true}) {
      Tensor x = ops::contiguous(x0, last_in ? kLast : ops::MemoryFormat::Contiguous);
      x.set_requires_grad(true);
      Tensor w = ops::clone(w0).set_requires_grad(true);
      Tensor y = F::conv2d(x, w, Tensor(), c.stride, c.padding, c.dilation, c.groups);
      nn::onednn::Conv2dParams p;
      p.n = c.n, p.c = c.c, p.h = c.h, p.w = c.w, p.o = c.o, p.kh = c.kh, p.kw = c.kw;
      p.stride_h = c.stride[0], p.stride_w = c.stride[1], p.pad_h = c.padding[0];
      p.pad_w = c.padding[1], p.groups = c.groups;
      // The output's format: channels-last where the kernel writes NHWC, and after a
      // channels-last input (a channels-last network stays so), which includes any input with
      // one channel (its bytes are the same in both formats).
      nn::onednn::ConvTypes types;
      types.x_nhwc = last_in || c.c == 1;
      CHECK((ops::suggest_memory_format(y) == kLast) == nn::onednn::conv2d_output_nhwc(p, types));
      if (last_in || c.c == 1) CHECK(ops::suggest_memory_format(y) == kLast);
      if (!gy.defined()) gy = ops::randn(y.shape(), kFloat32, &g);
      y.backward(gy);
      results.push_back({y, x.grad(), w.grad()});
    }
    for (size_t i = 0; i < 3; ++i) CHECK(ops::max_abs_diff(results[0][i], results[1][i]) == 0);
  }
  // On AVX-512 the 16-channel layers run NHWC kernels: the case the format exists for.
  if (nn::onednn::cpu_isa_name().rfind("avx512_core", 0) == 0) {
    nn::onednn::Conv2dParams p;
    p.n = 4, p.c = 16, p.h = 12, p.w = 12, p.o = 16, p.kh = 3, p.kw = 3, p.pad_h = 1, p.pad_w = 1;
    CHECK(nn::onednn::conv2d_output_nhwc(p));
    // Wider layers: oneDNN writes nChw16c in float32 (Winograd or direct), held channels-last so
    // that blocked activations take its bytes as they are, even after an NCHW input; NHWC in
    // bfloat16 (Note [Winograd]).
    p.c = 32, p.o = 32;
    CHECK(nn::onednn::conv2d_output_nhwc(p));
    const nn::onednn::ConvTypes bf16{nn::onednn::Precision::BFloat16, nn::onednn::Element::BFloat16,
                                     nn::onednn::Element::BFloat16};
    CHECK(nn::onednn::conv2d_output_nhwc(p, bf16));
  }
  nn::onednn::set_conv_algorithm(before);
}

TEST_CASE("conv2d: oneDNN primitives are cached per shape") {
  Generator g(1);
  Tensor x = ops::randn({2, 8, 9, 9}, kFloat32, &g);
  Tensor w = ops::randn({8, 8, 3, 3}, kFloat32, &g);
  F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  size_t n = nn::onednn::conv_cache_size();
  F::conv2d(ops::randn({2, 8, 9, 9}, kFloat32, &g), w, Tensor(), {1, 1}, {1, 1});
  CHECK(nn::onednn::conv_cache_size() == n);
  F::conv2d(x, w, Tensor(), {2, 2}, {1, 1});
  CHECK(nn::onednn::conv_cache_size() == n + 1);
}

TEST_CASE("conv2d: primitives per thread count; backward runs with forward's count") {
  // Note [Threads under load] (tensor/adaptive_threads.cpp): oneDNN keeps the work split of the
  // count a primitive was built for, so a new count builds new primitives; and a backward run
  // after the count changed (adapt_threads between forward and backward) must use forward's
  // primitives, whose layouts its saved tensors are in.
  const ScopedNumThreads two(2);
  Generator g(2);
  Tensor x = ops::randn({3, 16, 11, 11}, kFloat32, &g);  // a shape no other case uses
  Tensor w = ops::randn({16, 16, 3, 3}, kFloat32, &g);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const size_t before = nn::onednn::conv_cache_size();
  Tensor y = F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  CHECK(nn::onednn::conv_cache_size() == before + 1);
  std::vector<Tensor> grads;
  {
    const ScopedNumThreads one(1);
    grads = autograd::grad({y}, {x, w}, {ops::ones_like(y)});
    CHECK(nn::onednn::conv_cache_size() == before + 1);  // forward's primitives, not new ones
    F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
    CHECK(nn::onednn::conv_cache_size() == before + 2);  // one thread: primitives of its own
  }
  // And the gradients are those of a run at one count throughout.
  Tensor x2 = ops::clone(x.detach()), w2 = ops::clone(w.detach());
  x2.set_requires_grad(true);
  w2.set_requires_grad(true);
  Tensor y2 = F::conv2d(x2, w2, Tensor(), {1, 1}, {1, 1});
  const std::vector<Tensor> want = autograd::grad({y2}, {x2, w2}, {ops::ones_like(y2)});
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(ops::max_abs_diff(grads[i], want[i]) == 0.0);
  }
}

TEST_CASE("conv2d: error messages name both shapes") {
  Tensor x = ops::zeros({2, 3, 8, 8});
  Tensor w = ops::zeros({4, 2, 3, 3});
  std::string m = error_of([&] { F::conv2d(x, w); });
  CHECK(m.find("[2, 3, 8, 8]") != std::string::npos);
  CHECK(m.find("[4, 2, 3, 3]") != std::string::npos);
  m = error_of([&] { F::conv2d(ops::zeros({2, 3, 2, 2}), ops::zeros({4, 3, 3, 3})); });
  CHECK(m.find("larger than the padded input") != std::string::npos);
  m = error_of([&] { F::conv2d(ops::zeros({3, 8, 8}), w); });
  CHECK(m.find("4-D input") != std::string::npos);
}

// batch_norm's reference kernels (nn/batchnorm_contiguous.cpp), which every other form of batch
// norm is tested equal to, against finite differences and PyTorch's formulas.
TEST_CASE("batch_norm: gradcheck in training mode (4-D and 2-D), input, weight and bias") {
  for (Shape s : {Shape{3, 2, 3, 2}, Shape{5, 3}}) {
    CAPTURE(shape_str(s));
    Tensor x = randn64(s, 21);
    Tensor w = randn64({s[1]}, 22);
    Tensor b = randn64({s[1]}, 23);
    check_grad(
        [](const std::vector<Tensor>& v) {
          return F::batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], true, 0.1, 1e-5);
        },
        {x, w, b});
    // affine=false: only the input
    check_grad(
        [](const std::vector<Tensor>& v) {
          return F::batch_norm(v[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
        },
        {randn64(s, 24)});
  }
}

TEST_CASE("batch_norm: gradcheck in eval mode uses the running statistics") {
  Tensor x = randn64({2, 3, 2, 2}, 31);
  Tensor w = randn64({3}, 32);
  Tensor b = randn64({3}, 33);
  Tensor rm = ops::from_vector(std::vector<double>{0.1, -0.2, 0.3}, {3}, kFloat64);
  Tensor rv = ops::from_vector(std::vector<double>{1.5, 0.5, 2.0}, {3}, kFloat64);
  check_grad(
      [&](const std::vector<Tensor>& v) { return F::batch_norm(v[0], rm, rv, v[1], v[2], false); },
      {x, w, b});
  // Value: (x - rm) / sqrt(rv + eps) * w + b
  Tensor y = F::batch_norm(x.detach(), rm, rv, w.detach(), b.detach(), false, 0.1, 1e-5);
  std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  std::vector<double> wv = w.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> m{0.1, -0.2, 0.3}, var{1.5, 0.5, 2.0};
  for (size_t i = 0; i < xv.size(); ++i) {
    size_t c = i / 4 % 3;
    CHECK(yv[i] == doctest::Approx((xv[i] - m[c]) / std::sqrt(var[c] + 1e-5) * wv[c] + bv[c]));
  }
}

TEST_CASE("batch_norm: running statistics update like PyTorch (momentum, unbiased variance)") {
  Tensor x = ops::reshape(ops::arange(0, 16, 1, kFloat32), {2, 2, 2, 2});  // channel 0: 0..3, 8..11
  Tensor rm = ops::full({2}, 1.0);
  Tensor rv = ops::full({2}, 2.0);
  Tensor y = F::batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.25, 1e-5);
  // channel 0 values {0,1,2,3,8,9,10,11}: mean 5.5, biased var 17.25, unbiased 17.25*8/7
  std::vector<float> m = rm.to_vector<float>(), v = rv.to_vector<float>();
  CHECK(m[0] == doctest::Approx(0.75 * 1.0 + 0.25 * 5.5));
  CHECK(m[1] == doctest::Approx(0.75 * 1.0 + 0.25 * 9.5));
  CHECK(v[0] == doctest::Approx(0.75 * 2.0 + 0.25 * 17.25 * 8 / 7));
  CHECK(v[1] == doctest::Approx(0.75 * 2.0 + 0.25 * 17.25 * 8 / 7));
  // normalization uses the biased variance
  CHECK(y.to_vector<float>()[0] == doctest::Approx((0 - 5.5) / std::sqrt(17.25 + 1e-5)));
  // eval mode leaves the statistics alone
  F::batch_norm(x, rm, rv, Tensor(), Tensor(), false);
  CHECK(rm.to_vector<float>() == m);
  // a single value per channel cannot be normalized in training
  std::string e = error_of([&] {
    F::batch_norm(ops::zeros({1, 2}), rm, rv, Tensor(), Tensor(), true);
  });
  CHECK(e.find("more than 1 value per channel") != std::string::npos);
  e = error_of([&] { F::batch_norm(x, rm, rv, ops::ones({3}), Tensor(), true); });
  CHECK(e.find("[3]") != std::string::npos);
  CHECK(e.find("[2, 2, 2, 2]") != std::string::npos);
}

TEST_CASE("batch_norm_relu, add_relu: gradcheck in float64 (training and eval)") {
  // Shifted so that the relu clamps a good part of the values (and none sits on the kink).
  Tensor x = randn64({3, 2, 3, 2}, 41);
  Tensor w = randn64({2}, 42);
  Tensor b = ops::add(randn64({2}, 43, false), 0.3);
  b.set_requires_grad(true);
  check_grad(
      [](const std::vector<Tensor>& v) {
        return F::batch_norm_relu(v[0], Tensor(), Tensor(), v[1], v[2], true, 0.1, 1e-5);
      },
      {x, w, b});
  Tensor rm = ops::from_vector(std::vector<double>{0.1, -0.2}, {2}, kFloat64);
  Tensor rv = ops::from_vector(std::vector<double>{1.5, 0.5}, {2}, kFloat64);
  check_grad(
      [&](const std::vector<Tensor>& v) {
        return F::batch_norm_relu(v[0], rm, rv, v[1], v[2], false);
      },
      {x, w, b});
  check_grad([](const std::vector<Tensor>& v) { return F::add_relu(v[0], v[1]); },
             {randn64({2, 3, 2, 2}, 44), randn64({2, 3, 2, 2}, 45)});
  // Broadcasting takes the unfused path, with the same gradients.
  check_grad([](const std::vector<Tensor>& v) { return F::add_relu(v[0], v[1]); },
             {randn64({2, 3}, 46), randn64({3}, 47)});
}

// The fused forms (nn/batchnorm_kernels.cpp, nn/functional.cpp) against the separate calls.
TEST_CASE("batch_norm_relu, add_relu: bit for bit relu(batch_norm) and relu(a + b) in float32") {
  Generator g(48);
  const Shape s{4, 3, 5, 5};
  Tensor x = ops::randn(s, kFloat32, &g), w = ops::randn({3}, kFloat32, &g);
  Tensor b = ops::randn({3}, kFloat32, &g), dy = ops::randn(s, kFloat32, &g);
  // [0]: fused, [1]: the two ops; each with its own leaves and running statistics.
  for (bool training : {true, false}) {
    CAPTURE(training);
    std::vector<Tensor> y(2), dx(2), dw(2), db(2), rm(2), rv(2);
    for (int k = 0; k < 2; ++k) {
      Tensor xl = ops::clone(x), wl = ops::clone(w), bl = ops::clone(b);
      for (Tensor* t : {&xl, &wl, &bl}) t->set_requires_grad(true);
      rm[k] = ops::full({3}, 0.5);
      rv[k] = ops::full({3}, 2.0);
      y[k] = k == 0 ? F::batch_norm_relu(xl, rm[k], rv[k], wl, bl, training)
                    : F::relu(F::batch_norm(xl, rm[k], rv[k], wl, bl, training));
      autograd::backward({y[k]}, {dy});
      dx[k] = xl.grad();
      dw[k] = wl.grad();
      db[k] = bl.grad();
    }
    for (auto* v : {&y, &dx, &dw, &db, &rm, &rv}) {
      CHECK((*v)[0].to_vector<float>() == (*v)[1].to_vector<float>());
    }
    CHECK(ops::amin(y[0]).item<float>() == 0.0f);  // the clamp did something
  }
  Tensor a = ops::randn(s, kFloat32, &g), c = ops::randn(s, kFloat32, &g);
  std::vector<Tensor> z(2), da(2), dc(2);
  for (int k = 0; k < 2; ++k) {
    Tensor al = ops::clone(a), cl = ops::clone(c);
    al.set_requires_grad(true);
    cl.set_requires_grad(true);
    z[k] = k == 0 ? F::add_relu(al, cl) : F::relu(al + cl);
    autograd::backward({z[k]}, {dy});
    da[k] = al.grad();
    dc[k] = cl.grad();
  }
  for (auto* v : {&z, &da, &dc}) CHECK((*v)[0].to_vector<float>() == (*v)[1].to_vector<float>());
}

TEST_CASE("max_pool2d: gradcheck, and ties send the gradient to the first maximum") {
  check_grad(
      [](const std::vector<Tensor>& v) {
        return F::max_pool2d(v[0], {2, 2});
      },
      {distinct64({2, 2, 4, 6}, 41)});
  check_grad(
      [](const std::vector<Tensor>& v) {
        return F::max_pool2d(v[0], {3, 3}, {2, 2}, {1, 1});
      },
      {distinct64({1, 2, 7, 6}, 42)});
  check_grad(
      [](const std::vector<Tensor>& v) {
        return F::max_pool2d(v[0], {3, 2}, {1, 2}, {1, 0});
      },
      {distinct64({1, 1, 5, 6}, 43)});
  Tensor x = ops::ones({1, 1, 2, 2}, kFloat64).set_requires_grad(true);
  F::max_pool2d(x, {2, 2}).backward(ops::ones({1, 1, 1, 1}, kFloat64));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 0, 0, 0});
}

TEST_CASE("max_pool2d: the 2x2 stride-2 paths follow the general rule on ties and NaNs") {
  // Few distinct values (many ties) and some NaNs, odd sizes (the last row and column fall out),
  // against the rule written out: row-major order, a strictly greater value or a NaN (over a
  // number) takes the window. The gradient shows which input each window chose. A channels-last
  // x runs the kernel over channels (its output stays channels-last), a row-major one the
  // kernel over planes.
  for (const auto& mode :
       {std::pair{kFloat32, false}, std::pair{kFloat64, false}, std::pair{kBFloat16, false},
        std::pair{kFloat32, true}, std::pair{kFloat64, true}, std::pair{kBFloat16, true}}) {
    const DType dt = mode.first;
    const bool last = mode.second;  // not a structured binding: CAPTURE reads it
    CAPTURE(dtype_name(dt));
    CAPTURE(last);
    const int64_t n = 2, c = 3, h = 7, w = 9, oh = 3, ow = 4;
    Generator g(5);
    std::vector<double> v = ops::randint(0, 3, {n, c, h, w}, &g).to_vector<double>();
    for (size_t i = 0; i < v.size(); i += 17) v[i] = std::nan("");
    Tensor x = ops::from_vector(v, {n, c, h, w}, dt);
    if (last) x = ops::contiguous(x, ops::MemoryFormat::ChannelsLast);
    x.set_requires_grad(true);
    Tensor y = F::max_pool2d(x, {2, 2});
    REQUIRE(y.shape() == Shape{n, c, oh, ow});
    CHECK(ops::is_contiguous(y, ops::MemoryFormat::ChannelsLast) == last);
    // Freed memory of x's size holding 7s, which the caching allocator hands to the gradient: an
    // input value the backward leaves unwritten (an odd size's last row or column, a window's
    // loser) shows as a 7 in the check below.
    { const Tensor dirt = ops::full({n, c, h, w}, 7.0, dt); }
    y.backward(ops::ones(y.shape(), dt));
    std::vector<double> got = y.to_vector<double>(), grad = x.grad().to_vector<double>();
    std::vector<double> want_grad(v.size(), 0.0);
    for (int64_t p = 0; p < n * c; ++p) {
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          int64_t best = -1;
          for (int64_t i = 0; i < 2; ++i) {
            for (int64_t j = 0; j < 2; ++j) {
              const int64_t at = (p * h + 2 * oy + i) * w + 2 * ox + j;
              if (best < 0 || v[at] > v[best] || (std::isnan(v[at]) && !std::isnan(v[best]))) {
                best = at;
              }
            }
          }
          const double out = got[(p * oh + oy) * ow + ox];
          CHECK((std::isnan(v[best]) ? std::isnan(out) : out == v[best]));
          want_grad[best] = 1;
        }
      }
    }
    CHECK(grad == want_grad);
  }
}

TEST_CASE("avg_pool2d: gradcheck, count_include_pad=True divisor") {
  check_grad(
      [](const std::vector<Tensor>& v) {
        return F::avg_pool2d(v[0], {3, 3}, {2, 2}, {1, 1});
      },
      {randn64({2, 2, 5, 6}, 51)});
  check_grad(
      [](const std::vector<Tensor>& v) {
        return F::avg_pool2d(v[0], {2, 2});
      },
      {randn64({1, 2, 4, 5}, 52)});
  // Corner window of a 3x3 kernel with padding 1 covers 4 real pixels but divides by 9.
  Tensor y = F::avg_pool2d(ops::ones({1, 1, 4, 4}, kFloat64), {3, 3}, {1, 1}, {1, 1});
  CHECK(y.to_vector<double>()[0] == doctest::Approx(4.0 / 9.0));
  // Window running past the padding (5 = 2*2+1 with kernel 2, stride 2, padding 1): divisor
  // counts only up to the padded edge, like PyTorch's hend = min(hstart + k, H + pad).
  Tensor z = F::avg_pool2d(ops::ones({1, 1, 5, 5}, kFloat64), {2, 2}, {2, 2}, {1, 1});
  CHECK(z.shape() == Shape{1, 1, 3, 3});
  CHECK(z.to_vector<double>()[0] == doctest::Approx(0.25));
}

TEST_CASE("adaptive_avg_pool2d: gradcheck and PyTorch's window formula") {
  check_grad(
      [](const std::vector<Tensor>& v) {
        return F::adaptive_avg_pool2d(v[0], {3, 2});
      },
      {randn64({2, 2, 7, 5}, 61)});
  check_grad(
      [](const std::vector<Tensor>& v) {
        return F::adaptive_avg_pool2d(v[0], {1, 1});
      },
      {randn64({2, 3, 4, 4}, 62)});
  // 1-D analogue along W: In=5, Out=3 windows [0,2), [1,4), [3,5)
  Tensor x = ops::reshape(ops::arange(0, 5, 1, kFloat64), {1, 1, 1, 5});
  Tensor y = F::adaptive_avg_pool2d(x, {1, 3});
  CHECK(y.to_vector<double>() == std::vector<double>{0.5, 2.0, 3.5});
}

TEST_CASE("relu, log_softmax: gradcheck") {
  Tensor x = randn64({3, 4}, 71);
  check_grad([](const std::vector<Tensor>& v) { return F::relu(v[0]); }, {x});
  check_grad([](const std::vector<Tensor>& v) { return F::log_softmax(v[0], -1); },
             {randn64({3, 5}, 72)});
  check_grad([](const std::vector<Tensor>& v) { return F::log_softmax(v[0], 1); },
             {randn64({2, 4, 3}, 73)});
  // rows of exp(log_softmax) sum to 1, also for huge logits
  Tensor big = ops::mul(randn64({2, 6}, 74, false), 1000.0);
  Tensor p = ops::exp(F::log_softmax(big));
  std::vector<double> s = ops::sum(p, {1}).to_vector<double>();
  CHECK(s[0] == doctest::Approx(1.0));
  CHECK(s[1] == doctest::Approx(1.0));
}

TEST_CASE("cross_entropy: gradcheck for each reduction, with and without label smoothing") {
  Tensor target = ops::from_vector(std::vector<int64_t>{2, 0, 4, 1}, {4}, kInt64);
  for (double eps : {0.0, 0.1}) {
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      CAPTURE(eps);
      CAPTURE(static_cast<int>(r));
      check_grad(
          [&](const std::vector<Tensor>& v) { return F::cross_entropy(v[0], target, r, eps); },
          {randn64({4, 5}, 81)});
    }
  }
  // value: (1-eps) * nll + eps * mean_c(-log p_c), averaged over rows
  Tensor x = randn64({4, 5}, 82, false);
  Tensor lp = F::log_softmax(x, 1);
  std::vector<double> l = lp.to_vector<double>();
  double expect = 0;
  std::vector<int64_t> t{2, 0, 4, 1};
  for (int r = 0; r < 4; ++r) {
    double smooth = 0;
    for (int c = 0; c < 5; ++c) smooth -= l[r * 5 + c] / 5;
    expect += 0.9 * -l[r * 5 + t[r]] + 0.1 * smooth;
  }
  CHECK(F::cross_entropy(x, target, Reduction::Mean, 0.1).item<double>() ==
        doctest::Approx(expect / 4));
  CHECK(F::cross_entropy(x, target, Reduction::Sum, 0.1).item<double>() == doctest::Approx(expect));
  std::string e = error_of([&] { F::cross_entropy(x, ops::zeros({3}, kInt64)); });
  CHECK(e.find("[3]") != std::string::npos);
  CHECK(e.find("[4, 5]") != std::string::npos);
  e = error_of([&] {
    F::cross_entropy(x, ops::from_vector(std::vector<int64_t>{0, 5, 1, 1}, {4}, kInt64));
  });
  CHECK(e.find("out of range") != std::string::npos);
}

TEST_CASE("linear: gradcheck (2-D and 3-D input, with and without bias), shape errors") {
  check_grad([](const std::vector<Tensor>& v) { return F::linear(v[0], v[1], v[2]); },
             {randn64({3, 4}, 91), randn64({5, 4}, 92), randn64({5}, 93)});
  check_grad([](const std::vector<Tensor>& v) { return F::linear(v[0], v[1]); },
             {randn64({2, 3, 4}, 94), randn64({2, 4}, 95)});
  std::string e = error_of([] { F::linear(ops::zeros({4, 3}), ops::zeros({5, 7})); });
  CHECK(e.find("[4, 3]") != std::string::npos);
  CHECK(e.find("[5, 7]") != std::string::npos);
}

TEST_CASE("dropout: gradcheck with a fixed mask, scaling, eval is the identity") {
  check_grad(
      [](const std::vector<Tensor>& v) {
        Generator g(1234);  // the same seed each call: the same mask
        return F::dropout(v[0], 0.3, true, &g);
      },
      {randn64({4, 6}, 101)});
  Tensor x = ops::ones({1000});
  Generator g(5);
  std::vector<float> y = F::dropout(x, 0.25, true, &g).to_vector<float>();
  int kept = 0;
  for (float v : y) {
    CHECK((v == 0.0f || v == doctest::Approx(1 / 0.75)));
    kept += v != 0.0f;
  }
  CHECK(kept > 650);
  CHECK(kept < 850);
  CHECK(F::dropout(x, 0.5, false).is_same(x));
}

TEST_CASE("accuracy") {
  Tensor logits = ops::from_vector(std::vector<float>{0, 1, 2, 5, 1, 0, 0, 3, 1}, {3, 3});
  Tensor target = ops::from_vector(std::vector<int64_t>{2, 0, 0}, {3}, kInt64);
  CHECK(F::accuracy(logits, target) == doctest::Approx(2.0 / 3.0));
}
