// Lab 6's grader. Each TEST_CASE is one point of the part its name starts with (scripts/lab).
// The oracles: ddplab's own float16 conversion (tensor/half.h) for part 1, its
// optim::GradScaler for parts 2 and 4, PyTorch's documented update rule worked by hand for
// part 4, and, in part 3, forked ranks whose parameters must stay identical.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "fork_ranks.h"
#include "loss_scaling_lab.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/half.h"
#include "tensor/ops.h"

using namespace ddplab;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// What the float16 conversion does to each values[i] * scale, counted as Float16Report says.
lab6::Float16Report float16_oracle(const std::vector<float>& values, float scale) {
  lab6::Float16Report r;
  for (float x : values) {
    const float v = x * scale;
    const float h = static_cast<float>(Half(v));
    if (!std::isfinite(h))
      ++r.overflow;
    else if (v != 0 && h == 0)
      ++r.underflow;
    else if (h != 0 && std::fabs(h) < 0x1p-14f)
      ++r.subnormal;
  }
  return r;
}

void check_report(const std::vector<float>& values, float scale, const std::string& what) {
  const lab6::Float16Report got = lab6::check_float16(values.data(), values.size(), scale);
  const lab6::Float16Report want = float16_oracle(values, scale);
  CHECK_MESSAGE(got.underflow == want.underflow, what << " x " << scale << ": underflow");
  CHECK_MESSAGE(got.subnormal == want.subnormal, what << " x " << scale << ": subnormal");
  CHECK_MESSAGE(got.overflow == want.overflow, what << " x " << scale << ": overflow");
}

// Does any values[i] * s (exact in double, then float32) round to inf or NaN in float16?
bool overflows(const std::vector<float>& values, double s) {
  for (float x : values)
    if (!std::isfinite(static_cast<float>(Half(static_cast<float>(x * s))))) return true;
  return false;
}

bool is_power_of_two(double s) {
  int e = 0;
  return s > 0 && std::frexp(s, &e) == 0.5;
}

Tensor param(const std::vector<float>& v) {
  Tensor p = ops::from_vector<float>(v, {static_cast<int64_t>(v.size())});
  p.set_requires_grad(true);
  return p;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t xb = 0, yb = 0;  // the bits, so that -0 differs from 0 and NaN equals itself
    std::memcpy(&xb, &x[i], sizeof xb);
    std::memcpy(&yb, &y[i], sizeof yb);
    if (xb != yb) return false;
  }
  return true;
}

// The library's unscale_ of `grads` at `scale`: the unscaled copies and whether it found an
// inf/NaN (its step() skips exactly then; lr 0 keeps the parameters as they are).
std::pair<std::vector<Tensor>, bool> library_unscale(const std::vector<std::vector<float>>& grads,
                                                     double scale) {
  std::vector<Tensor> params;
  params.reserve(grads.size());
  for (const auto& g : grads) {
    Tensor p = param(std::vector<float>(g.size(), 0.0f));
    p.set_grad(ops::from_vector<float>(g, {static_cast<int64_t>(g.size())}));
    params.push_back(p);
  }
  optim::SGD opt(params, {0.0});
  optim::GradScalerOptions o;
  o.init_scale = scale;
  optim::GradScaler scaler(o);
  const bool found_inf = !scaler.step(opt);
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const Tensor& p : params) out.push_back(p.grad());
  return {out, found_inf};
}

void check_unscale(const std::vector<std::vector<float>>& grads, double scale, bool exact) {
  std::vector<Tensor> mine;
  mine.reserve(grads.size());
  for (const auto& g : grads)
    mine.push_back(ops::from_vector<float>(g, {static_cast<int64_t>(g.size())}));
  const bool found = lab6::unscale_grads_(mine, scale);
  const auto [want, want_found] = library_unscale(grads, scale);
  CHECK_MESSAGE(found == want_found, "found_inf at scale " << scale);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (exact) {
      CHECK_MESSAGE(same_bits(mine[i], want[i]), "gradient " << i << " at scale " << scale);
    } else {
      const std::vector<float> a = mine[i].to_vector<float>(), b = want[i].to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k)
        if (std::isfinite(b[k])) CHECK(a[k] == doctest::Approx(b[k]).epsilon(1e-6));
    }
  }
}

}  // namespace

