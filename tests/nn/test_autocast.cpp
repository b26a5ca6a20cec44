// Tests of autocast (nn/autocast.h, Note [Autocast]): under a bfloat16 guard conv2d and linear
// agree with float32 to bfloat16's precision and send float32 gradients to float32 parameters;
// on the CPU conv2d writes bfloat16 activations, and batch norm, relu, the residual add_relu and
// pooling carry them (bfloat16 in, bfloat16 out: the float32 op's result rounded), while the
// statistics, the loss and the parameters stay float32; the guard nests, restores, is per-thread
// and refuses what cannot run here with a message that says why. Also the CPU's mixed-precision
// GEMM (bfloat16 operands, float32 result) on its own.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "models/models.h"
#include "nn/autocast.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/onednn.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/threads.h"
#include "tests/test_util.h"

using namespace ddplab;
using testing::check_error_mentions;

namespace {

const char* const kNoBf16 = "oneDNN has no bfloat16 kernels on this CPU (needs AVX-512)";

// bfloat16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.002); a sum of a few hundred
// products of rounded operands stays well within 1% of the largest output.
constexpr double kBf16Tol = 1e-2;

// The values t would hold after a round trip through bfloat16.
Tensor rounded_to_bf16(const Tensor& t) {
  return ops::to(ops::to(t, kBFloat16), kFloat32);
}

// A bfloat16 bit pattern as an integer ordered like the values, so that neighbouring bfloat16
// numbers differ by 1 (and +0 == -0).
int32_t ordered_bits(float v) {
  const uint16_t u = BFloat16(v).x;
  return (u & 0x8000u) ? -static_cast<int32_t>(u & 0x7fffu) : static_cast<int32_t>(u);
}

// The largest distance in bfloat16 ulps between a and b rounded to bfloat16 (0: a is exactly
// b's rounding). Elements that differ by at most `abs_floor` * max|b| count as equal: there a
// different summation order, not the rounding, decides the last bit.
int64_t max_bf16_ulps(const Tensor& a, const Tensor& b, double abs_floor = 0) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<float> va = ops::to(a, kFloat32).to_vector<float>();
  const std::vector<float> vb = ops::to(b, kFloat32).to_vector<float>();
  double scale = 0;
  for (float v : vb) scale = std::max(scale, std::abs(static_cast<double>(v)));
  int64_t worst = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::abs(static_cast<double>(va[i]) - vb[i]) <= abs_floor * scale) continue;
    worst = std::max<int64_t>(worst, std::abs(ordered_bits(va[i]) - ordered_bits(vb[i])));
  }
  return worst;
}

struct Run {
  Tensor y, gx, gw, gb;
  std::string node;
};

using Layer = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

// y = layer(x, w, b) on `device` and the three gradients for a random output gradient, under
// autocast to `amp` when given (else in float32); the results come back on the CPU. x, w and b
// are copied (ops::to on their own device would return them, and two runs would then add their
// gradients into one tensor and compare it with itself).
Run run_layer_on(const Layer& layer, const Tensor& x0, const Tensor& w0, const Tensor& b0,
                 std::optional<DType> amp, Device device) {
  Tensor x = ops::clone(ops::to(x0, device)).set_requires_grad(true);
  Tensor w = ops::clone(ops::to(w0, device)).set_requires_grad(true);
  Tensor b = ops::clone(ops::to(b0, device)).set_requires_grad(true);
  Tensor y;
  {
    std::optional<amp::AutocastGuard> autocast;
    if (amp) autocast.emplace(device, *amp);
    y = layer(x, w, b);
  }
  Run r;
  r.node = y.grad_fn()->name();
  Generator g(3);
  y.backward(ops::to(ops::randn(y.shape(), kFloat32, &g), device));
  r.y = ops::to(y, kCPU), r.gx = ops::to(x.grad(), kCPU), r.gw = ops::to(w.grad(), kCPU);
  r.gb = ops::to(b.grad(), kCPU);
  return r;
}

Run run_layer(const Layer& layer, const Tensor& x0, const Tensor& w0, const Tensor& b0, bool bf16) {
  return run_layer_on(layer, x0, w0, b0, bf16 ? std::optional<DType>(kBFloat16) : std::nullopt,
                      kCPU);
}

