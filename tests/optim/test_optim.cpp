// Unit tests of optim/: a hand-computed SGD step, optimizer checkpoints that resume exactly,
// parameters without gradients, clip_grad_norm_. (PyTorch parity: check_optim.py.)
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;

TEST_CASE("SGD: momentum and weight decay by hand") {
  Tensor p = ops::from_vector<float>({1.0f, -2.0f}, {2});
  p.set_requires_grad(true);
  optim::SGD opt({p}, {0.1, 0.9, 0, 0.01, false});
  p.set_grad(ops::from_vector<float>({0.5f, 0.5f}, {2}));
  opt.step();
  // d = g + 0.01 p = (0.51, 0.48); buf = d; p -= 0.1 d
  CHECK(p.to_vector<float>()[0] == doctest::Approx(1 - 0.051));
  CHECK(p.to_vector<float>()[1] == doctest::Approx(-2 - 0.048));
  p.set_grad(ops::from_vector<float>({0.0f, 0.0f}, {2}));
  opt.step();
  // d = 0.01 p; buf = 0.9 buf + d; p -= 0.1 buf
  double p0 = 1 - 0.051, d0 = 0.01 * p0, buf0 = 0.9 * 0.51 + d0;
  CHECK(p.to_vector<float>()[0] == doctest::Approx(p0 - 0.1 * buf0));
  CHECK(opt.step_count(0) == 2);
}

TEST_CASE("SGD: the one-pass momentum step equals the op-by-op one bit for bit") {
  // p1's contiguous gradient takes the one-pass kernel; p2's transposed (non-contiguous) copy of
  // the same gradient takes the op-by-op path.
  for (DType dt : {kFloat32, kFloat64}) {
    for (bool nesterov : {false, true}) {
      CAPTURE(nesterov);
      Generator gen(9);
      Tensor p1 = ops::randn({4, 3}, dt, &gen);
      Tensor p2 = ops::clone(p1);
      p1.set_requires_grad(true);
      p2.set_requires_grad(true);
      const optim::SGDOptions o{0.1, 0.9, nesterov ? 0.0 : 0.25, 0.01, nesterov};
      optim::SGD o1(std::vector<Tensor>{p1}, o), o2(std::vector<Tensor>{p2}, o);
      for (int step = 0; step < 3; ++step) {
        Tensor g = ops::randn({3, 4}, dt, &gen);
        p1.set_grad(ops::contiguous(ops::transpose(g, 0, 1)));
        p2.set_grad(ops::transpose(g, 0, 1));
        REQUIRE(!p2.grad().is_contiguous());
        o1.step();
        o2.step();
      }
      CHECK(ops::allclose(p1, p2, 0, 0));
      CHECK(ops::allclose(o1.state(0).at("momentum_buffer"), o2.state(0).at("momentum_buffer"), 0,
                          0));
      CHECK(o1.step_count(0) == 3);
    }
  }
}

TEST_CASE("Optimizer: parameters without a gradient are skipped; zero_grad") {
  Tensor a = ops::ones({2}), b = ops::ones({2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  optim::Adam opt(std::vector<Tensor>{a, b}, optim::AdamOptions{});
  a.set_grad(ops::ones({2}));
  opt.step();
  CHECK(ops::sum_all(b) == 2.0);
  CHECK(ops::sum_all(a) < 2.0);
  CHECK(opt.step_count(1) == 0);
  opt.zero_grad();
  CHECK(!a.grad().defined());
}

TEST_CASE("Optimizer: state_dict save/load resumes bit-exactly") {
  std::string path = "/tmp/ddplab_test_optim_" + std::to_string(::getpid()) + ".safetensors";
  for (int kind = 0; kind < 2; ++kind) {
    Generator gen(3);
    Tensor p1 = ops::randn({4, 3}, {}, &gen);
    p1.set_requires_grad(true);
    Tensor p2 = ops::clone(p1);
    p2.set_requires_grad(true);
    std::unique_ptr<optim::Optimizer> o1, o2;
    if (kind == 0) {
      o1 = std::make_unique<optim::SGD>(std::vector<Tensor>{p1}, optim::SGDOptions{0.1, 0.9});
      o2 = std::make_unique<optim::SGD>(std::vector<Tensor>{p2}, optim::SGDOptions{0.5, 0.1});
    } else {
      o1 = std::make_unique<optim::AdamW>(std::vector<Tensor>{p1}, optim::AdamWOptions{});
      o2 = std::make_unique<optim::AdamW>(std::vector<Tensor>{p2}, optim::AdamWOptions{});
    }
    std::vector<Tensor> grads;
    grads.reserve(4);
    for (int k = 0; k < 4; ++k) grads.push_back(ops::randn({4, 3}, {}, &gen));
    for (int k = 0; k < 2; ++k) {
      p1.set_grad(ops::clone(grads[k]));
      o1->step();
      p2.set_grad(ops::clone(grads[k]));
      o2->step();  // o2's own history is overwritten by the load below
    }
    o1->save(path);
    o2->load(path);
    ops::copy_(p2, p1);
    CHECK(o2->lr() == o1->lr());
    for (int k = 2; k < 4; ++k) {
      p1.set_grad(ops::clone(grads[k]));
      o1->step();
      p2.set_grad(ops::clone(grads[k]));
      o2->step();
    }
    CHECK(ops::allclose(p1, p2, 0, 0));
    CHECK(o2->step_count(0) == 4);
  }
  // A checkpoint of another optimizer type is refused.
  Tensor q = ops::ones({4, 3});
  q.set_requires_grad(true);
  optim::Adam adam(std::vector<Tensor>{q}, optim::AdamOptions{});
  CHECK_THROWS_WITH_AS(adam.load(path), doctest::Contains("AdamW"), Error);
  std::remove(path.c_str());
}

TEST_CASE("clip_grad_norm_: total norm over all gradients, scaled in place") {
  Tensor a = ops::zeros({2}), b = ops::zeros({1});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  a.set_grad(ops::from_vector<float>({3.0f, 0.0f}, {2}));
  b.set_grad(ops::from_vector<float>({4.0f}, {1}));
  double total = optim::clip_grad_norm_({a, b}, 1.0);
  CHECK(total == doctest::Approx(5.0));
  CHECK(a.grad().to_vector<float>()[0] == doctest::Approx(0.6).epsilon(1e-5));
  CHECK(b.grad().to_vector<float>()[0] == doctest::Approx(0.8).epsilon(1e-5));
  // Below the threshold nothing changes; the inf norm is the largest magnitude.
  CHECK(optim::clip_grad_norm_({a, b}, 10.0, optim::kInfNorm) ==
        doctest::Approx(0.8).epsilon(1e-5));
  CHECK(b.grad().to_vector<float>()[0] == doctest::Approx(0.8).epsilon(1e-5));
}

TEST_CASE("LR schedulers: construction applies step 0; initial_lr is kept") {
  Tensor p = ops::zeros({1});
  optim::SGD opt({p}, {0.1});
  optim::LinearLR warm(opt, 0.5, 1.0, 2);
  CHECK(opt.lr() == doctest::Approx(0.05));
  warm.step();
  CHECK(opt.lr() == doctest::Approx(0.075));
  warm.step();
  warm.step();
  CHECK(opt.lr() == doctest::Approx(0.1));
  CHECK(opt.param_groups()[0].get("initial_lr") == doctest::Approx(0.1));
}