TEST_CASE("part 1 (find the overflow): float16's edges one value at a time") {
  const std::vector<float> edges = {65504.0f,
                                    65519.0f,
                                    65520.0f,
                                    -65520.0f,
                                    70000.0f,
                                    1e10f,  // the largest float16 and beyond
                                    0x1p-14f,
                                    6.1e-5f,
                                    0x1p-14f - 0x1p-25f,
                                    0x1p-14f - 0x1p-24f,  // the smallest normal
                                    6e-8f,
                                    0x1p-24f,
                                    3e-8f,
                                    0x1p-25f,
                                    2.9e-8f,
                                    -1e-8f,
                                    1e-45f,  // the smallest subnormal
                                    1e-6f,
                                    -3e-5f,
                                    1.0f,
                                    0.0f,
                                    -0.0f,
                                    kInf,
                                    -kInf,
                                    kNaN};
  for (float v : edges) check_report({v}, 1.0f, "the single value " + std::to_string(v));
  check_report(edges, 1.0f, "all the edges together");
}

TEST_CASE("part 1 (find the overflow): random gradients at several loss scales") {
  std::mt19937 rng(6);
  std::uniform_real_distribution<double> exponent(-32, 20);
  std::vector<float> g(4000);
  for (float& x : g) x = static_cast<float>((rng() % 2 ? 1 : -1) * std::exp2(exponent(rng)));
  for (float scale : {1.0f, 0.5f, 1024.0f, 65536.0f, 0x1p-10f, 3.0f})
    check_report(g, scale, "4000 log-uniform gradients");
}

TEST_CASE("part 1 (find the overflow): the largest safe loss scale") {
  // Worked out from float16's format: 65504 and 65519 stay finite at S = 1, 65520 rounds to inf.
  CHECK(lab6::largest_safe_scale(std::vector<float>{65504.0f}.data(), 1) == 1.0);
  CHECK(lab6::largest_safe_scale(std::vector<float>{-65519.0f}.data(), 1) == 1.0);
  CHECK(lab6::largest_safe_scale(std::vector<float>{65520.0f}.data(), 1) == 0.5);
  CHECK(std::isinf(lab6::largest_safe_scale(std::vector<float>{0.0f, -0.0f}.data(), 2)));
  CHECK(lab6::largest_safe_scale(std::vector<float>{1.0f, kNaN}.data(), 2) == 0);
  CHECK(lab6::largest_safe_scale(std::vector<float>{-kInf}.data(), 1) == 0);
  // Against the conversion: S is a power of two, S is safe and 2 S is not.
  std::mt19937 rng(60);
  std::uniform_real_distribution<double> exponent(-40, 30);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> g(1 + trial % 7);
    for (float& x : g) x = static_cast<float>((rng() % 2 ? 1 : -1) * std::exp2(exponent(rng)));
    if (trial % 5 == 0) g.push_back(0.0f);
    const double s = lab6::largest_safe_scale(g.data(), g.size());
    CHECK_MESSAGE(is_power_of_two(s), "S = " << s);
    CHECK_MESSAGE(!overflows(g, s), "S = " << s << " overflows for max |g| " << g[0]);
    CHECK_MESSAGE(overflows(g, 2 * s), "S = " << s << " is not the largest: 2 S is safe too");
  }
}