// output_dtype: what the layer writes under autocast (bfloat16 for conv2d on the CPU, whose
// output feeds the next layer; float32 elsewhere).
void check_close_to_float32(const Run& bf, const Run& fp, DType output_dtype = kFloat32) {
  const std::string names[] = {"output", "grad input", "grad weight", "grad bias"};
  const Tensor* a[] = {&bf.y, &bf.gx, &bf.gw, &bf.gb};
  const Tensor* b[] = {&fp.y, &fp.gx, &fp.gw, &fp.gb};
  for (int i = 0; i < 4; ++i) {
    CAPTURE(names[i]);
    REQUIRE(a[i]->defined());
    // Float32 gradients for the float32 input and parameters.
    CHECK(a[i]->dtype() == (i == 0 ? output_dtype : kFloat32));
    CHECK(a[i]->shape() == b[i]->shape());
    CHECK(ops::max_rel_error(*a[i], *b[i]) < kBf16Tol);
  }
  // ... and really computed in bfloat16, not float32 under another name.
  CHECK(ops::max_rel_error(bf.y, fp.y) > 1e-6);
}

}  // namespace

TEST_CASE("autocast bf16: conv2d is close to float32, with bfloat16 output, float32 gradients") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  Generator g(1);
  Tensor x = ops::randn({4, 16, 12, 12}, kFloat32, &g);
  Tensor w = ops::mul(ops::randn({32, 16, 3, 3}, kFloat32, &g), 0.1);
  Tensor b = ops::randn({32}, kFloat32, &g);
  auto conv = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    return F::conv2d(x, w, b, {2, 2}, {1, 1});
  };
  Run bf = run_layer(conv, x, w, b, true);
  Run fp = run_layer(conv, x, w, b, false);
  CHECK(bf.node == "ConvolutionBackward(oneDNN bf16)");
  CHECK(fp.node == "ConvolutionBackward(oneDNN)");
  check_close_to_float32(bf, fp, kBFloat16);
  // The forward is exactly "round the operands, compute in float32, round the output" (up to
  // summation order).
  Tensor ref = F::conv2d(rounded_to_bf16(x), rounded_to_bf16(w), b, {2, 2}, {1, 1});
  CHECK(max_bf16_ulps(bf.y, ref, 1e-5) <= 1);
}

TEST_CASE(
    "autocast bf16: a strided convolution's weight gradient, its batch split over two threads, "
    "is the one-thread gradient") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  Generator g(5);
  Tensor w = ops::mul(ops::randn({32, 16, 3, 3}, kFloat32, &g), 0.1);
  Tensor b = ops::randn({32}, kFloat32, &g);
  auto conv = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    return F::conv2d(x, w, b, {2, 2}, {1, 1});
  };
  // 6 images: three per thread; 5: the thread count does not divide them, one thread runs all.
  for (int64_t n : {6, 5}) {
    CAPTURE(n);
    Tensor x = ops::randn({n, 16, 12, 12}, kFloat32, &g);
    Run two, one;
    {
      ScopedNumThreads t(2);
      two = run_layer(conv, x, w, b, true);
      nn::onednn::Conv2dParams p;
      p.n = n, p.c = 16, p.h = p.w = 12, p.o = 32, p.kh = p.kw = 3;
      p.stride_h = p.stride_w = 2, p.pad_h = p.pad_w = 1, p.has_bias = true;
      nn::onednn::ConvTypes types;
      types.prec = nn::onednn::Precision::BFloat16;
      types.x = types.y = nn::onednn::Element::BFloat16;
      // With AMX oneDNN runs another kernel, which keeps its threads.
      const int parts = nn::onednn::conv_backward_weights_parts(p, types);
      if (nn::onednn::cpu_isa_name() != "avx512_core_amx") CHECK(parts == (n == 6 ? 2 : 1));
    }
    {
      ScopedNumThreads t(1);
      one = run_layer(conv, x, w, b, true);
    }
    // The same bfloat16 operands: only the order of the float32 sums differs.
    CHECK(ops::max_rel_error(two.gw, one.gw) < 1e-5);
    CHECK(ops::max_rel_error(two.gb, one.gb) < 1e-5);
    CHECK(ops::max_rel_error(two.gx, one.gx) < 1e-5);
  }
}

