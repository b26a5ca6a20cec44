// Copies and conversions, assembling ops, printing, errors for devices, and the caching
// allocator's reuse.
#include <doctest/doctest.h>

#include "tensor/backend.h"
#include "tensor/ops.h"
#include "tests/test_util.h"

using namespace ddplab;
using ddplab::testing::check_error_mentions;
using ddplab::testing::test_devices;

TEST_CASE("dtype conversions round trip and truncate like C casts") {
  for (Device dev : test_devices()) {
    Tensor f = ops::from_vector<float>({-2.7f, -0.5f, 0.f, 1.5f, 3.9f, 255.f}, {6}, dev);
    CHECK(ops::to(f, kInt64).to_vector<int64_t>() == std::vector<int64_t>{-2, 0, 0, 1, 3, 255});
    CHECK(ops::to(f, kBool).to_vector<bool>() ==
          std::vector<bool>{true, true, false, true, true, true});
    CHECK(ops::to(ops::to(f, kFloat64), kFloat32).to_vector<float>() == f.to_vector<float>());
    CHECK(ops::to(ops::to(f, kBFloat16), kFloat32).to_vector<float>()[3] == 1.5f);
    Tensor big = ops::from_vector<int64_t>({(int64_t{1} << 53) + 1}, {1}, {kInt64, dev});
    CHECK(ops::to(big, kInt64).item<int64_t>() ==
          (int64_t{1} << 53) + 1);  // no trip through double
    Tensor i32 = ops::to(big, kInt32);
    CHECK(i32.dtype() == kInt32);
  }
}

