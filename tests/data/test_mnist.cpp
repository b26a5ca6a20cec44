// IDX files (plain and gzipped), MNIST/Fashion-MNIST loading, and the real Fashion-MNIST.
#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>

#include "data/file_io.h"
#include "data/mnist.h"
#include "test_util.h"
#include "tests/skip.h"

using namespace ddplab;
using namespace ddplab::data;
using namespace ddplab::data::testing;

namespace {

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t h, uint32_t w, uint32_t magic = 0x803) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  put_be32(out, n);
  put_be32(out, h);
  put_be32(out, w);
  for (uint32_t i = 0; i < n * h * w; ++i) out.push_back(static_cast<uint8_t>(i * 13 % 256));
  return out;
}

std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels, uint32_t magic = 0x801) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  put_be32(out, static_cast<uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void check_small(const ImageDataset& ds) {
  REQUIRE(ds.size() == 3);
  CHECK(ds.labels() == std::vector<int64_t>{7, 0, 2});
  CHECK(ds.sample_shape() == Shape{1, 4, 5});
  Example ex = ds.get(2);
  CHECK(ex.label == 2);
  const float* p = ex.image.data_ptr<float>();
  for (uint32_t q = 0; q < 20; ++q)
    REQUIRE(p[q] == static_cast<float>(static_cast<uint8_t>((40 + q) * 13 % 256)) / 255.0f);
}

}  // namespace

TEST_CASE("IDX plain and gzipped decode to the same dataset") {
  TempDir dir;
  write_bytes(dir / "plain/train-images-idx3-ubyte", idx_images(3, 4, 5));
  write_bytes(dir / "plain/train-labels-idx1-ubyte", idx_labels({7, 0, 2}));
  write_gz(dir / "gz/t10k-images-idx3-ubyte.gz", idx_images(3, 4, 5));
  write_gz(dir / "gz/t10k-labels-idx1-ubyte.gz", idx_labels({7, 0, 2}));
  check_small(MNIST(dir / "plain", true));
  check_small(FashionMNIST(dir / "gz", false));
  IdxArray a = read_idx(dir / "gz/t10k-images-idx3-ubyte.gz", 3);
  CHECK(a.dims == std::vector<int64_t>{3, 4, 5});
  CHECK(a.data.size() == 60);
}