TEST_CASE("autocast bf16: linear is close to float32, with float32 output and gradients") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  Generator g(2);
  Tensor x = ops::randn({2, 5, 64}, kFloat32, &g);  // leading dims are flattened into rows
  Tensor w = ops::randn({24, 64}, kFloat32, &g);
  Tensor b = ops::randn({24}, kFloat32, &g);
  auto linear = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    return F::linear(x, w, b);
  };
  Run bf = run_layer(linear, x, w, b, true);
  Run fp = run_layer(linear, x, w, b, false);
  check_close_to_float32(bf, fp);
  Tensor ref = F::linear(rounded_to_bf16(x), rounded_to_bf16(w), b);
  CHECK(ops::max_rel_error(bf.y, ref) < 1e-5);
}

TEST_CASE("autocast on CUDA: float16 and bfloat16 conv2d and linear are close to float32") {
  DDP_SKIP_IF(!cuda_is_available(), "no GPU: the cuDNN and cuBLAS 16-bit kernels need one");
  Generator g(4);
  Tensor x = ops::randn({4, 16, 12, 12}, kFloat32, &g);
  Tensor w = ops::mul(ops::randn({32, 16, 3, 3}, kFloat32, &g), 0.1);
  Tensor b = ops::randn({32}, kFloat32, &g);
  Tensor xl = ops::randn({10, 64}, kFloat32, &g);
  Tensor wl = ops::randn({24, 64}, kFloat32, &g);
  Tensor bl = ops::randn({24}, kFloat32, &g);
  const Layer conv = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    return F::conv2d(x, w, b, {2, 2}, {1, 1});
  };
  const Layer linear = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    return F::linear(x, w, b);
  };
  const Run conv_fp = run_layer_on(conv, x, w, b, std::nullopt, kCPU);
  const Run linear_fp = run_layer_on(linear, xl, wl, bl, std::nullopt, kCPU);
  for (DType t : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    const Run c = run_layer_on(conv, x, w, b, t, cuda(0));
    CHECK(c.node == std::string("ConvolutionBackward(cuDNN ") +
                        (t == kFloat16 ? "float16" : "bfloat16") + ")");
    check_close_to_float32(c, conv_fp);
    check_close_to_float32(run_layer_on(linear, xl, wl, bl, t, cuda(0)), linear_fp);
  }
}

TEST_CASE(
    "autocast bf16: activations flow in bfloat16; BatchNorm's statistics, the loss and the "
    "parameters stay float32") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  manual_seed(0);
  auto model = models::create("cnn", 10, 1, 28);
  model->train();
  Generator g(4);
  Tensor images = ops::randn({8, 1, 28, 28}, kFloat32, &g);
  Tensor labels = ops::randint(0, 10, {8}, &g);
  Tensor loss;
  {
    amp::AutocastGuard autocast(kCPU, kBFloat16);
    auto conv = std::make_shared<nn::Conv2d>(1, 4, 3);
    auto bn = std::make_shared<nn::BatchNorm2d>(4);
    // The convolution's output and batch norm's are activations: bfloat16 (Note [Autocast]).
    Tensor h = (*conv)(images);
    CHECK(h.dtype() == kBFloat16);
    h = (*bn)(h);
    CHECK(h.dtype() == kBFloat16);
    CHECK(bn->running_mean.dtype() == kFloat32);
    Tensor logits = (*model)(images);
    CHECK(logits.dtype() == kFloat32);
    loss = F::cross_entropy(logits, labels);
  }
  CHECK(loss.dtype() == kFloat32);
  CHECK(std::isfinite(loss.item<double>()));
  loss.backward();
  for (const auto& named : model->named_parameters()) {
    const std::string& name = named.first;  // not a structured binding: CAPTURE's lambda reads it
    const Tensor& p = named.second;
    CAPTURE(name);
    CHECK(p.dtype() == kFloat32);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().dtype() == kFloat32);
  }
}

