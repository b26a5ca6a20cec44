// matmul/mm/bmm/gemm_ against naive loops on random shapes, including 1, odd sizes and
// non-contiguous operands.
#include <doctest/doctest.h>

#include <array>
#include <cmath>

#include "tensor/ops.h"
#include "tests/test_util.h"

using namespace ddplab;
using ddplab::testing::check_error_mentions;
using ddplab::testing::test_devices;

namespace {

// Naive product of [B, m, k] x [B, k, n] (B may be 1), in float64.
std::vector<double> naive_bmm(const std::vector<double>& a, const std::vector<double>& b,
                              int64_t batch, int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += a[(z * m + i) * k + p] * b[(z * k + p) * n + j];
        c[(z * m + i) * n + j] = s;
      }
  return c;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / (1 + std::fabs(want[i])));
  CHECK(worst <= tol);
}

}  // namespace

TEST_CASE("mm on random shapes, transposed and sliced operands") {
  Generator gen(5);
  std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1},   {1, 7, 3},    {5, 1, 4},     {3, 4, 1},
                                                {17, 33, 9}, {64, 31, 65}, {128, 96, 200}};
  for (Device dev : test_devices()) {
    for (DType dt : {kFloat32, kFloat64}) {
      for (auto [m, k, n] : shapes) {
        CAPTURE(dev.str());
        CAPTURE(dtype_name(dt));
        CAPTURE(m);
        CAPTURE(k);
        CAPTURE(n);
        Tensor a = ops::randn({m, k}, {dt, dev}, &gen), b = ops::randn({k, n}, {dt, dev}, &gen);
        auto want = naive_bmm(a.to_vector<double>(), b.to_vector<double>(), 1, m, k, n);
        double tol = dt == kFloat64 ? 1e-12 : 1e-5;
        check_close(ops::mm(a, b).to_vector<double>(), want, tol);
        // Transposed storage: (a^T)^T and (b^T)^T are views with swapped strides.
        Tensor at = ops::transpose(ops::contiguous(ops::transpose(a, 0, 1)), 0, 1);
        Tensor bt = ops::transpose(ops::contiguous(ops::transpose(b, 0, 1)), 0, 1);
        check_close(ops::mm(at, bt).to_vector<double>(), want, tol);
        // A column slice of a wider matrix: leading dim larger than the row length.
        Tensor wide = ops::randn({m, k + 3}, {dt, dev}, &gen);
        Tensor as = ops::narrow(wide, 1, 2, k);
        auto want2 =
            naive_bmm(ops::contiguous(as).to_vector<double>(), b.to_vector<double>(), 1, m, k, n);
        check_close(ops::matmul(as, b).to_vector<double>(), want2, tol);
        // gemm_ with alpha and beta accumulating into an existing output.
        Tensor c = ops::ones({m, n}, {dt, dev});
        ops::gemm_(c, a, b, false, false, 2.0, 0.5);
        std::vector<double> want3(want.size());
        for (size_t i = 0; i < want.size(); ++i) want3[i] = 2 * want[i] + 0.5;
        check_close(c.to_vector<double>(), want3, tol);
      }
    }
  }
}

TEST_CASE("matmul: vectors, batches and broadcast batch dims") {
  Generator gen(9);
  for (Device dev : test_devices()) {
    Tensor v = ops::randn({6}, {kFloat64, dev}, &gen), w = ops::randn({6}, {kFloat64, dev}, &gen);
    auto vv = v.to_vector<double>(), wv = w.to_vector<double>();
    double dot = 0;
    for (int i = 0; i < 6; ++i) dot += vv[i] * wv[i];
    Tensor d = ops::matmul(v, w);
    CHECK(d.dim() == 0);
    CHECK(d.item<double>() == doctest::Approx(dot));

    Tensor a = ops::randn({4, 3, 5}, {kFloat64, dev}, &gen),
           b = ops::randn({4, 5, 2}, {kFloat64, dev}, &gen);
    check_close(ops::matmul(a, b).to_vector<double>(),
                naive_bmm(a.to_vector<double>(), b.to_vector<double>(), 4, 3, 5, 2), 1e-12);
    // [4, 3, 5] @ [5, 2]: batch folded into rows.
    Tensor b2 = ops::randn({5, 2}, {kFloat64, dev}, &gen);
    Tensor r = ops::matmul(a, b2);
    CHECK(r.shape() == Shape{4, 3, 2});
    std::vector<double> b2rep;
    for (int z = 0; z < 4; ++z)
      for (double x : b2.to_vector<double>()) b2rep.push_back(x);
    check_close(r.to_vector<double>(), naive_bmm(a.to_vector<double>(), b2rep, 4, 3, 5, 2), 1e-12);
    // [2, 1, 3, 5] @ [4, 5, 2] -> [2, 4, 3, 2]
    Tensor a4 = ops::randn({2, 1, 3, 5}, {kFloat64, dev}, &gen);
    Tensor p = ops::matmul(a4, b);
    CHECK(p.shape() == Shape{2, 4, 3, 2});
    Tensor ref = ops::matmul(ops::contiguous(ops::expand(a4, {2, 4, 3, 5})),
                             ops::contiguous(ops::expand(b, {2, 4, 5, 2})));
    CHECK(ops::max_abs_diff(p, ref) < 1e-12);
    // Matrix-vector.
    Tensor mv = ops::matmul(a, ops::randn({5}, {kFloat64, dev}, &gen));
    CHECK(mv.shape() == Shape{4, 3});
    // float16 inputs compute in float32 and return float16.
    Tensor h = ops::matmul(ops::ones({2, 3}, {kFloat16, dev}), ops::ones({3, 2}, {kFloat16, dev}));
    CHECK(h.dtype() == kFloat16);
    CHECK(h.to_vector<float>() == std::vector<float>{3, 3, 3, 3});

    check_error_mentions(
        [&] {
          ops::matmul(ops::zeros({2, 3}, dev), ops::zeros({4, 5}, dev));
        },
        {"[2, 3]", "[4, 5]"});
    check_error_mentions(
        [&] {
          ops::bmm(ops::zeros({2, 2, 3}, dev), ops::zeros({3, 3, 1}, dev));
        },
        {"[2, 2, 3]", "[3, 3, 1]"});
  }
}
