// Unit tests of optim::GradScaler in one process: PyTorch's defaults, scale/unscale_/step/update
// in the order PyTorch enforces, state_dict round trips, clipping between unscale_ and step, and a
// disabled scaler that changes nothing. (Across ranks: tests/distributed/test_grad_scaler.cpp.)
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/functions.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace ddplab;

namespace {

Tensor param(const std::vector<float>& v) {
  Tensor p = ops::from_vector<float>(v, {static_cast<int64_t>(v.size())});
  p.set_requires_grad(true);
  return p;
}

}  // namespace

TEST_CASE("GradScaler: PyTorch's defaults") {
  optim::GradScaler s;
  CHECK(s.get_scale() == 65536.0);
  CHECK(s.options().growth_factor == 2.0);
  CHECK(s.options().backoff_factor == 0.5);
  CHECK(s.options().growth_interval == 2000);
  CHECK(s.get_growth_tracker() == 0);
}

TEST_CASE("GradScaler: scale(loss) scales the gradients; step() applies the true ones") {
  Tensor w = param({1.0f, 2.0f});
  optim::SGD opt({w}, {0.5});
  optim::GradScaler s;
  Tensor loss = ddplab::sum(ddplab::mul(w, 3.0));  // d loss / dw = 3
  s.scale(loss).backward();
  CHECK(w.grad().to_vector<float>()[0] == doctest::Approx(3.0 * 65536));
  CHECK(s.step(opt));
  s.update();
  CHECK(w.to_vector<float>()[0] == doctest::Approx(1.0 - 0.5 * 3));
  CHECK(w.to_vector<float>()[1] == doctest::Approx(2.0 - 0.5 * 3));
  CHECK(s.get_growth_tracker() == 1);
}

TEST_CASE("GradScaler: unscale_ twice, or step twice, without update() is an error") {
  Tensor w = param({1.0f});
  optim::SGD opt({w}, {0.1});
  optim::GradScaler s;
  w.set_grad(ops::full({1}, 2.0));
  s.unscale_(opt);
  CHECK_THROWS_WITH_AS(s.unscale_(opt), doctest::Contains("already called"), Error);
  CHECK(s.step(opt));  // step after unscale_ does not unscale again
  CHECK(w.to_vector<float>()[0] == doctest::Approx(1.0 - 0.1 * 2.0 / 65536));
  CHECK_THROWS_WITH_AS(s.step(opt), doctest::Contains("already called"), Error);
  CHECK_THROWS_WITH_AS(s.unscale_(opt), doctest::Contains("after step()"), Error);
  s.update();
  w.set_grad(ops::full({1}, 2.0));
  CHECK_NOTHROW(s.unscale_(opt));  // a new iteration
}

TEST_CASE("GradScaler: an overflow skips the step and backs off; clean runs grow the scale") {
  Tensor w = param({1.0f, 1.0f});
  optim::SGD opt({w}, {0.1});
  optim::GradScalerOptions o;
  o.init_scale = 8;
  o.growth_interval = 2;
  optim::GradScaler s(o);
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    const double scale = s.get_scale();
    w.set_grad(ops::from_vector<float>({1.0f, bad}, {2}));
    CHECK_FALSE(s.step(opt));
    s.update();
    CHECK(s.get_scale() == scale / 2);
    CHECK(w.to_vector<float>()[0] == 1.0f);  // untouched
  }
  CHECK(s.get_scale() == 1);
  for (int i = 0; i < 2; ++i) {
    w.set_grad(ops::full({2}, 1.0));
    CHECK(s.step(opt));
    s.update();
  }
  CHECK(s.get_scale() == 2);
  CHECK(s.get_growth_tracker() == 0);
  s.update(1024);  // PyTorch's update(new_scale)
  CHECK(s.get_scale() == 1024);
}