TEST_CASE("clone, copy_ with broadcast, cat, stack, index_select, gather, scatter_add") {
  for (Device dev : test_devices()) {
    Tensor a = ops::view(ops::arange(0, 6, 1, dev), {2, 3});
    Tensor c = ops::clone(ops::transpose(a, 0, 1));
    CHECK(c.is_contiguous());
    CHECK(c.to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
    Tensor dst = ops::zeros({2, 3}, dev);
    ops::copy_(dst, ops::arange(0, 3, 1, dev));
    CHECK(dst.to_vector<float>() == std::vector<float>{0, 1, 2, 0, 1, 2});

    Tensor cat0 = ops::cat({a, ops::full({1, 3}, 9, dev)}, 0);
    CHECK(cat0.shape() == Shape{3, 3});
    CHECK(cat0.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, 9, 9, 9});
    Tensor cat1 = ops::cat({a, a}, 1);
    CHECK(cat1.to_vector<float>() == std::vector<float>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
    CHECK(ops::stack({a, a}, 1).shape() == Shape{2, 2, 3});

    Tensor idx = ops::from_vector<int64_t>({2, 0, 2}, {3}, {kInt64, dev});
    CHECK(ops::index_select(a, 1, idx).to_vector<float>() == std::vector<float>{2, 0, 2, 5, 3, 5});
    CHECK(ops::index_select(a, 0, ops::from_vector<int64_t>({1}, {1}, {kInt64, dev}))
              .to_vector<float>() == std::vector<float>{3, 4, 5});
    Tensor gi = ops::from_vector<int64_t>({1, 0, 2, 2}, {2, 2}, {kInt64, dev});
    CHECK(ops::gather(a, 1, gi).to_vector<float>() == std::vector<float>{1, 0, 5, 5});
    Tensor acc = ops::zeros({2, 3}, dev);
    ops::scatter_add_(acc, 1, gi, ops::ones({2, 2}, dev));
    CHECK(acc.to_vector<float>() == std::vector<float>{1, 1, 0, 0, 0, 2});
    check_error_mentions(
        [&] {
          ops::index_select(a, 1, ops::from_vector<int64_t>({3}, {1}, {kInt64, dev}));
        },
        {"index 3", "size 3"});
  }
}

TEST_CASE("printing shows values, shape, dtype and device, and elides large tensors") {
  Tensor t = ops::from_vector<float>({1, 2.5, -3, 4}, {2, 2});
  std::string s = t.str();
  CHECK(s.find("tensor([[") == 0);
  CHECK(s.find("2.5000") != std::string::npos);
  CHECK(s.find("-3.0000") != std::string::npos);
  CHECK(s.find("shape=[2, 2]") != std::string::npos);
  CHECK(s.find("dtype=float32") != std::string::npos);
  CHECK(s.find("device=cpu") != std::string::npos);
  std::string big = ops::arange(0, 5000).str();
  CHECK(big.find("...") != std::string::npos);
  CHECK(big.find("4.9990e+03") != std::string::npos);
  CHECK(big.size() < 300);
  CHECK(ops::from_vector<int64_t>({7, -1}, {2}, kInt64).str().find("[ 7, -1]") !=
        std::string::npos);
  CHECK(ops::gt(ops::arange(0, 2), 0.5).str().find("False") != std::string::npos);
  CHECK(Tensor().str() == "tensor(undefined)");
}

TEST_CASE("CUDA requests without a GPU are clear errors, never crashes") {
  DDP_SKIP_IF(cuda_is_available(),
              "a GPU is present: covered by the device loops of the other tests");
  check_error_mentions([] { ops::zeros({2}, cuda(0)); }, {"cuda:0"});
  check_error_mentions([] { ops::to(ops::zeros({2}), cuda(1)); }, {"cuda:1"});
  CHECK(Device("cuda:3").index == 3);
  check_error_mentions([] { Device("gpu"); }, {"gpu"});
}

TEST_CASE("the caching host allocator reuses freed blocks") {
  Allocator& a = cpu_allocator();
  { Tensor warm = ops::empty({1 << 20}); }
  AllocatorStats before = a.stats();
  for (int i = 0; i < 10; ++i) {
    Tensor t = ops::empty({1 << 20});  // 4 MiB
    ops::fill_(t, 1);
  }
  AllocatorStats after = a.stats();
  CHECK(after.num_allocs - before.num_allocs == 10);
  CHECK(after.cache_hits - before.cache_hits == 10);
  CHECK(after.reserved == before.reserved);  // no new memory from the system
  CHECK(after.peak_allocated >= (int64_t{4} << 20));
  a.empty_cache();
  CHECK(a.stats().reserved <= after.reserved - (int64_t{4} << 20));
}

TEST_CASE("channels-last: the format test, empty, contiguous both ways, and elementwise results") {
  for (Device dev : test_devices()) {
    const Shape shape{2, 3, 4, 5};
    Tensor x = ops::reshape(ops::arange(0, 120, 1, dev), shape);
    CHECK(ops::suggest_memory_format(x) == ops::MemoryFormat::Contiguous);
    CHECK_FALSE(ops::is_contiguous(x, ops::MemoryFormat::ChannelsLast));

    Tensor e = ops::empty(shape, {kFloat32, dev}, ops::MemoryFormat::ChannelsLast);
    CHECK(e.shape() == shape);
    CHECK(e.strides() == Shape{60, 1, 15, 3});  // pixel-major: the 3 channels side by side
    CHECK(ops::suggest_memory_format(e) == ops::MemoryFormat::ChannelsLast);

    // Same values at every index, other bytes in memory: NHWC lists channel 0, 1, 2 of pixel 0.
    Tensor xl = ops::contiguous(x, ops::MemoryFormat::ChannelsLast);
    CHECK(xl.to_vector<float>() == x.to_vector<float>());
    const float* raw = static_cast<const float*>(ops::to(xl, kCPU).raw_data());
    CHECK(std::vector<float>(raw, raw + 4) == std::vector<float>{0, 20, 40, 1});
    CHECK(ops::contiguous(xl).is_contiguous());
    CHECK(ops::contiguous(xl).to_vector<float>() == x.to_vector<float>());
    // One channel or one pixel: both formats at once, and row-major wins.
    CHECK(ops::suggest_memory_format(
              ops::empty({2, 1, 4, 5}, {kFloat32, dev}, ops::MemoryFormat::ChannelsLast)) ==
          ops::MemoryFormat::Contiguous);

    // Elementwise results keep channels-last when their inputs have it (also against a
    // per-channel [1, C, 1, 1] operand), and equal the row-major results.
    Tensor scale = ops::reshape(ops::from_vector<float>({1, -2, 3}, {3}, dev), {1, 3, 1, 1});
    Tensor sum = ops::add(xl, xl), prod = ops::mul(xl, scale), r = ops::relu(ops::neg(xl));
    for (const Tensor* t : {&sum, &prod, &r})
      CHECK(ops::suggest_memory_format(*t) == ops::MemoryFormat::ChannelsLast);
    CHECK(sum.to_vector<float>() == ops::add(x, x).to_vector<float>());
    CHECK(prod.to_vector<float>() == ops::mul(x, scale).to_vector<float>());
    CHECK(r.to_vector<float>() == ops::relu(ops::neg(x)).to_vector<float>());
    // Mixed formats give a row-major result, with the same values.
    Tensor mixed = ops::sub(xl, x);
    CHECK(mixed.is_contiguous());
    CHECK(mixed.to_vector<float>() == std::vector<float>(120, 0.f));
    // In place into a channels-last tensor from a row-major one.
    ops::copy_(e, x);
    CHECK(e.to_vector<float>() == x.to_vector<float>());
  }
}

TEST_CASE(
    "channels-last: conversions both ways across several tiles, for 2-, 4- and 8-byte types") {
  // 40 channels by 63 pixels: the CPU's tiled transpose has full and partial tiles both ways.
  const Shape shape{2, 40, 7, 9};
  for (DType dt : {kBFloat16, kFloat32, kInt64}) {
    CAPTURE(dtype_name(dt));
    Tensor x = ops::to(ops::reshape(ops::arange(0, 2 * 40 * 63, 1), shape), dt);
    Tensor xl = ops::contiguous(x, ops::MemoryFormat::ChannelsLast);
    CHECK(ops::is_contiguous(xl, ops::MemoryFormat::ChannelsLast));
    CHECK(ops::to(xl, kFloat64).to_vector<double>() == ops::to(x, kFloat64).to_vector<double>());
    Tensor back = ops::contiguous(xl);
    CHECK(back.is_contiguous());
    CHECK(ops::max_abs_diff(ops::to(back, kFloat64), ops::to(x, kFloat64)) == 0);
    // Element (n, c, h, w) of the NHWC bytes sits at ((n * 7 + h) * 9 + w) * 40 + c.
    const std::vector<double> raw =
        ops::to(ops::from_blob(xl.raw_data(), {2 * 40 * 63}, dt), kFloat64).to_vector<double>();
    const std::vector<double> values = ops::to(x, kFloat64).to_vector<double>();
    CHECK(raw[static_cast<size_t>(((1 * 7 + 3) * 9 + 4) * 40 + 17)] ==
          values[static_cast<size_t>(((1 * 40 + 17) * 7 + 3) * 9 + 4)]);
  }
}