TEST_CASE("part 2 (unscale): the gradients divided by the scale as optim::GradScaler does") {
  const std::vector<std::vector<float>> grads = {
      {65536.0f, -131072.0f, 3.0f, 0.0f}, {1e-3f, 7.0f}, {1e30f, -1e-30f, 12345.678f}};
  check_unscale(grads, 65536.0, /*exact=*/true);
  check_unscale(grads, 0.125, /*exact=*/true);
  check_unscale(grads, 3.0, /*exact=*/false);  // 1/3 is not exact: GradScaler multiplies by it
  // Gradients of parameters that did not take part (undefined) are skipped.
  std::vector<Tensor> with_undefined = {Tensor(), ops::full({2}, 8.0)};
  CHECK_FALSE(lab6::unscale_grads_(with_undefined, 4.0));
  CHECK(with_undefined[1].to_vector<float>() == std::vector<float>{2.0f, 2.0f});
  CHECK_FALSE(lab6::unscale_grads_({}, 4.0));
}

TEST_CASE("part 2 (unscale): found_inf for an inf or a NaN anywhere and only then") {
  check_unscale({{1.0f, 2.0f}, {3.0f, kInf}}, 1024.0, true);
  check_unscale({{-kInf}}, 2.0, true);
  check_unscale({{kNaN, 1.0f}, {4.0f}}, 2.0, true);
  check_unscale({{1.0f}, {2.0f}, {3.0f, 4.0f, kNaN}}, 8.0, true);
  // The largest finite float32 is not an overflow.
  check_unscale({{3.4e38f, -3.4e38f}}, 1.0, true);
  std::vector<Tensor> g = {ops::full({3}, 4.0), ops::full({2}, 2.0)};
  CHECK_FALSE(lab6::unscale_grads_(g, 2.0));
  std::vector<float> v = {1.0f, kNaN};
  std::vector<Tensor> h = {ops::from_vector<float>(v, {2})};
  CHECK(lab6::unscale_grads_(h, 2.0));
}

namespace {

// Every element of `t` equal on all ranks (rank 0's copy is broadcast and compared exactly).
bool same_on_every_rank(distributed::ProcessGroup& pg, const Tensor& t) {
  Tensor root = ops::clone(t);
  pg.broadcast(root, 0)->wait();
  return ops::max_abs_diff(root, t) == 0;
}

// A few training steps on `world` ranks that hold the same parameters and compute the same
// (scaled) gradients by hand, except that rank `bad_rank` gets an inf at step `bad_step`: with
// the flag agreed, every rank skips that step and the replicas stay identical.
void train_with_one_bad_rank(int world, int bad_rank, int bad_step) {
  testing::run_ranks(world, [&](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    auto pg = testing::make_group(rank, w, st);
    Tensor weight = param({1.0f, -2.0f, 3.0f, 0.5f});
    optim::SGD opt({weight}, {0.1});
    const double scale = 1024;
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g = {0.5f, -0.25f, 1.0f, 2.0f};
      for (float& x : g) x *= static_cast<float>(scale * (step + 1));
      if (rank == bad_rank && step == bad_step) g[2] = kInf;
      weight.set_grad(ops::from_vector<float>(g, {4}));
      const Tensor before = ops::clone(weight);
      bool local = !ops::all_finite(weight.grad());
      ops::mul_(weight.grad(), 1.0 / scale);
      const bool skip = lab6::any_rank_found_inf(*pg, local);
      EXPECT(skip == (step == bad_step),
             "rank " << rank << ", step " << step << ": any_rank_found_inf says " << skip);
      if (!skip) opt.step();
      if (step == bad_step)
        EXPECT(ops::max_abs_diff(weight, before) == 0, "rank " << rank << " stepped");
      EXPECT(same_on_every_rank(*pg, weight),
             "the replicas differ after step " << step << " (rank " << rank << ")");
    }
    testing::finish(pg, *st);
  });
}

}  // namespace

