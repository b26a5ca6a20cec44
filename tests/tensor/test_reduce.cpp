// Reductions over any dims, with keepdim, against float64 loops over the index space.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "tensor/ops.h"
#include "tests/test_util.h"

using namespace ddplab;
using ddplab::testing::check_error_mentions;
using ddplab::testing::test_devices;

namespace {

// Reference: reduce `v` (contiguous, shape) over `dims` with fold/finish in float64.
std::vector<double> reference(const std::vector<double>& v, const Shape& shape,
                              const std::vector<int64_t>& dims,
                              const std::function<double(const std::vector<double>&)>& f) {
  Shape st = contiguous_strides(shape);
  std::vector<bool> red(shape.size(), dims.empty());
  for (int64_t d : dims) red[d] = true;
  Shape kept;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!red[d]) kept.push_back(shape[d]);
  std::vector<std::vector<double>> groups(static_cast<size_t>(shape_numel(kept)));
  for (int64_t i = 0; i < shape_numel(shape); ++i) {
    int64_t rem = i, key = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t idx = rem / st[d];
      rem %= st[d];
      if (!red[d]) key = key * shape[d] + idx;
    }
    groups[key].push_back(v[i]);
  }
  std::vector<double> out;
  out.reserve(groups.size());
  for (auto& g : groups) out.push_back(f(g));
  return out;
}

double sum_of(const std::vector<double>& g) {
  double s = 0;
  for (double x : g) s += x;
  return s;
}

}  // namespace

TEST_CASE("sum, mean, amax, amin, var, norm over every dim subset, keepdim or not") {
  Generator gen(11);
  Shape shape{3, 4, 5};
  std::vector<std::vector<int64_t>> dim_sets = {{},     {0},    {1},       {2}, {0, 1},
                                                {0, 2}, {1, 2}, {0, 1, 2}, {-1}};
  for (Device dev : test_devices()) {
    for (DType dt : {kFloat32, kFloat64}) {
      Tensor x = ops::to(ops::randn(shape, kFloat64, &gen), {dt});
      x = ops::to(x, dev);
      std::vector<double> v = x.to_vector<double>();
      for (auto dims : dim_sets) {
        for (bool keepdim : {false, true}) {
          CAPTURE(dev.str());
          CAPTURE(dtype_name(dt));
          CAPTURE(shape_str(dims));
          CAPTURE(keepdim);
          std::vector<int64_t> wrapped;
          wrapped.reserve(dims.size());
          for (int64_t d : dims) wrapped.push_back(d < 0 ? d + 3 : d);
          double tol = dt == kFloat64 ? 1e-12 : 1e-5;
          auto check = [&](const Tensor& got,
                           const std::function<double(const std::vector<double>&)>& f) {
            auto ref = reference(v, shape, wrapped, f);
            auto out = got.to_vector<double>();
            REQUIRE(out.size() == ref.size());
            for (size_t i = 0; i < ref.size(); ++i)
              CHECK(out[i] == doctest::Approx(ref[i]).epsilon(tol));
            if (keepdim) CHECK(got.dim() == 3);
          };
          check(ops::sum(x, dims, keepdim), sum_of);
          check(ops::mean(x, dims, keepdim), [](auto& g) { return sum_of(g) / g.size(); });
          check(ops::amax(x, dims, keepdim),
                [](auto& g) { return *std::max_element(g.begin(), g.end()); });
          check(ops::amin(x, dims, keepdim),
                [](auto& g) { return *std::min_element(g.begin(), g.end()); });
          check(ops::var(x, dims, 1, keepdim), [](auto& g) {
            double m = sum_of(g) / g.size(), s = 0;
            for (double e : g) s += (e - m) * (e - m);
            return s / (g.size() - 1);
          });
          check(ops::norm(x, 2, dims, keepdim), [](auto& g) {
            double s = 0;
            for (double e : g) s += e * e;
            return std::sqrt(s);
          });
          check(ops::norm(x, 1, dims, keepdim), [](auto& g) {
            double s = 0;
            for (double e : g) s += std::fabs(e);
            return s;
          });
        }
      }
    }
  }
}

TEST_CASE("max/argmax and min/argmin along a dim; ties take the first index; NaN wins") {
  for (Device dev : test_devices()) {
    Tensor x = ops::from_vector<float>({1, 5, 5, 2, -1, 0, -1, 3}, {2, 4}, dev);
    auto mx = ops::max(x, 1);
    CHECK(mx.values.to_vector<float>() == std::vector<float>{5, 3});
    CHECK(mx.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 3});
    auto mn = ops::min(x, 1, true);
    CHECK(mn.values.shape() == Shape{2, 1});
    CHECK(mn.indices.to_vector<int64_t>() == std::vector<int64_t>{0, 0});
    CHECK(ops::argmax(x, 0).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0, 1});
    Tensor n = ops::from_vector<float>({1, NAN, 3}, {3}, dev);
    CHECK(ops::argmax(n, 0).item<int64_t>() == 1);
    CHECK(std::isnan(ops::amax(n).item<float>()));
    CHECK(std::isnan(ops::amin(n).item<float>()));
  }
}

TEST_CASE("integer sums are int64; a large float32 sum keeps its precision") {
  for (Device dev : test_devices()) {
    Tensor i = ops::full({1000}, 3, {kInt32, dev});
    Tensor s = ops::sum(i);
    CHECK(s.dtype() == kInt64);
    CHECK(s.item<int64_t>() == 3000);
    CHECK(ops::sum(ops::gt(ops::arange(0, 10, 1, dev), 4.5)).item<int64_t>() == 5);
    // 2^24 + 1 ones: a single running float32 sum would stop at 2^24.
    Tensor ones = ops::ones({(1 << 24) + 16}, dev);
    CHECK(ops::sum(ones).item<float>() == static_cast<float>((1 << 24) + 16));
    CHECK(ops::sum(ops::zeros({0}, dev)).item<float>() == 0);
    check_error_mentions([&] { ops::amax(ops::zeros({0, 3}, dev), {0}); }, {"[0, 3]"});
    check_error_mentions([&] { ops::sum(ops::zeros({2, 3}, dev), {2}); }, {"dim 2"});
  }
}