TEST_CASE("IDX errors name the file and what is wrong") {
  TempDir dir;
  SUBCASE("wrong magic number") {
    write_bytes(dir / "x", idx_images(1, 2, 2, 0x12345678));
    std::string err = error_of([&] { read_idx(dir / "x"); });
    CHECK(contains(err, dir / "x"));
    CHECK(contains(err, "wrong magic number 0x12345678"));
  }
  SUBCASE("images and labels swapped") {
    write_bytes(dir / "train-images-idx3-ubyte", idx_labels({1, 2}));
    write_bytes(dir / "train-labels-idx1-ubyte", idx_images(2, 2, 2));
    std::string err = error_of([&] { MNIST(dir.path(), true); });
    CHECK(contains(err, "train-images-idx3-ubyte"));
    CHECK(contains(err, "wrong magic number 0x00000801"));
  }
  SUBCASE("truncated data") {
    std::vector<uint8_t> b = idx_images(3, 4, 5);
    b.resize(b.size() - 7);
    write_bytes(dir / "x", b);
    std::string err = error_of([&] { read_idx(dir / "x", 3); });
    CHECK(contains(err, dir / "x"));
    CHECK(contains(err, "truncated"));
    CHECK(contains(err, "offset 16"));  // where the data starts
    CHECK(contains(err, "offset 69"));  // where it ends
  }
  SUBCASE("truncated gzip stream") {
    write_gz(dir / "x.gz", idx_images(50, 28, 28));
    std::vector<uint8_t> b = read_bytes(dir / "x.gz");
    b.resize(b.size() / 2);
    write_bytes(dir / "x.gz", b);
    std::string err = error_of([&] { read_idx(dir / "x.gz"); });
    CHECK(contains(err, dir / "x.gz"));
  }
  SUBCASE("record count mismatch") {
    write_bytes(dir / "train-images-idx3-ubyte", idx_images(3, 2, 2));
    write_bytes(dir / "train-labels-idx1-ubyte", idx_labels({1, 2}));
    std::string err = error_of([&] { MNIST(dir.path(), true); });
    CHECK(contains(err, "record count mismatch"));
    CHECK(contains(err, "3 images"));
    CHECK(contains(err, "2 labels"));
  }
  SUBCASE("dimensions whose product overflows") {
    // Four dimensions of 65536: the product is 2^64, which wraps to 0 in 64 bits and would
    // "match" a file with no data at all.
    std::vector<uint8_t> b;
    put_be32(b, 0x804);
    for (int d = 0; d < 4; ++d) put_be32(b, 65536);
    write_bytes(dir / "x", b);
    std::string err = error_of([&] { read_idx(dir / "x"); });
    CHECK(contains(err, dir / "x"));
    CHECK(contains(err, "overflow"));
    CHECK(contains(err, "offset 16"));  // the dimension where it overflows
  }
  SUBCASE("missing dataset: says how to get it") {
    std::string err = error_of([&] { FashionMNIST(dir / "nowhere", true); });
    CHECK(contains(err, "Fashion-MNIST not found"));
    CHECK(contains(err, "apt install dataset-fashion-mnist"));
    err = error_of([&] { MNIST(dir.path(), false); });
    CHECK(contains(err, "t10k-images-idx3-ubyte"));
    CHECK(contains(err, "yann.lecun.com"));
  }
}

TEST_CASE("the real Fashion-MNIST (Debian's dataset-fashion-mnist)") {
  const std::string root = FashionMNIST::kDebianRoot;
  DDP_SKIP_IF(!file_exists(root + "/train-images-idx3-ubyte.gz"),
              "Fashion-MNIST is not installed at " + root + " (apt install dataset-fashion-mnist)");
  FashionMNIST train(root, true, Transform::eval(fashion_mnist_stats()));
  FashionMNIST test(root, false);
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.sample_shape() == Shape{1, 28, 28});
  // Byte 8 of train-labels-idx1-ubyte is 9 (checked with `zcat ... | xxd`): an ankle boot.
  CHECK(train.labels()[0] == 9);
  CHECK(train.classes()[9] == "Ankle boot");
  CHECK(test.labels()[0] == 9);
  // Raw pixels use the full byte range; to-tensor maps them into [0, 1].
  const uint8_t* raw = train.raw_image(0);
  CHECK(*std::max_element(raw, raw + 784) == 255);
  CHECK(*std::min_element(raw, raw + 784) == 0);
  Example ex = test.get(0);
  const float* p = ex.image.data_ptr<float>();
  CHECK(*std::min_element(p, p + 784) >= 0.0f);
  CHECK(*std::max_element(p, p + 784) <= 1.0f);
  // Per-class counts are balanced: 6000 of each in train.
  std::vector<int64_t> counts(10, 0);
  for (int64_t l : train.labels()) counts[static_cast<size_t>(l)]++;
  for (int64_t c : counts) CHECK(c == 6000);
  // The normalized training set has mean ~0 and std ~1 (the stats are this dataset's).
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < 60000; i += 10) {
    Example e = train.get(i);
    const float* q = e.image.data_ptr<float>();
    for (int k = 0; k < 784; ++k) {
      sum += q[k];
      sq += static_cast<double>(q[k]) * q[k];
    }
  }
  const double n = 6000.0 * 784;
  CHECK(std::abs(sum / n) < 0.02);
  CHECK(std::abs(std::sqrt(sq / n - (sum / n) * (sum / n)) - 1.0) < 0.02);
}