TEST_CASE("part 3 (ranks agree): any rank's flag reaches every rank on 2 ranks") {
  testing::run_ranks(2, [](int rank, int w, const std::shared_ptr<distributed::TCPStore>& st) {
    auto pg = testing::make_group(rank, w, st);
    for (int pattern = 0; pattern < 4; ++pattern) {  // bit r: rank r found an inf
      const bool mine = (pattern >> rank) & 1;
      const bool got = lab6::any_rank_found_inf(*pg, mine);
      EXPECT(got == (pattern != 0), "pattern " << pattern << ": rank " << rank << " got " << got);
    }
    testing::finish(pg, *st);
  });
}

TEST_CASE("part 3 (ranks agree): one bad rank of 2 makes both skip; the replicas stay equal") {
  train_with_one_bad_rank(2, /*bad_rank=*/1, /*bad_step=*/1);
}

TEST_CASE("part 3 (ranks agree): one bad rank of 3 makes all skip; the replicas stay equal") {
  train_with_one_bad_rank(3, /*bad_rank=*/2, /*bad_step=*/2);
  train_with_one_bad_rank(3, /*bad_rank=*/0, /*bad_step=*/0);
}

TEST_CASE("part 4 (update rule): PyTorch's rule worked by hand") {
  // init 16, growth 2, backoff 0.5, growth_interval 3. Each row: this step's found_inf, then
  // the scale and growth tracker after update(). Step 8 is the test of the reset: counting on
  // from before step 5's inf would reach 3 clean steps at step 7 and grow.
  struct Row {
    bool inf;
    double scale;
    int64_t tracker;
  };
  const std::vector<Row> rows = {
      {false, 16, 1}, {false, 16, 2}, {false, 32, 0},  // 3 clean steps: grow
      {false, 32, 1}, {true, 16, 0},                   // an inf: back off, start counting again
      {false, 16, 1}, {false, 16, 2}, {true, 8, 0},    // 2 clean steps are not enough
      {true, 4, 0},   {false, 4, 1},  {false, 4, 2},  {false, 8, 0}, {false, 8, 1}};
  double scale = 16;
  int64_t tracker = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    lab6::update_scale_(scale, tracker, rows[i].inf, 2.0, 0.5, 3);
    CHECK_MESSAGE(scale == rows[i].scale, "after step " << i + 1);
    CHECK_MESSAGE(tracker == rows[i].tracker, "after step " << i + 1);
  }
}

TEST_CASE("part 4 (update rule): step for step the same as optim::GradScaler") {
  optim::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_factor = 4;
  o.backoff_factor = 0.25;
  o.growth_interval = 4;
  optim::GradScaler scaler(o);
  Tensor w = param({1.0f, 2.0f});
  optim::SGD opt({w}, {0.0});
  double scale = o.init_scale;
  int64_t tracker = 0;
  std::mt19937 rng(66);
  for (int step = 0; step < 80; ++step) {
    const bool inf = rng() % 6 == 0;
    w.set_grad(ops::full({2}, inf ? kInf : 1.0));
    scaler.step(opt);
    scaler.update();
    lab6::update_scale_(scale, tracker, inf, o.growth_factor, o.backoff_factor, o.growth_interval);
    REQUIRE_MESSAGE(scale == scaler.get_scale(), "step " << step);
    REQUIRE_MESSAGE(tracker == scaler.get_growth_tracker(), "step " << step);
  }
}

TEST_CASE("part 4 (update rule): PyTorch's defaults grow 65536 after exactly 2000 clean steps") {
  const optim::GradScalerOptions o;  // 65536, 2, 0.5, 2000
  double scale = o.init_scale;
  int64_t tracker = 0;
  for (int step = 1; step <= 2000; ++step) {
    lab6::update_scale_(scale, tracker, false, o.growth_factor, o.backoff_factor,
                        o.growth_interval);
    if (step == 1999) REQUIRE(scale == 65536.0);
  }
  CHECK(scale == 131072.0);
  CHECK(tracker == 0);
  lab6::update_scale_(scale, tracker, true, o.growth_factor, o.backoff_factor, o.growth_interval);
  CHECK(scale == 65536.0);
}
