// Forward behaviour of the differentiable ops that gradcheck cannot see: values match ops::,
// identity cases return the input itself, and outputs join the graph only when they should.
#include <doctest/doctest.h>

#include "helpers.h"

using namespace ddplab;
using test::test_devices;

TEST_CASE("differentiable ops compute what the raw ops compute") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Generator gen(3);
    Tensor a = ops::randn({3, 4}, TensorOptions(kFloat32, dev), &gen);
    Tensor b = ops::randn({4}, TensorOptions(kFloat32, dev), &gen);
    a.set_requires_grad(true);
    CHECK(ops::allclose(ops::to(a + b, kCPU), ops::to(ops::add(a, b), kCPU)));
    CHECK(ops::allclose(ops::to(matmul(a, b), kCPU), ops::to(ops::matmul(a, b), kCPU)));
    CHECK(ops::allclose(ops::to(var(a, {1}), kCPU), ops::to(ops::var(a, {1}), kCPU)));
    auto mx = max(a, 1);
    CHECK(mx.values.requires_grad());
    CHECK_FALSE(mx.indices.requires_grad());
    CHECK(mx.values.grad_fn()->name() == "MaxBackward");
  }
}

TEST_CASE("identity cases return the input and keep its history") {
  Tensor x = ops::randn({2, 3}, kFloat64);
  x.set_requires_grad(true);
  CHECK(contiguous(x).is_same(x));
  CHECK(to(x, kFloat64).is_same(x));
  CHECK(x.is_leaf());
  Tensor t = transpose(x, 0, 1);
  Tensor c = contiguous(t);
  CHECK(c.is_contiguous());
  CHECK(c.grad_fn()->name() == "ContiguousBackward");
  CHECK(t.grad_fn()->name() == "TransposeBackward");  // t's own history is untouched
}

TEST_CASE("outputs require grad only when an input does") {
  Tensor x = ops::randn({3});
  Tensor y = exp(x) * 2.0;
  CHECK_FALSE(y.requires_grad());
  CHECK(y.grad_fn() == nullptr);
  Tensor w = ops::randn({3});
  w.set_requires_grad(true);
  Tensor z = x * w;
  CHECK(z.requires_grad());
  CHECK(z.grad_fn()->name() == "MulBackward");
  CHECK(z.grad_fn()->next_edges.size() == 2);
  CHECK_FALSE(z.grad_fn()->next_edges[0].valid());  // x: no gradient wanted
  CHECK(z.grad_fn()->next_edges[1].valid());
}

TEST_CASE("sum_to reduces broadcast dims") {
  Tensor g = ops::ones({2, 3, 4});
  CHECK(autograd::sum_to(g, {3, 4}).shape() == Shape{3, 4});
  CHECK(autograd::sum_to(g, {3, 4}).to_vector<float>()[0] == 2.0f);
  CHECK(autograd::sum_to(g, {3, 1}).to_vector<float>()[0] == 8.0f);
  CHECK(autograd::sum_to(g, {1, 1, 1}).to_vector<float>()[0] == 24.0f);
  CHECK(autograd::sum_to(g, {}).item<float>() == 24.0f);
  CHECK(autograd::sum_to(g, {2, 3, 4}).is_same(g));
  CHECK_THROWS_AS(autograd::sum_to(g, {5, 4}), Error);
}

TEST_CASE("Tensor::clone copies the storage and passes the gradient back") {
  Tensor x = ops::from_vector<double>({1, 2, 3}, {3}, kFloat64);
  x.set_requires_grad(true);
  Tensor y = x.clone();
  CHECK_FALSE(y.storage().data() == x.storage().data());
  CHECK(y.to_vector<double>() == std::vector<double>{1, 2, 3});
  ops::mul_(x.detach(), 10.0);  // writing to x afterwards leaves the copy as it was
  CHECK(y.to_vector<double>() == std::vector<double>{1, 2, 3});
  sum(y * y).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 4, 6});  // d/dy y^2 at 1, 2, 3
}
