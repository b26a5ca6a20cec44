// CIFAR-10/100 binary files: pixel -> tensor mapping, label bytes, and the errors.
#include <doctest/doctest.h>

#include "data/cifar.h"
#include "test_util.h"

using namespace ddplab;
using namespace ddplab::data;
using namespace ddplab::data::testing;

namespace {

constexpr size_t kPixels = 3072;

// The pixel byte at position q of record r: distinct across channels, rows and records.
uint8_t pixel(size_t r, size_t q) {
  return static_cast<uint8_t>((r * 31 + q * 7 + q / 1024) % 251);
}

// A CIFAR file of `labels.size()` records; each label is `label_bytes` bytes.
std::vector<uint8_t> cifar_file(const std::vector<std::vector<uint8_t>>& labels, size_t first = 0) {
  std::vector<uint8_t> out;
  for (size_t r = 0; r < labels.size(); ++r) {
    out.insert(out.end(), labels[r].begin(), labels[r].end());
    for (size_t q = 0; q < kPixels; ++q) out.push_back(pixel(first + r, q));
  }
  return out;
}

}  // namespace

TEST_CASE("CIFAR-10: channel order, pixel values and normalization, exactly") {
  TempDir dir;
  write_bytes(dir / "test_batch.bin", cifar_file({{3}, {0}, {9}}));
  CIFAR10 plain(dir.path(), /*train=*/false, Transform(), /*check_counts=*/false);
  REQUIRE(plain.size() == 3);
  CHECK(plain.labels() == std::vector<int64_t>{3, 0, 9});
  CHECK(plain.classes()[3] == "cat");
  CHECK(plain.sample_shape() == Shape{3, 32, 32});
  for (int64_t r = 0; r < 3; ++r) {
    Example ex = plain.get(r);
    CHECK(ex.label == plain.labels()[static_cast<size_t>(r)]);
    const float* p = ex.image.data_ptr<float>();
    // Element (c, y, x) is byte c*1024 + y*32 + x of the record: red plane, then green, blue.
    for (size_t q = 0; q < kPixels; ++q)
      REQUIRE(p[q] == static_cast<float>(pixel(static_cast<size_t>(r), q)) / 255.0f);
  }
  const NormStats s = cifar10_stats();
  CIFAR10 norm(dir.path(), false, Transform::eval(s), false);
  Example ex = norm.get(1);
  const float* p = ex.image.data_ptr<float>();
  for (size_t c = 0; c < 3; ++c)
    for (size_t i : {size_t{0}, size_t{33}, size_t{1023}}) {
      size_t q = c * 1024 + i;
      CHECK(p[q] == (static_cast<float>(pixel(1, q)) / 255.0f - s.mean[c]) / s.std[c]);
    }
}

TEST_CASE("CIFAR-10 train reads data_batch_1..5 in order, also from cifar-10-batches-bin/") {
  TempDir dir;
  for (int k = 1; k <= 5; ++k)
    write_bytes(dir / ("cifar-10-batches-bin/data_batch_" + std::to_string(k) + ".bin"),
                cifar_file({{static_cast<uint8_t>(k)}, {static_cast<uint8_t>(k + 4)}},
                           2 * static_cast<size_t>(k - 1)));
  CIFAR10 train(dir.path(), true, Transform(), false);
  REQUIRE(train.size() == 10);
  CHECK(train.labels() == std::vector<int64_t>{1, 5, 2, 6, 3, 7, 4, 8, 5, 9});
  for (int64_t r = 0; r < 10; ++r)
    CHECK(train.raw_image(r)[100] == pixel(static_cast<size_t>(r), 100));
  // The official count is 10000 records a file.
  std::string err = error_of([&] { CIFAR10(dir.path(), true); });
  CHECK(contains(err, "data_batch_1.bin"));
  CHECK(contains(err, "record count mismatch"));
  CHECK(contains(err, "10000"));
}

TEST_CASE("CIFAR-100 uses the second (fine) label byte") {
  TempDir dir;
  write_bytes(dir / "train.bin", cifar_file({{5, 42}, {19, 99}, {0, 0}}));
  CIFAR100 ds(dir.path(), true, Transform(), false);
  CHECK(ds.labels() == std::vector<int64_t>{42, 99, 0});
  CHECK(ds.num_classes() == 100);
  // Pixels start after both label bytes.
  CHECK(ds.raw_image(1)[0] == pixel(1, 0));
  CHECK(ds.raw_image(2)[kPixels - 1] == pixel(2, kPixels - 1));
}

TEST_CASE("CIFAR errors name the file and what is wrong") {
  TempDir dir;
  SUBCASE("truncated file: names the record and its offset") {
    std::vector<uint8_t> bytes = cifar_file({{1}, {2}, {3}});
    bytes.resize(2 * 3073 + 100);
    write_bytes(dir / "test_batch.bin", bytes);
    std::string err = error_of([&] { CIFAR10(dir.path(), false, Transform(), false); });
    CHECK(contains(err, dir / "test_batch.bin"));
    CHECK(contains(err, "truncated"));
    CHECK(contains(err, "offset 6146"));
    CHECK(contains(err, "100 of its 3073"));
  }
  SUBCASE("label out of range") {
    write_bytes(dir / "test_batch.bin", cifar_file({{1}, {10}}));
    std::string err = error_of([&] { CIFAR10(dir.path(), false, Transform(), false); });
    CHECK(contains(err, "test_batch.bin"));
    CHECK(contains(err, "record 1 at byte offset 3073"));
    CHECK(contains(err, "label 10"));
  }
  SUBCASE("missing dataset: says where to put it and how to get it") {
    std::string err = error_of([&] { CIFAR10(dir / "nowhere", true); });
    CHECK(contains(err, "CIFAR-10 not found"));
    CHECK(contains(err, "data_batch_1.bin"));
    CHECK(contains(err, "cifar-10-binary.tar.gz"));
    err = error_of([&] { CIFAR100(dir.path(), false); });
    CHECK(contains(err, "test.bin"));
    CHECK(contains(err, "cifar-100-binary.tar.gz"));
  }
  SUBCASE("one training batch missing") {
    write_bytes(dir / "data_batch_1.bin", cifar_file({{1}}));
    std::string err = error_of([&] { CIFAR10(dir.path(), true, Transform(), false); });
    CHECK(contains(err, "data_batch_2.bin"));
  }
}
