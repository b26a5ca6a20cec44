// Tests of autocast (nn/autocast.h, Note [Autocast]): under a bfloat16 guard conv2d and linear
// agree with float32 to bfloat16's precision, write float32 outputs, and send float32 gradients
// to float32 parameters; BatchNorm and the loss stay float32; the guard nests, restores, is
// per-thread and refuses what cannot run here with a message that says why. Also the CPU's
// mixed-precision GEMM (bfloat16 operands, float32 result) on its own.
#include <doctest/doctest.h>

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

struct Run {
  Tensor y, gx, gw, gb;
  std::string node;
};

using Layer = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

// y = layer(x, w, b) on `device` and the three gradients for a random output gradient, under
// autocast to `amp` when given (else in float32); the results come back on the CPU.
Run run_layer_on(const Layer& layer, const Tensor& x0, const Tensor& w0, const Tensor& b0,
                 std::optional<DType> amp, Device device) {
  Tensor x = ops::to(x0, device).set_requires_grad(true);
  Tensor w = ops::to(w0, device).set_requires_grad(true);
  Tensor b = ops::to(b0, device).set_requires_grad(true);
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

void check_close_to_float32(const Run& bf, const Run& fp) {
  const std::string names[] = {"output", "grad input", "grad weight", "grad bias"};
  const Tensor* a[] = {&bf.y, &bf.gx, &bf.gw, &bf.gb};
  const Tensor* b[] = {&fp.y, &fp.gx, &fp.gw, &fp.gb};
  for (int i = 0; i < 4; ++i) {
    CAPTURE(names[i]);
    REQUIRE(a[i]->defined());
    // Float32 outputs and float32 gradients for the float32 input and parameters.
    CHECK(a[i]->dtype() == kFloat32);
    CHECK(a[i]->shape() == b[i]->shape());
    CHECK(ops::max_rel_error(*a[i], *b[i]) < kBf16Tol);
  }
  // ... and really computed in bfloat16, not float32 under another name.
  CHECK(ops::max_rel_error(bf.y, fp.y) > 1e-6);
}

}  // namespace

TEST_CASE("autocast bf16: conv2d is close to float32, with float32 output and gradients") {
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
  check_close_to_float32(bf, fp);
  // The forward is exactly "round the operands, then compute in float32" (up to summation order).
  Tensor ref = F::conv2d(rounded_to_bf16(x), rounded_to_bf16(w), b, {2, 2}, {1, 1});
  CHECK(ops::max_rel_error(bf.y, ref) < 1e-5);
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

TEST_CASE("autocast bf16: a model step keeps BatchNorm, the loss and the parameters float32") {
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
    Tensor h = (*conv)(images);
    CHECK(h.dtype() == kFloat32);
    h = (*bn)(h);
    CHECK(h.dtype() == kFloat32);
    CHECK(bn->running_mean.dtype() == kFloat32);
    Tensor logits = (*model)(images);
    CHECK(logits.dtype() == kFloat32);
    loss = F::cross_entropy(logits, labels);
  }
  CHECK(loss.dtype() == kFloat32);
  CHECK(std::isfinite(loss.item<double>()));
  loss.backward();
  for (const auto& [name, p] : model->named_parameters()) {
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
