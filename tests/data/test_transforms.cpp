// Transforms: hand-computed crop/flip/normalize, and the fused pipeline against the
// step-by-step tensor functions (bit for bit), under both memory layouts.
#include <cstring>
#include <set>

#include <doctest/doctest.h>

#include "data/sample_rng.h"
#include "data/transforms.h"
#include "tensor/ops.h"

using namespace ddplab;
using namespace ddplab::data;

namespace {

Tensor u8_tensor(const Shape& shape, const std::vector<uint8_t>& values) {
  Tensor t = ops::empty(shape, kUInt8);
  REQUIRE(static_cast<size_t>(t.numel()) == values.size());
  std::memcpy(t.data_ptr<uint8_t>(), values.data(), values.size());
  return t;
}

std::vector<float> values(const Tensor& t) {
  const float* p = t.data_ptr<float>();
  return {p, p + t.numel()};
}

}  // namespace

TEST_CASE("to_tensor maps CHW and HWC bytes to float CHW in [0, 1]") {
  // 2 channels, 1 row, 3 columns. CHW: channel 0 = 0 51 102, channel 1 = 153 204 255.
  Tensor chw = to_tensor(u8_tensor({2, 1, 3}, {0, 51, 102, 153, 204, 255}), Layout::kCHW);
  CHECK(chw.shape() == Shape{2, 1, 3});
  CHECK(values(chw) == std::vector<float>{0.0f, 0.2f, 0.4f, 0.6f, 0.8f, 1.0f});
  // HWC: the same bytes are pixel (r, g) pairs: (0,51) (102,153) (204,255).
  Tensor hwc = to_tensor(u8_tensor({1, 3, 2}, {0, 51, 102, 153, 204, 255}), Layout::kHWC);
  CHECK(hwc.shape() == Shape{2, 1, 3});
  CHECK(values(hwc) == std::vector<float>{0.0f, 0.4f, 0.8f, 0.2f, 0.6f, 1.0f});
}

TEST_CASE("hflip, pad and crop on a hand-computed example") {
  // One channel, 2x3:  1 2 3 / 4 5 6
  Tensor img = ops::empty({1, 2, 3}, kFloat32);
  float* p = img.data_ptr<float>();
  for (int i = 0; i < 6; ++i) p[i] = static_cast<float>(i + 1);
  CHECK(values(hflip(img)) == std::vector<float>{3, 2, 1, 6, 5, 4});
  Tensor padded = pad(img, 1);  // 4x5
  CHECK(padded.shape() == Shape{1, 4, 5});
  CHECK(values(padded) == std::vector<float>{0, 0, 0, 0, 0,  //
                                             0, 1, 2, 3, 0,  //
                                             0, 4, 5, 6, 0,  //
                                             0, 0, 0, 0, 0});
  CHECK(values(crop(padded, 0, 0, 2, 3)) == std::vector<float>{0, 0, 0, 0, 1, 2});
  CHECK(values(crop(padded, 2, 2, 2, 3)) == std::vector<float>{5, 6, 0, 0, 0, 0});
  CHECK_THROWS_AS(crop(padded, 3, 0, 2, 3), Error);
  Tensor n = normalize(img, {0.5f}, {2.0f});
  CHECK(values(n) == std::vector<float>{0.25f, 0.75f, 1.25f, 1.75f, 2.25f, 2.75f});
}

TEST_CASE("the fused Transform on a hand-computed crop and flip") {
  // 1x2x3 bytes 10 20 30 / 40 50 60, crop 2x3 with padding 1, flip forced (p = 1).
  const std::vector<uint8_t> img = {10, 20, 30, 40, 50, 60};
  Transform t;
  t.random_crop(2, 3, 1).random_horizontal_flip(1.0f);
  const ImageShape in{1, 2, 3};
  // Find samples whose draw is (top 0, left 0) and (top 2, left 2), then check by hand.
  bool seen_a = false, seen_b = false;
  for (uint64_t i = 0; i < 500 && !(seen_a && seen_b); ++i) {
    SampleRng rng(7, 0, i);
    TransformDraw d = t.draw(in, rng);
    CHECK(d.flip);
    std::vector<float> out(6);
    t.apply(img.data(), in, Layout::kCHW, out.data(), rng);
    if (d.top == 0 && d.left == 0) {
      // window rows: [0 0 0] [0 10 20] -> flipped [0 0 0] [20 10 0]
      CHECK(out == std::vector<float>{0, 0, 0, 20 / 255.0f, 10 / 255.0f, 0});
      seen_a = true;
    }
    if (d.top == 2 && d.left == 2) {
      // window rows: [50 60 0] [0 0 0] -> flipped [0 60 50] [0 0 0]
      CHECK(out == std::vector<float>{0, 60 / 255.0f, 50 / 255.0f, 0, 0, 0});
      seen_b = true;
    }
  }
  CHECK(seen_a);
  CHECK(seen_b);
}

