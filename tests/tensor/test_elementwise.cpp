// Elementwise ops against scalar references computed in float64, on every device and several
// dtypes; broadcasting against a table of cases.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "tensor/ops.h"
#include "tests/test_util.h"

using namespace ddplab;
using ddplab::testing::check_error_mentions;
using ddplab::testing::test_devices;

namespace {

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input range
};

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](const Tensor& t) { return ops::neg(t); }, [](double x) { return -x; }, -3, 3},
      {"abs", [](const Tensor& t) { return ops::abs(t); }, [](double x) { return std::fabs(x); },
       -3, 3},
      {"exp", [](const Tensor& t) { return ops::exp(t); }, [](double x) { return std::exp(x); }, -3,
       3},
      {"log", [](const Tensor& t) { return ops::log(t); }, [](double x) { return std::log(x); },
       0.1, 5},
      {"sqrt", [](const Tensor& t) { return ops::sqrt(t); }, [](double x) { return std::sqrt(x); },
       0, 5},
      {"rsqrt", [](const Tensor& t) { return ops::rsqrt(t); },
       [](double x) { return 1 / std::sqrt(x); }, 0.1, 5},
      {"relu", [](const Tensor& t) { return ops::relu(t); }, [](double x) { return x > 0 ? x : 0; },
       -3, 3},
      {"sigmoid", [](const Tensor& t) { return ops::sigmoid(t); },
       [](double x) { return 1 / (1 + std::exp(-x)); }, -6, 6},
      {"tanh", [](const Tensor& t) { return ops::tanh(t); }, [](double x) { return std::tanh(x); },
       -3, 3},
      {"square", [](const Tensor& t) { return ops::square(t); }, [](double x) { return x * x; }, -3,
       3},
      {"reciprocal", [](const Tensor& t) { return ops::reciprocal(t); },
       [](double x) { return 1 / x; }, 0.5, 3},
      {"pow 3", [](const Tensor& t) { return ops::pow(t, 3.0); },
       [](double x) { return x * x * x; }, -2, 2},
      {"pow 0.5", [](const Tensor& t) { return ops::pow(t, 0.5); },
       [](double x) { return std::sqrt(x); }, 0, 4},
      {"clamp", [](const Tensor& t) { return ops::clamp(t, -1.0, 0.5); },
       [](double x) { return std::min(std::max(x, -1.0), 0.5); }, -3, 3},
      {"clamp min", [](const Tensor& t) { return ops::clamp(t, 0.25, std::nullopt); },
       [](double x) { return std::max(x, 0.25); }, -3, 3},
      {"add s", [](const Tensor& t) { return ops::add(t, 2.5); }, [](double x) { return x + 2.5; },
       -3, 3},
      {"sub s", [](const Tensor& t) { return ops::sub(t, 2.5); }, [](double x) { return x - 2.5; },
       -3, 3},
      {"mul s", [](const Tensor& t) { return ops::mul(t, -1.5); },
       [](double x) { return x * -1.5; }, -3, 3},
      {"div s", [](const Tensor& t) { return ops::div(t, 4.0); }, [](double x) { return x / 4; },
       -3, 3},
      {"rsub s", [](const Tensor& t) { return ops::rsub(t, 1.0); }, [](double x) { return 1 - x; },
       -3, 3},
      {"sign", [](const Tensor& t) { return ops::sign(t); },
       [](double x) { return (x > 0) - (x < 0); }, -3, 3},
  };
}

double tolerance(DType t) {
  switch (t) {
    case DType::Float64:
      return 1e-12;
    case DType::Float32:
      return 2e-6;
    case DType::BFloat16:
      return 1e-2;
    default:
      return 2e-3;  // float16
  }
}

}  // namespace