TEST_CASE("autocast: nothing changes outside the guard; guards nest and restore") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  Generator g(5);
  Tensor x = ops::randn({2, 8, 9, 9}, kFloat32, &g);
  Tensor w = ops::randn({8, 8, 3, 3}, kFloat32, &g).set_requires_grad(true);
  Tensor before = F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  CHECK_FALSE(amp::is_autocast_enabled(kCPU));
  {
    amp::AutocastGuard outer(kCPU, kBFloat16);
    CHECK(amp::autocast_dtype(kCPU) == kBFloat16);
    CHECK_FALSE(amp::is_autocast_enabled(cuda(0)));  // per device type
    {
      amp::AutocastGuard off(kCPU, kBFloat16, /*enabled=*/false);
      CHECK_FALSE(amp::is_autocast_enabled(kCPU));
      Tensor inside = F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
      CHECK(inside.grad_fn()->name() == "ConvolutionBackward(oneDNN)");
      CHECK(ops::max_abs_diff(inside, before) == 0);
    }
    CHECK(amp::autocast_dtype(kCPU) == kBFloat16);
    CHECK(F::conv2d(x, w, Tensor(), {1, 1}, {1, 1}).grad_fn()->name() ==
          "ConvolutionBackward(oneDNN bf16)");
    // Another thread has its own state: off.
    bool other_thread_on = true;
    std::thread([&] { other_thread_on = amp::is_autocast_enabled(kCPU); }).join();
    CHECK_FALSE(other_thread_on);
    // Only float32 operands are cast: float64 (gradcheck's type) runs as it is.
    Tensor x64 = ops::to(x, kFloat64), w64 = ops::to(w.detach(), kFloat64);
    CHECK(F::conv2d(x64, w64).dtype() == kFloat64);
    CHECK(F::linear(ops::ones({2, 3}, kFloat64), ops::ones({4, 3}, kFloat64)).dtype() == kFloat64);
  }
  CHECK_FALSE(amp::is_autocast_enabled(kCPU));
  Tensor after = F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  CHECK(after.grad_fn()->name() == "ConvolutionBackward(oneDNN)");
  CHECK(ops::max_abs_diff(after, before) == 0);
}

TEST_CASE("autocast: what cannot run here is refused at the guard, saying why") {
  // float16 on the CPU: names the missing instruction set and the alternative.
  check_error_mentions([] { amp::AutocastGuard a(kCPU, kFloat16); },
                       {"float16", "AVX512-FP16", "bfloat16", "--amp bf16"});
#if !defined(DDP_CUDA)
  // CUDA in a build without the CUDA backend (even on a machine without a GPU: the check needs
  // none).
  check_error_mentions([] { amp::AutocastGuard a(cuda(0), kBFloat16); },
                       {"no CUDA backend", "-Dcuda=enabled"});
#endif
  check_error_mentions([] { amp::AutocastGuard a(kCPU, kFloat32); },
                       {"bfloat16 or float16", "float32"});
  // A refused guard leaves the state as it was.
  CHECK_FALSE(amp::is_autocast_enabled(kCPU));
  // A disabled guard checks nothing: it only turns autocast off.
  amp::AutocastGuard off(kCPU, kFloat16, /*enabled=*/false);
  CHECK_FALSE(amp::is_autocast_enabled(kCPU));
}

