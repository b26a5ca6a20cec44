// Unit tests of compute_bucket_layout (ddp/bucket_layout.h): the Reducer's bucket
// assignment, checked without tensors or processes.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "ddp/bucket_layout.h"

using ddplab::DType;
using ddplab::kFloat32;
using ddplab::kFloat64;
using ddplab::distributed::compute_bucket_layout;
using Layout = std::vector<std::vector<size_t>>;

namespace {

std::vector<size_t> in_order(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  return order;
}

std::vector<size_t> reversed(size_t n) {
  std::vector<size_t> order = in_order(n);
  return {order.rbegin(), order.rend()};
}

}  // namespace

TEST_CASE("buckets fill up to their cap; the first bucket has its own, smaller cap") {
  const std::vector<size_t> bytes(6, 100);
  const std::vector<DType> dtypes(6, kFloat32);
  // First cap 150: one parameter; later caps 300: three, then the rest.
  CHECK(compute_bucket_layout(bytes, dtypes, in_order(6), 150, 300) ==
        Layout{{0}, {1, 2, 3}, {4, 5}});
  // A parameter that exactly reaches the cap still fits.
  CHECK(compute_bucket_layout(bytes, dtypes, in_order(6), 200, 200) ==
        Layout{{0, 1}, {2, 3}, {4, 5}});
}

TEST_CASE("a parameter larger than the cap gets a bucket of its own") {
  const std::vector<size_t> bytes = {10, 1000, 10, 10};
  const std::vector<DType> dtypes(4, kFloat32);
  CHECK(compute_bucket_layout(bytes, dtypes, in_order(4), 100, 100) == Layout{{0}, {1}, {2, 3}});
  // Also as the very first parameter: bucket 0 is then that parameter alone.
  CHECK(compute_bucket_layout(bytes, dtypes, {1, 0, 2, 3}, 100, 100) == Layout{{1}, {0, 2, 3}});
}

TEST_CASE("a change of dtype starts a new bucket") {
  const std::vector<size_t> bytes(5, 8);
  const std::vector<DType> dtypes = {kFloat32, kFloat32, kFloat64, kFloat64, kFloat32};
  CHECK(compute_bucket_layout(bytes, dtypes, in_order(5), 1000, 1000) ==
        Layout{{0, 1}, {2, 3}, {4}});
}

TEST_CASE("buckets follow the given order: reverse registration puts the last parameters first") {
  const std::vector<size_t> bytes(5, 100);
  const std::vector<DType> dtypes(5, kFloat32);
  CHECK(compute_bucket_layout(bytes, dtypes, reversed(5), 100, 200) == Layout{{4}, {3, 2}, {1, 0}});
  // Any permutation (the Reducer's rebuild passes the arrival order).
  CHECK(compute_bucket_layout(bytes, dtypes, {2, 0, 4, 1, 3}, 200, 200) ==
        Layout{{2, 0}, {4, 1}, {3}});
}

TEST_CASE("no parameters, no buckets; a bad index is an error") {
  CHECK(compute_bucket_layout({}, {}, {}, 100, 100).empty());
  CHECK_THROWS_WITH(compute_bucket_layout({4}, {kFloat32}, {1}, 100, 100),
                    doctest::Contains("out of range"));
}
