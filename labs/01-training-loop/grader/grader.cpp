// Lab 1's grader. Each TEST_CASE is one point of the part its name starts with; scripts/lab runs
// them one by one and prints the score per part. The oracles: the library's own F::linear and
// F::cross_entropy, finite differences (gradcheck), and numbers PyTorch printed (reference.h).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "nn/functional.h"
#include "reference.h"
#include "tensor/ops.h"
#include "training_loop.h"

using namespace ddplab;

namespace {

Tensor randn64(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return ops::randn(shape, kFloat64, &gen);
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol, const char* what) {
  INFO(what);
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  std::vector<double> g = got.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) CHECK(g[i] == doctest::Approx(want[i]).epsilon(tol));
}

// The reference problem of make_reference.py, rebuilt from the same formula.
Tensor formula(int64_t rows, int64_t cols, int k) {
  std::vector<double> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(0.1 * ((k + 3 * i + 2 * j) % 7) - 0.3);
  return ops::from_vector<double>(v, {rows, cols}, kFloat64);
}
std::vector<Tensor> reference_params() {
  std::vector<Tensor> p = {formula(4, 3, 1), ops::reshape(formula(1, 4, 2), {4}), formula(2, 4, 3),
                           ops::reshape(formula(1, 2, 4), {2})};
  for (Tensor& t : p) t = ops::clone(t).set_requires_grad(true);
  return p;
}
Tensor reference_x() {
  return ops::from_vector<double>({0.5, -1.0, 2.0, 1.5, 0.3, -0.7, -0.2, 0.8, 0.1, 1.0, 1.0, -1.0},
                                  {4, 3}, kFloat64);
}
Tensor reference_y() {
  return ops::from_vector<int64_t>({0, 1, 1, 0}, {4}, kInt64);
}

}  // namespace

TEST_CASE("part 1 (linear): the values equal x W^T + b") {
  Tensor x = randn64({5, 3}, 1), w = randn64({4, 3}, 2), b = randn64({4}, 3);
  Tensor y = lab1::linear(x, w, b);
  REQUIRE(y.shape() == Shape{5, 4});
  CHECK(ops::allclose(y, F::linear(x, w, b), 1e-12, 1e-12));
}

TEST_CASE("part 1 (linear): backward reaches x and W and b (finite differences)") {
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return lab1::linear(in[0], in[1], in[2]); },
      {randn64({3, 2}, 4).set_requires_grad(true), randn64({2, 2}, 5).set_requires_grad(true),
       randn64({2}, 6).set_requires_grad(true)});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("part 2 (cross_entropy): the value and the gradient equal F::cross_entropy") {
  Tensor logits = randn64({6, 5}, 7).set_requires_grad(true);
  Tensor target = ops::from_vector<int64_t>({0, 4, 2, 2, 1, 3}, {6}, kInt64);
  Tensor mine = lab1::cross_entropy(logits, target);
  REQUIRE(mine.numel() == 1);
  CHECK(mine.item<double>() == doctest::Approx(F::cross_entropy(logits, target).item<double>()));
  auto r = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return lab1::cross_entropy(in[0], target); }, {logits});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("part 2 (cross_entropy): stable for large logits") {
  // exp(1000) overflows a double: only the max-shifted form gives a finite answer.
  Tensor logits = ops::from_vector<double>({1000, 0, -1000, 999}, {2, 2}, kFloat64);
  Tensor target = ops::from_vector<int64_t>({1, 0}, {2}, kInt64);
  const double loss = lab1::cross_entropy(logits, target).item<double>();
  CHECK(std::isfinite(loss));
  CHECK(loss == doctest::Approx(F::cross_entropy(logits, target).item<double>()));
}

TEST_CASE("part 3 (sgd_step): two steps equal PyTorch's SGD with momentum") {
  std::vector<Tensor> p = reference_params();
  std::vector<Tensor> buffers(p.size());
  for (int step = 0; step < 2; ++step) {
    for (Tensor& t : p) t.set_grad(Tensor());
    Tensor h = F::relu(F::linear(reference_x(), p[0], p[1]));
    F::cross_entropy(F::linear(h, p[2], p[3]), reference_y()).backward();
    lab1::sgd_step(p, buffers, 0.1, 0.9);
  }
  check_close(p[0], lab1::reference::kW1, 1e-10, "W1");
  check_close(p[1], lab1::reference::kB1, 1e-10, "b1");
  check_close(p[2], lab1::reference::kW2, 1e-10, "W2");
  check_close(p[3], lab1::reference::kB2, 1e-10, "b2");
}

TEST_CASE("part 3 (sgd_step): no graph and no update without a gradient") {
  Tensor a = randn64({3}, 8).set_requires_grad(true), b = randn64({3}, 9).set_requires_grad(true);
  const std::vector<double> b_before = b.to_vector<double>();
  a.set_grad(ops::ones({3}, kFloat64));
  std::vector<Tensor> buffers(2);
  const std::vector<double> a_before = a.to_vector<double>();
  lab1::sgd_step({a, b}, buffers, 0.5, 0.0);  // plain SGD: a -= 0.5
  CHECK(b.to_vector<double>() == b_before);
  for (int i = 0; i < 3; ++i) CHECK(a.to_vector<double>()[i] == doctest::Approx(a_before[i] - 0.5));
  CHECK(a.is_leaf());  // updated in place, outside the graph
}

TEST_CASE("part 4 (train): reproduces PyTorch's first two steps") {
  std::vector<Tensor> p = reference_params();
  std::vector<double> losses = lab1::train(p, reference_x(), reference_y(), 2, 0.1, 0.9);
  REQUIRE(losses.size() == 2);
  CHECK(losses[0] == doctest::Approx(lab1::reference::kLosses[0]).epsilon(1e-10));
  CHECK(losses[1] == doctest::Approx(lab1::reference::kLosses[1]).epsilon(1e-10));
  check_close(p[0], lab1::reference::kW1, 1e-10, "W1");
  check_close(p[3], lab1::reference::kB2, 1e-10, "b2");
}

TEST_CASE("part 4 (train): learns a separable problem") {
  // Two classes on either side of a plane through the origin; 8 hidden units suffice.
  Tensor x = randn64({64, 4}, 10);
  Tensor y = ops::to(ops::gt(ops::sum(x, {1}), 0.0), kInt64);
  std::vector<Tensor> p = {ops::mul(randn64({8, 4}, 11), 0.5), ops::zeros({8}, kFloat64),
                           ops::mul(randn64({2, 8}, 12), 0.5), ops::zeros({2}, kFloat64)};
  for (Tensor& t : p) t.set_requires_grad(true);
  std::vector<double> losses = lab1::train(p, x, y, 200, 0.1, 0.9);
  REQUIRE(losses.size() == 200);
  INFO("first loss " << losses.front() << ", last " << losses.back());
  CHECK(losses.back() < 0.1);
  CHECK(losses.back() < losses.front() / 5);
}