TEST_CASE("gemm_: bfloat16 operands with a float32 result (transposes, alpha, beta)") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  Generator g(6);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const int64_t m = 7, n = 5, k = 33;
      Tensor a = ops::to(ops::randn(ta ? Shape{k, m} : Shape{m, k}, kFloat32, &g), kBFloat16);
      Tensor b = ops::to(ops::randn(tb ? Shape{n, k} : Shape{k, n}, kFloat32, &g), kBFloat16);
      Tensor c0 = ops::randn({m, n}, kFloat32, &g);
      Tensor c = ops::clone(c0);
      ops::gemm_(c, a, b, ta, tb, 0.5, 2.0);
      // Reference: the same bfloat16 values, multiplied in float32.
      Tensor ref = ops::clone(c0);
      ops::gemm_(ref, ops::to(a, kFloat32), ops::to(b, kFloat32), ta, tb, 0.5, 2.0);
      CHECK(c.dtype() == kFloat32);
      CHECK(ops::max_rel_error(c, ref) < 1e-5);
    }
  }
  // mm of two bfloat16 matrices still returns bfloat16 (now through the mixed GEMM).
  Tensor a = ops::to(ops::randn({4, 6}, kFloat32, &g), kBFloat16);
  Tensor b = ops::to(ops::randn({6, 3}, kFloat32, &g), kBFloat16);
  Tensor p = ops::mm(a, b);
  CHECK(p.dtype() == kBFloat16);
  CHECK(ops::max_rel_error(ops::to(p, kFloat32),
                           ops::mm(ops::to(a, kFloat32), ops::to(b, kFloat32))) < kBf16Tol);
}

TEST_CASE("autocast bf16: resnet20 trains (the loss falls) on a learnable batch") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  manual_seed(0);
  auto model = models::create("resnet20", 10, 3, 32);
  model->train();
  optim::SGDOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  optim::SGD opt(model->parameters(), o);
  // Images whose class is their mean colour plus noise: learnable in a few steps.
  Generator g(7);
  Tensor labels = ops::randint(0, 10, {32}, &g);
  Tensor shift = ops::reshape(ops::div(ops::to(labels, kFloat32), 5.0), {32, 1, 1, 1});
  Tensor images = ops::add(ops::mul(ops::randn({32, 3, 32, 32}, kFloat32, &g), 0.5), shift);
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    Tensor loss;
    {
      amp::AutocastGuard autocast(kCPU, kBFloat16);
      loss = F::cross_entropy((*model)(images), labels);
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
    (step == 0 ? first : last) = loss.item<double>();
  }
  MESSAGE("resnet20 bf16: loss " << first << " -> " << last << " in 8 steps");
  CHECK(std::isfinite(last));
  CHECK(last < 0.7 * first);
}

// --- bfloat16 activations between layers (the CPU's autocast policy) ---------------------------

namespace {

// A random bfloat16 tensor (values with 8 significant bits), scaled and shifted.
Tensor randn_bf16(const Shape& shape, Generator* g, double scale = 1, double shift = 0) {
  return ops::to(ops::add(ops::mul(ops::randn(shape, kFloat32, g), scale), shift), kBFloat16);
}

// A bfloat16 leaf that wants its gradient.
Tensor leaf(const Tensor& t) {
  return ops::clone(t).set_requires_grad(true);
}

// `a` is bfloat16 and holds exactly the bfloat16 rounding of the float32 tensor `b`.
void check_rounds_to(const Tensor& a, const Tensor& b) {
  REQUIRE(a.defined());
  CHECK(a.dtype() == kBFloat16);
  CHECK(max_bf16_ulps(a, b) == 0);
}

}  // namespace