TEST_CASE("unary ops match float64 references on every device and float dtype") {
  Generator gen(7);
  for (Device dev : test_devices()) {
    for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
      for (const auto& c : unary_cases()) {
        CAPTURE(dev.str());
        CAPTURE(dtype_name(dt));
        CAPTURE(c.name);
        // A non-contiguous input ([7, 9] transposed) exercises the strided loop too.
        Tensor x64 = ops::rand({9, 7}, kFloat64, &gen);
        x64 = ops::add(ops::mul(x64, c.hi - c.lo), c.lo);
        Tensor x = ops::transpose(ops::to(ops::to(x64, dt), dev), 0, 1);
        Tensor y = c.op(x);
        CHECK(y.device() == dev);
        CHECK(y.shape() == Shape{7, 9});
        std::vector<double> xin = ops::contiguous(x).to_vector<double>();  // the rounded inputs
        std::vector<double> out = y.to_vector<double>();
        double worst = 0;
        for (size_t i = 0; i < xin.size(); ++i) {
          double r = c.ref(xin[i]);
          worst = std::max(worst, std::fabs(out[i] - r) / std::max(1.0, std::fabs(r)));
        }
        CHECK(worst <= tolerance(dt));
      }
    }
  }
}

TEST_CASE("binary ops broadcast like PyTorch") {
  struct Case {
    Shape a, b, out;
  };
  std::vector<Case> cases = {
      {{3}, {3}, {3}},
      {{2, 3}, {3}, {2, 3}},
      {{2, 1}, {1, 3}, {2, 3}},
      {{}, {2, 3}, {2, 3}},
      {{4, 1, 5}, {3, 1}, {4, 3, 5}},
      {{1}, {5}, {5}},
      {{2, 3, 1, 1}, {2, 3, 4, 4}, {2, 3, 4, 4}},
      {{0, 3}, {1, 3}, {0, 3}},
  };
  Generator gen(3);
  for (Device dev : test_devices()) {
    for (const auto& c : cases) {
      CAPTURE(shape_str(c.a));
      CAPTURE(shape_str(c.b));
      Tensor a = ops::rand(c.a, {kFloat64, dev}, &gen),
             b = ops::add(ops::rand(c.b, {kFloat64, dev}, &gen), 0.5);
      Tensor ea = ops::contiguous(ops::expand(a, c.out)),
             eb = ops::contiguous(ops::expand(b, c.out));
      auto av = ea.to_vector<double>(), bv = eb.to_vector<double>();
      struct Op {
        const char* name;
        std::function<Tensor(const Tensor&, const Tensor&)> f;
        std::function<double(double, double)> r;
      };
      std::vector<Op> ops_list = {
          {"add", [](auto& x, auto& y) { return ops::add(x, y); },
           [](double x, double y) { return x + y; }},
          {"add alpha", [](auto& x, auto& y) { return ops::add(x, y, 2.0); },
           [](double x, double y) { return x + 2 * y; }},
          {"sub", [](auto& x, auto& y) { return ops::sub(x, y); },
           [](double x, double y) { return x - y; }},
          {"mul", [](auto& x, auto& y) { return ops::mul(x, y); },
           [](double x, double y) { return x * y; }},
          {"div", [](auto& x, auto& y) { return ops::div(x, y); },
           [](double x, double y) { return x / y; }},
          {"pow", [](auto& x, auto& y) { return ops::pow(x, y); },
           [](double x, double y) { return std::pow(x, y); }},
          {"maximum", [](auto& x, auto& y) { return ops::maximum(x, y); },
           [](double x, double y) { return std::max(x, y); }},
          {"minimum", [](auto& x, auto& y) { return ops::minimum(x, y); },
           [](double x, double y) { return std::min(x, y); }},
          {"lt", [](auto& x, auto& y) { return ops::lt(x, y); },
           [](double x, double y) { return double(x < y); }},
          {"ge", [](auto& x, auto& y) { return ops::ge(x, y); },
           [](double x, double y) { return double(x >= y); }},
      };
      for (const auto& op : ops_list) {
        CAPTURE(op.name);
        Tensor out = op.f(a, b);
        REQUIRE(out.shape() == c.out);
        auto ov = out.to_vector<double>();
        for (size_t i = 0; i < ov.size(); ++i)
          CHECK(ov[i] == doctest::Approx(op.r(av[i], bv[i])).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("in-place ops, where, integer and bool dtypes, promotion") {
  for (Device dev : test_devices()) {
    CAPTURE(dev.str());
    Tensor a = ops::from_vector<float>({1, 2, 3, 4}, {2, 2}, dev);
    Tensor b = ops::from_vector<float>({10, 20}, {2}, dev);
    ops::add_(a, b, 0.5);
    CHECK(a.to_vector<float>() == std::vector<float>{6, 12, 8, 14});
    ops::mul_(a, 2.0);
    ops::sub_(a, ops::ones({2, 2}, dev));
    CHECK(a.to_vector<float>() == std::vector<float>{11, 23, 15, 27});
    ops::axpby_(a, 0.5, ops::ones({2, 2}, dev), 2.0);  // a = 0.5 a + 2
    CHECK(a.to_vector<float>() == std::vector<float>{7.5, 13.5, 9.5, 15.5});
    // In-place into a view writes the base.
    Tensor base = ops::zeros({3, 3}, dev);
    ops::add_(ops::select(base, 1, 1), 5.0);
    CHECK(base.to_vector<float>() == std::vector<float>{0, 5, 0, 0, 5, 0, 0, 5, 0});
    // mul_out writes t * s into a view, never reading what was there (even NaN).
    Tensor slot = ops::narrow(ops::full({4}, std::nan(""), dev), 0, 1, 2);
    ops::mul_out(slot, ops::from_vector<float>({2, -4}, {2}, dev), 0.5);
    CHECK(slot.to_vector<float>() == std::vector<float>{1, -2});
    check_error_mentions(
        [&] {
          ops::add_(ops::zeros({3}, dev), ops::zeros({2, 3}, dev));
        },
        {"[2, 3]", "[3]"});

    Tensor cond = ops::gt(ops::from_vector<float>({1, -1, 2}, {3}, dev), 0.0);
    CHECK(cond.dtype() == kBool);
    Tensor w = ops::where(cond, ops::full({3}, 1, dev), ops::full({3}, -7, dev));
    CHECK(w.to_vector<float>() == std::vector<float>{1, -7, 1});

    Tensor i = ops::from_vector<int64_t>({5, -3, 7}, {3}, {kInt64, dev});
    CHECK(ops::add(i, i).to_vector<int64_t>() == std::vector<int64_t>{10, -6, 14});
    CHECK(ops::abs(i).to_vector<int64_t>() == std::vector<int64_t>{5, 3, 7});
    CHECK(ops::add(i, i).dtype() == kInt64);
    Tensor f = ops::add(i, ops::full({3}, 0.5, dev));
    CHECK(f.dtype() == kFloat32);  // int + float -> float
    CHECK(f.to_vector<float>() == std::vector<float>{5.5, -2.5, 7.5});
    CHECK(ops::exp(ops::zeros({2}, {kInt32, dev})).dtype() == kFloat32);
    Tensor h =
        ops::add(ops::full({2}, 1.5, {kFloat16, dev}), ops::full({2}, 0.25, {kFloat16, dev}));
    CHECK(h.dtype() == kFloat16);
    CHECK(h.to_vector<float>() == std::vector<float>{1.75, 1.75});
    CHECK(
        ops::add(ops::full({1}, 1, {kFloat16, dev}), ops::full({1}, 1, {kFloat64, dev})).dtype() ==
        kFloat64);

    Tensor nan = ops::from_vector<float>({1, NAN, INFINITY, -2}, {4}, dev);
    CHECK(ops::isfinite(nan).to_vector<bool>() == std::vector<bool>{true, false, false, true});
    CHECK_FALSE(ops::all_finite(nan));
    CHECK(std::isnan(ops::relu(nan).to_vector<float>()[1]));
    CHECK(std::isnan(ops::clamp(nan, 0.0, 1.0).to_vector<float>()[1]));
    check_error_mentions(
        [&] {
          ops::add(ops::zeros({2, 3}, dev), ops::zeros({4}, dev));
        },
        {"[2, 3]", "[4]"});
  }
}

TEST_CASE("large tensors use the parallel path and agree with the serial reference") {
  Tensor x = ops::arange(0, 1 << 20);
  Tensor y = ops::mul(x, 2.0);
  auto v = y.to_vector<float>();
  bool ok = true;
  for (size_t i = 0; i < v.size(); ++i) ok &= v[i] == 2.0f * static_cast<float>(i);
  CHECK(ok);
  // A strided (transposed) large case.
  Tensor m = ops::view(ops::arange(0, 1 << 20), {1024, 1024});
  Tensor t = ops::add(ops::transpose(m, 0, 1), 1.0);
  CHECK(t.to_vector<float>()[5 * 1024 + 7] == 7 * 1024 + 5 + 1);
}