TEST_CASE("the fused Transform equals to_tensor -> pad -> crop -> hflip -> normalize") {
  const ImageShape in{3, 7, 9};
  std::vector<uint8_t> bytes(static_cast<size_t>(in.numel()));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  const NormStats s = cifar10_stats();
  Transform t;
  t.random_crop(6, 8, 2).random_horizontal_flip(0.5f).normalize(s);
  CHECK(t.output_shape(in) == ImageShape{3, 6, 8});
  for (Layout layout : {Layout::kCHW, Layout::kHWC}) {
    Tensor raw = layout == Layout::kCHW ? u8_tensor({3, 7, 9}, bytes) : u8_tensor({7, 9, 3}, bytes);
    int flips = 0;
    for (uint64_t i = 0; i < 64; ++i) {
      SampleRng rng(123, 4, i);
      TransformDraw d = t.draw(in, rng);
      Tensor expect = crop(pad(to_tensor(raw, layout), 2), d.top, d.left, 6, 8);
      if (d.flip) expect = hflip(expect);
      expect = normalize(expect, s.mean, s.std);
      std::vector<float> got(3 * 6 * 8);
      t.apply(bytes.data(), in, layout, got.data(), rng);
      CHECK(got == values(expect));  // bit-identical, including the padded pixels
      flips += d.flip;
    }
    CHECK(flips > 10);
    CHECK(flips < 54);
  }
}

TEST_CASE("normalization values of the standard datasets") {
  Transform t = Transform::eval(cifar10_stats());
  const std::vector<uint8_t> px = {0, 255, 128};  // one pixel, CHW with H = W = 1
  std::vector<float> out(3);
  t.apply(px.data(), {3, 1, 1}, Layout::kCHW, out.data(), SampleRng());
  CHECK(out[0] == (0.0f - 0.4914f) / 0.2470f);
  CHECK(out[1] == (1.0f - 0.4822f) / 0.2435f);
  CHECK(out[2] == (128 / 255.0f - 0.4465f) / 0.2616f);
  CHECK(fashion_mnist_stats().mean == std::vector<float>{0.2860f});
  CHECK(fashion_mnist_stats().std == std::vector<float>{0.3530f});
  CHECK(mnist_stats().mean == std::vector<float>{0.1307f});
  CHECK(cifar100_stats().std == std::vector<float>{0.2673f, 0.2564f, 0.2762f});
  CHECK_THROWS_AS(Transform().normalize({0.5f, 0.5f}, {0.5f}), Error);
}

TEST_CASE("crop positions cover the whole range; randomness is a function of (seed, epoch, i)") {
  Transform t = Transform::cifar_train(cifar10_stats());
  const ImageShape in{3, 32, 32};
  std::set<int64_t> tops, lefts;
  int flips = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    TransformDraw d = t.draw(in, SampleRng(1, 0, i));
    tops.insert(d.top);
    lefts.insert(d.left);
    flips += d.flip;
  }
  CHECK(tops.size() == 9);  // 0..8 with padding 4
  CHECK(*tops.rbegin() == 8);
  CHECK(lefts.size() == 9);
  CHECK(flips > 850);
  CHECK(flips < 1150);
  // Pure function: the same triple gives the same words; any change gives others.
  CHECK(SampleRng(5, 2, 9).word(0) == SampleRng(5, 2, 9).word(0));
  CHECK(SampleRng(5, 2, 9).word(7) == SampleRng(5, 2, 9).word(7));
  CHECK(SampleRng(5, 2, 9).word(0) != SampleRng(5, 3, 9).word(0));
  CHECK(SampleRng(5, 2, 9).word(0) != SampleRng(6, 2, 9).word(0));
  CHECK(SampleRng(5, 2, 9).word(0) != SampleRng(5, 2, 10).word(0));
}