TEST_CASE("autocast bf16: conv2d reads and writes bfloat16 activations, rounding float32's") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  Generator g(11);
  // Float32 in (the first layer's images) and bfloat16 in (every layer after it); one shape with
  // a bias and stride 2, one that the blocked layouts and Winograd's rule would otherwise treat
  // differently (32 channels, stride 1), and one whose weight gradient runs float32 Winograd
  // (64 channels; Note [bfloat16 weight gradient in Winograd] in nn/onednn.cpp).
  struct Case {
    DType in;
    int64_t c, o, stride;
    bool bias;
  };
  for (const Case& k : {Case{kFloat32, 3, 16, 1, false}, Case{kBFloat16, 16, 16, 2, true},
                        Case{kBFloat16, 32, 32, 1, false}, Case{kBFloat16, 64, 64, 1, false}}) {
    CAPTURE(dtype_name(k.in));
    CAPTURE(k.c);
    Tensor x = leaf(ops::to(randn_bf16({4, k.c, 10, 10}, &g), k.in));
    Tensor w = ops::mul(ops::randn({k.o, k.c, 3, 3}, kFloat32, &g), 0.2).set_requires_grad(true);
    Tensor b = k.bias ? ops::randn({k.o}, kFloat32, &g).set_requires_grad(true) : Tensor();
    const F::Pair stride{k.stride, k.stride};
    Tensor y;
    {
      amp::AutocastGuard autocast(kCPU, kBFloat16);
      y = F::conv2d(x, w, b, stride, {1, 1});
    }
    CHECK(y.dtype() == kBFloat16);
    Tensor gy = randn_bf16(y.shape(), &g);
    y.backward(gy);
    CHECK(x.grad().dtype() == k.in);
    CHECK(w.grad().dtype() == kFloat32);

    // Reference: float32 on the bfloat16 values (the products of two bfloat16 numbers are exact
    // in float32), the output rounded. Only the summation order differs.
    nn::onednn::set_conv_algorithm(nn::onednn::ConvAlgorithm::Direct);
    Tensor xr = leaf(ops::to(x.detach(), kFloat32));
    Tensor wr = leaf(rounded_to_bf16(w.detach()));
    Tensor br = k.bias ? leaf(b.detach()) : Tensor();
    Tensor yr = F::conv2d(xr, wr, br, stride, {1, 1});
    yr.backward(ops::to(gy, kFloat32));
    nn::onednn::set_conv_algorithm(nn::onednn::ConvAlgorithm::Auto);
    CHECK(max_bf16_ulps(y, yr, 1e-5) <= 1);
    if (k.in == kBFloat16) {
      CHECK(max_bf16_ulps(x.grad(), xr.grad(), 1e-5) <= 1);
    } else {
      CHECK(ops::max_rel_error(x.grad(), xr.grad()) < 1e-5);
    }
    CHECK(ops::max_rel_error(w.grad(), wr.grad()) < 1e-5);
    if (k.bias) CHECK(ops::max_rel_error(b.grad(), br.grad()) < 1e-5);
  }
}

TEST_CASE("batch_norm and batch_norm_relu: bfloat16 in, bfloat16 out, float32's bits rounded") {
  // Statistics in double over the same values, float32 weight and bias: the bfloat16 kernel is
  // the float32 one with each result rounded once, in forward and backward, bit for bit.
  Generator g(12);
  const Tensor x0 = randn_bf16({6, 5, 7, 7}, &g, 2.0, 0.5);
  const Tensor gy = randn_bf16(x0.shape(), &g);
  const Tensor w0 = ops::randn({5}, kFloat32, &g), b0 = ops::randn({5}, kFloat32, &g);
  for (bool relu : {false, true}) {
    for (bool training : {true, false}) {
      CAPTURE(relu);
      CAPTURE(training);
      auto run = [&](DType t) {
        Tensor x = leaf(ops::to(x0, t));
        Tensor w = leaf(w0), b = leaf(b0);
        Tensor rm = ops::full({5}, 0.25), rv = ops::full({5}, 1.5);
        const auto op = relu ? F::batch_norm_relu : F::batch_norm;
        Tensor y = op(x, rm, rv, w, b, training, 0.1, 1e-5);
        y.backward(ops::to(gy, t));
        return std::vector<Tensor>{y, x.grad(), w.grad(), b.grad(), rm, rv};
      };
      const std::vector<Tensor> bf = run(kBFloat16), fp = run(kFloat32);
      check_rounds_to(bf[0], fp[0]);            // output
      check_rounds_to(bf[1], fp[1]);            // input gradient
      for (size_t i = 2; i < bf.size(); ++i) {  // float32 parameter gradients and statistics
        CAPTURE(i);
        CHECK(bf[i].dtype() == kFloat32);
        CHECK(ops::max_abs_diff(bf[i], fp[i]) == 0);
      }
    }
  }
  // bfloat16 activations take float32 weight and bias (master weights), and say so otherwise.
  check_error_mentions(
      [&] { F::batch_norm(x0, Tensor(), Tensor(), ops::to(w0, kBFloat16), Tensor(), true); },
      {"weight is bfloat16", "expected a weight of float32"});
}

