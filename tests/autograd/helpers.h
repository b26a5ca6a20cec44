// Small helpers shared by the autograd tests.
#pragma once

#include <vector>

#include "autograd/engine.h"
#include "autograd/function_node.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "tensor/backend.h"
#include "tensor/ops.h"
#include "tests/test_util.h"

namespace ddplab::test {

// The devices op tests run on: the CPU, plus the first GPU when one is present.
using testing::test_devices;

// A float64 CPU leaf that requires grad, filled with N(0, 1) from its own seed.
inline Tensor leaf(const Shape& shape, uint64_t seed, TensorOptions opts = kFloat64) {
  Generator gen(seed);
  Tensor t = ops::randn(shape, opts, &gen);
  t.set_requires_grad(true);
  return t;
}

// A leaf with values in [lo, hi): for ops defined only on part of the real line.
inline Tensor leaf_in(const Shape& shape, uint64_t seed, double lo, double hi) {
  Generator gen(seed);
  Tensor t = ops::rand(shape, kFloat64, &gen);
  t = ops::add(ops::mul(t, hi - lo), lo);
  t.set_requires_grad(true);
  return t;
}

}  // namespace ddplab::test
