// Philox against the published known-answer vectors; the random ops' determinism and moments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "tensor/ops.h"
#include "tests/test_util.h"

using namespace ddplab;
using ddplab::testing::test_devices;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  // From Random123's kat_vectors (Salmon et al.): counter, key -> output.
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) {
    Philox4x32 r = philox4x32_10({{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) CHECK(r.c[i] == k.out[i]);
  }
}

TEST_CASE("random ops: same seed same numbers, generator advances, moments") {
  for (Device dev : test_devices()) {
    CAPTURE(dev.str());
    Generator g1(42), g2(42);
    Tensor a = ops::rand({1000}, dev, &g1), b = ops::rand({1000}, dev, &g2);
    CHECK(ops::max_abs_diff(a, b) == 0);
    Tensor c = ops::rand({1000}, dev, &g1);  // the generator moved on
    CHECK(ops::max_abs_diff(a, c) > 0);
    // The numbers do not depend on the device or the threads: element i is f(seed, offset, i).
    Generator g3(42);
    Tensor cpu = ops::rand({1000}, kCPU, &g3);
    CHECK(ops::max_abs_diff(ops::to(a, kCPU), cpu) == 0);

    Generator g(1);
    Tensor u = ops::rand({200000}, {kFloat64, dev}, &g);
    CHECK(ops::amin(u).item<double>() >= 0);
    CHECK(ops::amax(u).item<double>() < 1);
    CHECK(ops::mean(u).item<double>() == doctest::Approx(0.5).epsilon(0.01));
    CHECK(ops::var(u).item<double>() == doctest::Approx(1.0 / 12).epsilon(0.02));
    Tensor n = ops::randn({200000}, {kFloat64, dev}, &g);
    CHECK(std::fabs(ops::mean(n).item<double>()) < 0.01);
    CHECK(ops::var(n).item<double>() == doctest::Approx(1.0).epsilon(0.02));
    Tensor nn = ops::empty({100000}, {kFloat32, dev});
    ops::normal_(nn, 3, 2, &g);
    CHECK(ops::mean(nn).item<double>() == doctest::Approx(3).epsilon(0.01));
    Tensor bern = ops::empty({100000}, {kFloat32, dev});
    ops::bernoulli_(bern, 0.3, &g);
    CHECK(ops::mean(bern).item<double>() == doctest::Approx(0.3).epsilon(0.03));
    Tensor ri = ops::randint(-2, 5, {10000}, &g, {kInt64, dev});
    CHECK(ops::amin(ri).item<int64_t>() == -2);
    CHECK(ops::amax(ri).item<int64_t>() == 4);
    // A strided target gets the same numbers as a contiguous one, laid out through the view.
    Generator g4(9), g5(9);
    Tensor base = ops::zeros({4, 6}, dev);
    ops::uniform_(ops::narrow(base, 1, 1, 3), 0, 1, &g4);
    Tensor flat = ops::rand({4, 3}, dev, &g5);
    CHECK(ops::max_abs_diff(ops::narrow(base, 1, 1, 3), flat) == 0);
  }
}

TEST_CASE("randperm is a permutation, seeded") {
  Generator g(3), h(3);
  Tensor p = ops::randperm(1000, &g);
  auto v = p.to_vector<int64_t>();
  auto sorted = v;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) CHECK(sorted[i] == i);
  CHECK(ops::randperm(1000, &h).to_vector<int64_t>() == v);
  CHECK(ops::randperm(1000, &g).to_vector<int64_t>() != v);
  CHECK(ops::randperm(0, &g).numel() == 0);
}