TEST_CASE("relu, add_relu and pooling: bfloat16 in, bfloat16 out, float32's bits rounded") {
  Generator g(13);
  const Tensor a0 = randn_bf16({4, 6, 8, 8}, &g), b0 = randn_bf16({4, 6, 8, 8}, &g);
  const Tensor gy = randn_bf16(a0.shape(), &g);
  using Op = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Op>> ops_under_test{
      {"AddReluBackward", [](const Tensor& a, const Tensor& b) { return F::add_relu(a, b); }},
      {"ReluBackward", [](const Tensor& a, const Tensor&) { return F::relu(a); }},
      {"",
       [](const Tensor& a, const Tensor&) {
         return F::adaptive_avg_pool2d(a, {1, 1});
       }},
      {"",
       [](const Tensor& a, const Tensor&) {
         return F::adaptive_avg_pool2d(a, {3, 3});
       }},
      {"",
       [](const Tensor& a, const Tensor&) {
         return F::max_pool2d(a, {2, 2});
       }},
  };
  int index = 0;
  for (const auto& [node, op] : ops_under_test) {
    CAPTURE(index++);
    auto run = [&, &op = op](DType t) {
      Tensor a = leaf(ops::to(a0, t)), b = leaf(ops::to(b0, t));
      Tensor y = op(a, b);
      // gy's first values, shaped like y (pooling shrinks it).
      Tensor g_out = ops::reshape(ops::narrow(ops::reshape(gy, {-1}), 0, 0, y.numel()), y.shape());
      y.backward(ops::to(g_out, t));
      return std::make_pair(y, a.grad());
    };
    const auto [y, ga] = run(kBFloat16);
    const auto [yr, gar] = run(kFloat32);
    if (!node.empty()) CHECK(y.grad_fn()->name() == node);  // the fused kernel, not two ops
    check_rounds_to(y, yr);
    check_rounds_to(ga, gar);
  }
}

TEST_CASE("relu's bfloat16 gradient: the mask of y > 0 on the edge values, as float32's") {
  // -0, +0, the smallest subnormal, a normal number, the largest finite, inf, NaN, negatives: the
  // bfloat16 kernel tests the sign on the bits, the float32 one compares.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs{-0.0f, 0.0f,  9.2e-41f,  1.5f,          3.38e38f,      inf,
                              -inf,  -2.0f, -9.2e-41f, std::nanf(""), -std::nanf("")};
  const int64_t n = static_cast<int64_t>(xs.size());
  auto grad_of = [&](DType t) {
    Tensor x = leaf(ops::to(ops::from_vector(xs, {n}), t));
    F::relu(x).backward(ops::to(ops::full({n}, 3.0), t));
    return ops::to(x.grad(), kFloat32).to_vector<float>();
  };
  CHECK(grad_of(kBFloat16) == grad_of(kFloat32));
  CHECK(grad_of(kFloat32) == std::vector<float>{0, 0, 3, 3, 3, 3, 0, 0, 0, 0, 0});
}

TEST_CASE("autograd: two bfloat16 gradients of one tensor are summed into a bfloat16 gradient") {
  // A residual block's input feeds both the convolution and the skip connection, so backward
  // adds two bfloat16 gradients: in float32, rounded once, as ops::add does for bfloat16.
  Generator g(14);
  Tensor x = leaf(randn_bf16({2, 3, 4, 4}, &g));
  Tensor h = ops::clone(x.detach()).set_requires_grad(true);
  Tensor mid = F::relu(h);  // a non-leaf used twice
  Tensor y = F::add_relu(F::batch_norm(mid, Tensor(), Tensor(), Tensor(), Tensor(), true), mid);
  const Tensor gy = randn_bf16(y.shape(), &g);
  y.backward(gy);
  REQUIRE(h.grad().defined());
  CHECK(h.grad().dtype() == kBFloat16);
  // The same graph in float32 on the same values: each path's gradient rounded, then the sum
  // rounded, stays within one bfloat16 ulp of float32's sum rounded once.
  Tensor hr = leaf(ops::to(x.detach(), kFloat32));
  Tensor midr = F::relu(hr);
  Tensor yr = F::add_relu(F::batch_norm(midr, Tensor(), Tensor(), Tensor(), Tensor(), true), midr);
  yr.backward(ops::to(gy, kFloat32));
  CHECK(max_bf16_ulps(h.grad(), hr.grad(), 1e-6) <= 1);
  CHECK(ops::max_abs_diff(h.grad(), hr.grad()) > 0);  // it did run in bfloat16
}