TEST_CASE("GradScaler: state_dict round trip") {
  optim::GradScalerOptions o;
  o.init_scale = 256;
  o.growth_interval = 3;
  o.growth_factor = 4;
  optim::GradScaler a(o);
  Tensor w = param({1.0f});
  optim::SGD opt({w}, {0.1});
  w.set_grad(ops::full({1}, 1.0));
  a.step(opt);
  a.update();  // tracker 1
  const nlohmann::json state = a.state_dict();
  CHECK(state.at("scale").get<double>() == 256);
  CHECK(state.at("_growth_tracker").get<int64_t>() == 1);

  optim::GradScaler b;  // other defaults: everything comes from the state
  b.load_state_dict(state);
  CHECK(b.get_scale() == 256);
  CHECK(b.get_growth_tracker() == 1);
  CHECK(b.options().growth_interval == 3);
  CHECK(b.options().growth_factor == 4);
  CHECK(b.state_dict() == state);
  // Two more clean steps reach the interval of 3: both grow by 4 in the same place.
  for (optim::GradScaler* s : {&a, &b}) {
    for (int i = 0; i < 2; ++i) {
      w.set_grad(ops::full({1}, 1.0));
      s->step(opt);
      s->update();
    }
    CHECK(s->get_scale() == 1024);
  }
  nlohmann::json partial = state;
  partial.erase("scale");
  CHECK_THROWS_WITH_AS(b.load_state_dict(partial), doctest::Contains("missing key 'scale'"), Error);
}

TEST_CASE("GradScaler: clip_grad_norm_ after unscale_ sees the true gradients") {
  Tensor w = param({0.0f, 0.0f});
  optim::SGD opt({w}, {1.0});
  optim::GradScaler s;
  // True gradient (3, 4): norm 5. Backward delivers it times the scale.
  w.set_grad(ops::from_vector<float>({3.0f * 65536, 4.0f * 65536}, {2}));
  s.unscale_(opt);
  const double norm = optim::clip_grad_norm_({w}, /*max_norm=*/1.0);
  CHECK(norm == doctest::Approx(5.0));
  CHECK(s.step(opt));
  // The clipped true gradient (0.6, 0.8), not unscaled a second time.
  CHECK(w.to_vector<float>()[0] == doctest::Approx(-0.6).epsilon(1e-5));
  CHECK(w.to_vector<float>()[1] == doctest::Approx(-0.8).epsilon(1e-5));
}

TEST_CASE("GradScaler: disabled, it passes everything through") {
  optim::GradScalerOptions o;
  o.enabled = false;
  optim::GradScaler s(o);
  Tensor w = param({1.0f});
  optim::SGD opt({w}, {0.1});
  Tensor loss = ddplab::sum(ddplab::mul(w, 2.0));
  s.scale(loss).backward();
  CHECK(w.grad().to_vector<float>()[0] == 2.0f);
  s.unscale_(opt);
  s.unscale_(opt);  // no bookkeeping when disabled
  CHECK(s.step(opt));
  s.update();
  CHECK(w.to_vector<float>()[0] == doctest::Approx(0.8));
  CHECK(s.get_scale() == 1.0);
  CHECK(s.state_dict().empty());
}

TEST_CASE("GradScaler: float16 gradients are refused, as in PyTorch") {
  Tensor w = ops::ones({2}, kFloat16);
  w.set_requires_grad(true);
  optim::SGD opt({w}, {0.1});
  optim::GradScaler s;
  w.set_grad(ops::ones({2}, kFloat16));
  CHECK_THROWS_WITH_AS(s.unscale_(opt), doctest::Contains("float16 gradient"), Error);
}

TEST_CASE("GradScaler: invalid options are rejected") {
  optim::GradScalerOptions o;
  o.growth_interval = 0;
  CHECK_THROWS_WITH_AS(optim::GradScaler{o}, doctest::Contains("growth_interval"), Error);
  o = {};
  o.backoff_factor = 1.5;
  CHECK_THROWS_WITH_AS(optim::GradScaler{o}, doctest::Contains("backoff_factor"), Error);
}
