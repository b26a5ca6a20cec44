// Views share storage and follow PyTorch's shape rules; bad arguments name the shapes.
#include <doctest/doctest.h>

#include "tensor/ops.h"
#include "tests/test_util.h"

using namespace ddplab;
using ddplab::testing::check_error_mentions;
using ddplab::testing::test_devices;

static std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

TEST_CASE("views share storage and index like PyTorch") {
  for (Device dev : test_devices()) {
    CAPTURE(dev.str());
    Tensor t = ops::arange(0, 24, 1, {kFloat32, dev});
    Tensor v = ops::view(t, {2, 3, 4});
    CHECK(v.shape() == Shape{2, 3, 4});
    CHECK(v.strides() == Shape{12, 4, 1});
    CHECK(ops::view(t, {4, -1}).shape() == Shape{4, 6});

    Tensor p = ops::permute(v, {2, 0, 1});  // [4, 2, 3]
    CHECK(p.shape() == Shape{4, 2, 3});
    CHECK_FALSE(p.is_contiguous());
    // p[i][j][k] = v[j][k][i] = 12 j + 4 k + i
    auto pv = values(ops::contiguous(p));
    CHECK(pv[0 * 6 + 1 * 3 + 2] == 12 + 8 + 0);
    CHECK(pv[3 * 6 + 0 * 3 + 1] == 4 + 3);

    Tensor tr = ops::transpose(v, 0, 2);
    CHECK(tr.shape() == Shape{4, 3, 2});
    CHECK(values(ops::select(ops::select(ops::select(tr, 0, 3), 0, 2), 0, 1)) ==
          std::vector<double>{12 + 8 + 3});

    Tensor n = ops::narrow(v, 2, 1, 2);  // [2, 3, 2]
    CHECK(values(n) == std::vector<double>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
    Tensor s = ops::slice(t, 0, 1, 10, 3);
    CHECK(values(s) == std::vector<double>{1, 4, 7});
    CHECK(values(ops::slice(t, 0, -3, 24)) == std::vector<double>{21, 22, 23});

    // Writing through a view writes the base tensor.
    ops::fill_(ops::select(v, 1, 2), -1);
    auto tv = values(t);
    for (int i = 8; i < 12; ++i) CHECK(tv[i] == -1);
    CHECK(tv[7] == 7);

    Tensor e = ops::expand(ops::arange(0, 3, 1, {kFloat32, dev}), {2, 3});
    CHECK(e.strides() == Shape{0, 1});
    CHECK(values(e) == std::vector<double>{0, 1, 2, 0, 1, 2});
    Tensor col = ops::view(ops::arange(0, 2, 1, {kFloat32, dev}), {2, 1});
    CHECK(values(ops::expand(col, {2, 3})) == std::vector<double>{0, 0, 0, 1, 1, 1});

    Tensor u = ops::unsqueeze(t, 0);
    CHECK(u.shape() == Shape{1, 24});
    CHECK(ops::squeeze(u).shape() == Shape{24});
    CHECK(ops::squeeze(ops::zeros({1, 3, 1}, dev), 2).shape() == Shape{1, 3});
    CHECK(ops::unsqueeze(t, -1).shape() == Shape{24, 1});
    CHECK(ops::flatten(v, 1).shape() == Shape{2, 12});
  }
}

TEST_CASE("reshape views when strides allow, copies otherwise") {
  Tensor t = ops::arange(0, 12, 1);
  Tensor tr = ops::transpose(ops::view(t, {3, 4}), 0, 1);  // [4, 3], not contiguous
  CHECK_THROWS_AS(ops::view(tr, {12}), Error);
  Tensor r = ops::reshape(tr, {12});
  CHECK(r.to_vector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  // A view of a non-contiguous tensor that keeps the chunks whole needs no copy.
  Tensor v = ops::view(ops::narrow(ops::view(t, {3, 4}), 1, 0, 2), {3, 2, 1});
  CHECK(v.storage().data() == t.storage().data());
  CHECK(v.strides() == Shape{4, 1, 1});
  Tensor merged = ops::reshape(ops::view(t, {2, 2, 3}), {4, 3});
  CHECK(merged.storage().data() == t.storage().data());
}

TEST_CASE("view and shape errors name the shapes") {
  Tensor t = ops::zeros({2, 3});
  check_error_mentions([&] { ops::view(t, {4, 2}); }, {"[4, 2]", "[2, 3]"});
  check_error_mentions([&] { ops::expand(t, {4, 3}); }, {"[2, 3]", "[4, 3]"});
  check_error_mentions([&] { ops::narrow(t, 1, 2, 2); }, {"[2, 3]"});
  check_error_mentions([&] { ops::select(t, 0, 5); }, {"index 5", "[2, 3]"});
  check_error_mentions([&] { ops::permute(t, {0}); }, {"[2, 3]"});
  check_error_mentions([&] { t.size(3); }, {"dim 3"});
  check_error_mentions([&] { ops::cat({t, ops::zeros({2, 4})}, 0); }, {"[2, 3]", "[2, 4]"});
}