TEST_CASE("autocast bf16: a conv-bn-relu block's gradients are float32's to bfloat16 tolerance") {
  DDP_SKIP_IF(!nn::onednn::cpu_has_bf16_kernels(), kNoBf16);
  // conv -> bn+relu -> conv -> bn -> (+ skip) relu -> pool -> linear -> cross-entropy, the
  // shape of a ResNet block, under autocast and in float32 from the same weights.
  Generator g(15);
  const Tensor images = ops::randn({16, 3, 12, 12}, kFloat32, &g);
  const Tensor labels = ops::randint(0, 10, {16}, &g);
  std::vector<Tensor> init{ops::mul(ops::randn({8, 3, 3, 3}, kFloat32, &g), 0.3),
                           ops::mul(ops::randn({8, 8, 3, 3}, kFloat32, &g), 0.15),
                           ops::add(ops::mul(ops::randn({8}, kFloat32, &g), 0.1), 1.0),
                           ops::mul(ops::randn({8}, kFloat32, &g), 0.1),
                           ops::add(ops::mul(ops::randn({8}, kFloat32, &g), 0.1), 1.0),
                           ops::mul(ops::randn({8}, kFloat32, &g), 0.1),
                           ops::mul(ops::randn({10, 8}, kFloat32, &g), 0.3),
                           ops::zeros({10})};
  auto run = [&](bool bf16) {
    std::vector<Tensor> p;
    p.reserve(init.size());
    for (const Tensor& t : init) p.push_back(leaf(t));
    Tensor loss;
    std::vector<DType> seen;
    {
      std::optional<amp::AutocastGuard> autocast;
      if (bf16) autocast.emplace(kCPU, kBFloat16);
      Tensor h = F::conv2d(images, p[0], Tensor(), {1, 1}, {1, 1});
      Tensor a = F::batch_norm_relu(h, Tensor(), Tensor(), p[2], p[3], true);
      Tensor o = F::batch_norm(F::conv2d(a, p[1], Tensor(), {1, 1}, {1, 1}), Tensor(), Tensor(),
                               p[4], p[5], true);
      Tensor out = F::add_relu(o, a);  // `a` is used twice: its gradients are summed
      Tensor pooled = ddplab::flatten(F::adaptive_avg_pool2d(out, {1, 1}), 1);
      Tensor logits = F::linear(pooled, p[6], p[7]);
      seen = {h.dtype(), a.dtype(), o.dtype(), out.dtype(), pooled.dtype(), logits.dtype()};
      loss = F::cross_entropy(logits, labels);
    }
    loss.backward();
    std::vector<Tensor> grads;
    grads.reserve(p.size());
    for (const Tensor& t : p) grads.push_back(t.grad());
    return std::make_pair(seen, grads);
  };
  const auto [bf_types, bf] = run(true);
  const auto [fp_types, fp] = run(false);
  const DType b = kBFloat16, f = kFloat32;
  CHECK(bf_types == std::vector<DType>{b, b, b, b, b, f});
  CHECK(fp_types == std::vector<DType>{f, f, f, f, f, f});
  for (size_t i = 0; i < bf.size(); ++i) {
    CAPTURE(i);
    CHECK(bf[i].dtype() == kFloat32);
    const double err = ops::max_rel_error(bf[i], fp[i]);
    MESSAGE("parameter " << i << ": gradient error vs float32 " << err);
    // The first layers' weight gradients pass through two batch norms, whose backward subtracts
    // nearly equal terms, so bfloat16's rounding of the activations shows most there: PyTorch's
    // CPU autocast on this block (torch 2.15, five seeds) is 3.6-6.4% off float64 for the first
    // convolution and 3-6% for the second, 0.2-1.5% for the rest. A wrong gradient is 100% off.
    CHECK(err < 0.15);
    CHECK(err > 1e-6);  // really bfloat16
  }
}
