// Lab 5's grader. Each TEST_CASE is one point of the part its name starts with (scripts/lab).
// The oracle is the library on the GLOBAL batch: every rank builds the same global batch from a
// seed, runs BatchNorm2d (and autograd) on all of it in one process, and compares what your code
// computes from its own rows only. (BatchNorm2d with momentum 1 leaves the batch's mean and
// unbiased variance in its running buffers: that is how the statistics are read off it; part 1
// takes them in float64 by their definition, for values too large for float32.) Part 4
// compares your layer with the library's nn::SyncBatchNorm. Collectives are counted with the
// group's sequence number, which every collective advances by one.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "fork_ranks.h"
#include "models/simple.h"
#include "nn/sync_batchnorm.h"
#include "sync_bn_lab.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;
using namespace ddplab::testing;

namespace {

constexpr double kEps = 1e-5;

// "" when max |got - want| <= tol * max(1, max |want|) (relative for large values, absolute near
// 0), else what is wrong.
std::string mismatch(const Tensor& got, const Tensor& want, const std::string& what, double tol) {
  if (!got.defined()) return what + ": undefined";
  if (got.shape() != want.shape())
    return what + ": shape " + shape_str(got.shape()) + ", expected " + shape_str(want.shape());
  if (want.numel() == 0) return "";
  const Tensor g = ops::to(got, kFloat64), w = ops::to(want, kFloat64);
  const double scale = std::max(1.0, ops::amax(ops::abs(w)).item<double>());
  const double err = ops::max_abs_diff(g, w);
  if (err <= tol * scale) return "";
  return what + ": off by " + std::to_string(err) + " (scale " + std::to_string(scale) + ")";
}

// In a forked rank: a mismatch fails the rank (fork_ranks.h's EXPECT).
void expect_near(const Tensor& got, const Tensor& want, const std::string& what,
                 double tol = 1e-6) {
  const std::string wrong = mismatch(got, want, what, tol);
  EXPECT(wrong.empty(), wrong);
}

// The global batch, split by rows: rank r holds rows [first(r), first(r) + sizes[r]).
struct Split {
  std::vector<int64_t> sizes;
  int64_t first(int rank) const {
    int64_t at = 0;
    for (int r = 0; r < rank; ++r) at += sizes[static_cast<size_t>(r)];
    return at;
  }
  int64_t total() const { return first(static_cast<int>(sizes.size())); }
  Tensor mine(const Tensor& global, int rank) const {
    return ops::contiguous(ops::narrow(global, 0, first(rank), sizes[static_cast<size_t>(rank)]));
  }
};

// The statistics of x [N, C, H, W] as BatchNorm2d computes them (the oracle), as BatchStats.
lab5::BatchStats reference_stats(const Tensor& x) {
  nn::BatchNorm2d bn(x.size(1), kEps, /*momentum=*/1.0);
  autograd::NoGradGuard no_grad;
  bn(ops::to(x, kFloat32));
  const int64_t count = x.numel() / x.size(1);
  // BatchNorm2d's buffers are float32; the grader's own float64 statistics of the same values
  // are taken below where float32 would not be precise enough.
  return {ops::to(bn.running_mean, kFloat64),
          ops::mul(ops::to(bn.running_var, kFloat64), double(count - 1) / double(count)), count};
}

// The definition, for part 1's float64 batches (values near 1e8 do not fit BatchNorm2d's float32):
// the mean, then the mean squared deviation from it, two passes in float64.
lab5::BatchStats exact_stats(const Tensor& x) {
  const Tensor mean = ops::mean(x, {0, 2, 3});
  const Tensor dev = ops::sub(x, ops::reshape(mean, {1, x.size(1), 1, 1}));
  return {mean, ops::mean(ops::square(dev), {0, 2, 3}), x.numel() / x.size(1)};
}

// The group as a shared_ptr, which the layers hold.
std::shared_ptr<distributed::ProcessGroup> group(int rank, int world,
                                                 const std::shared_ptr<TCPStore>& store) {
  return make_group(rank, world, store);
}

// Ends a case: every rank is done with the group before any tears it down.
void leave(std::shared_ptr<distributed::ProcessGroup>& pg, Store& store) {
  store_sync(store, "leave", pg->rank(), pg->size());
  pg.reset();
}

// --- part 1 ----------------------------------------------------------------------------------

// Each rank's global_batch_stats on its rows equals the statistics of the global batch, with
// exactly one collective.
void check_stats(const Split& split, double mean, double spread, double shift_offset) {
  run_ranks(static_cast<int>(split.sizes.size()), [&](int rank, int world, const auto& store) {
    auto pg = group(rank, world, store);
    manual_seed(5);
    const Tensor global =
        ops::add(ops::mul(ops::randn({split.total(), 3, 4, 5}, kFloat64), spread), mean);
    const lab5::BatchStats want = exact_stats(global);
    // A shift every rank agrees on, near the mean but not at it: shift_offset spreads away.
    const Tensor shift = ops::add(want.mean, shift_offset * spread);
    const uint64_t before = pg->sequence_number();
    const lab5::BatchStats got = lab5::global_batch_stats(split.mine(global, rank), shift, *pg);
    EXPECT(pg->sequence_number() - before == 1, "global_batch_stats issued "
                                                    << pg->sequence_number() - before
                                                    << " collectives, expected exactly 1");
    EXPECT(got.count == want.count, "count " << got.count << ", expected " << want.count);
    expect_near(got.mean, want.mean, "mean", 1e-9);
    // Relative to the variance itself: the spread is tiny next to the mean in the last case.
    expect_near(ops::div(got.var, spread * spread), ops::div(want.var, spread * spread),
                "variance / spread^2", 1e-7);
    leave(pg, *store);
  });
}

TEST_CASE("part 1 (forward statistics): 2 ranks with batches 3 and 5") {
  check_stats({{3, 5}}, 2.0, 3.0, 0.5);
}

TEST_CASE("part 1 (forward statistics): 3 ranks with batches 4 and 0 and 1 (an empty rank)") {
  check_stats({{4, 0, 1}}, -1.0, 0.5, -2.0);
}

TEST_CASE("part 1 (forward statistics): values near 1e8 with spread 1 need the shift") {
  // Without the shift, sum(x^2) / M - mean^2 subtracts two numbers near 1e16 whose float64
  // rounding (about 1 each) is as large as the variance itself.
  check_stats({{2, 3}}, 1e8, 1.0, 3.0);
}

// --- part 2 ----------------------------------------------------------------------------------

TEST_CASE("part 2 (normalize and running stats): normalize equals BatchNorm2d's output") {
  manual_seed(11);
  const Tensor x = ops::add(ops::mul(ops::randn({6, 4, 3, 3}), 2.0), 1.0);
  nn::BatchNorm2d bn(4, kEps);
  ops::copy_(bn.weight, ops::rand({4}));
  ops::copy_(bn.bias, ops::randn({4}));
  autograd::NoGradGuard no_grad;
  const Tensor want = bn(x);
  const Tensor got =
      lab5::normalize(ops::to(x, kFloat64), reference_stats(x), ops::to(bn.weight, kFloat64),
                      ops::to(bn.bias, kFloat64), kEps);
  const std::string wrong = mismatch(got, want, "normalize", 1e-5);
  CHECK_MESSAGE(wrong.empty(), wrong);
}

TEST_CASE("part 2 (normalize and running stats): three updates equal BatchNorm2d's buffers") {
  manual_seed(12);
  nn::BatchNorm2d bn(3, kEps, /*momentum=*/0.3);
  Tensor mean = ops::zeros({3}, kFloat64), var = ops::ones({3}, kFloat64);  // BatchNorm2d's start
  autograd::NoGradGuard no_grad;
  for (int64_t n : {2, 7, 1}) {  // batch 1 of 2x2 images: count 4, Bessel's factor 4/3 matters
    const Tensor x = ops::add(ops::mul(ops::randn({n, 3, 2, 2}), 3.0), 4.0);
    bn(x);
    lab5::update_running_stats(mean, var, reference_stats(x), 0.3);
  }
  const std::string mean_wrong = mismatch(mean, bn.running_mean, "running_mean", 1e-5);
  CHECK_MESSAGE(mean_wrong.empty(), mean_wrong);
  const std::string var_wrong = mismatch(var, bn.running_var, "running_var (unbiased)", 1e-5);
  CHECK_MESSAGE(var_wrong.empty(), var_wrong);
}

// --- part 3 ----------------------------------------------------------------------------------

// The loss sum(Y * G) over the global batch, split by rows: on each rank, dx equals its rows of
// the single-process gradient, and dweight, dbias SUMMED over ranks equal the single-process ones.
void check_backward(const Split& split) {
  run_ranks(static_cast<int>(split.sizes.size()), [&](int rank, int world, const auto& store) {
    auto pg = group(rank, world, store);
    manual_seed(21);
    const Tensor X = ops::add(ops::mul(ops::randn({split.total(), 3, 3, 4}), 1.5), 0.5);
    const Tensor G = ops::randn({split.total(), 3, 3, 4});
    nn::BatchNorm2d ref(3, kEps);
    ops::copy_(ref.weight, ops::add(ops::rand({3}), 0.5));
    ops::copy_(ref.bias, ops::randn({3}));
    Tensor Xg = ops::clone(X);
    Xg.set_requires_grad(true);
    sum(mul(ref(Xg), G)).backward();

    const uint64_t before = pg->sequence_number();
    const lab5::BackwardResult got = lab5::sync_batch_norm_backward(
        ops::to(split.mine(G, rank), kFloat64), ops::to(split.mine(X, rank), kFloat64),
        reference_stats(X), ops::to(ref.weight, kFloat64), kEps, *pg);
    EXPECT(pg->sequence_number() - before == 1, "sync_batch_norm_backward issued "
                                                    << pg->sequence_number() - before
                                                    << " collectives, expected exactly 1");
    expect_near(got.dx, split.mine(Xg.grad(), rank), "dx (this rank's rows)", 1e-5);
    for (const auto& [local, want, name] : {std::tuple{got.dweight, ref.weight.grad(), "dweight"},
                                            std::tuple{got.dbias, ref.bias.grad(), "dbias"}}) {
      EXPECT(local.defined(), name << ": undefined");
      Tensor summed = ops::clone(ops::to(local, kFloat64));
      pg->all_reduce(summed)->wait();  // after the counted collective
      expect_near(summed, want, std::string(name) + " summed over ranks", 1e-5);
    }
    leave(pg, *store);
  });
}

TEST_CASE("part 3 (backward): 2 ranks with batches 2 and 5") {
  check_backward({{2, 5}});
}

TEST_CASE("part 3 (backward): 3 ranks with batches 3 and 1 and 0 (an empty rank)") {
  check_backward({{3, 1, 0}});
}

// --- part 4 ----------------------------------------------------------------------------------

// The same SmallCNN three times: converted to your layer, to the library's, and plain for the
// single-process reference on the global batch.
struct Twins {
  std::shared_ptr<models::SmallCNN> yours, library, plain;
};
Twins make_twins(const std::shared_ptr<distributed::ProcessGroup>& pg) {
  Twins t;
  for (auto* m : {&t.yours, &t.library, &t.plain}) {
    manual_seed(0);
    *m = std::make_shared<models::SmallCNN>(10, 1, 8);  // 8x8 images: fast
  }
  EXPECT(lab5::convert_sync_batchnorm(t.yours, pg) == 2, "expected 2 layers converted");
  nn::convert_sync_batchnorm(t.library, pg);
  return t;
}

// Forward and backward of each model on this rank's rows; the collectives each model issued.
uint64_t step(nn::Module& model, const Tensor& x, distributed::ProcessGroup& pg) {
  const uint64_t before = pg.sequence_number();
  sum(square(model(x))).backward();
  return pg.sequence_number() - before;
}

void check_layer(const Split& split) {
  run_ranks(static_cast<int>(split.sizes.size()), [&](int rank, int world, const auto& store) {
    std::shared_ptr<distributed::ProcessGroup> pg = group(rank, world, store);
    const Twins t = make_twins(pg);
    manual_seed(31);
    const Tensor X = ops::randn({split.total(), 1, 8, 8});
    const Tensor x = split.mine(X, rank);
    const uint64_t yours = step(*t.yours, x, *pg), library = step(*t.library, x, *pg);
    EXPECT(yours == library && yours == 4,
           "one forward and backward of SmallCNN issued "
               << yours << " collectives with your layer, " << library
               << " with the library's; expected 4 (2 layers, 1 forward + 1 backward each)");
    const auto mine = t.yours->named_parameters(), lib = t.library->named_parameters();
    for (size_t i = 0; i < mine.size(); ++i)
      expect_near(mine[i].second.grad(), lib[i].second.grad(), mine[i].first + ".grad", 1e-4);
    const auto my_bufs = t.yours->named_buffers(), lib_bufs = t.library->named_buffers();
    for (size_t i = 0; i < my_bufs.size(); ++i)
      expect_near(my_bufs[i].second, lib_bufs[i].second, my_bufs[i].first, 1e-5);
    // The single process on the global batch: the same running statistics.
    t.plain->forward(X);
    expect_near(t.yours->bn2->running_var, t.plain->bn2->running_var,
                "bn2.running_var vs one "
                "process on the global batch",
                1e-5);

    // Eval: the running statistics, no communication, the same outputs as the library's.
    t.yours->eval();
    t.library->eval();
    autograd::NoGradGuard no_grad;
    const uint64_t before = pg->sequence_number();
    const Tensor y_eval = t.yours->forward(x);
    EXPECT(pg->sequence_number() == before, "eval forward communicated");
    expect_near(y_eval, t.library->forward(x), "eval output", 1e-5);
    leave(pg, *store);
  });
}

TEST_CASE("part 4 (the layer): SmallCNN with your layer equals nn::SyncBatchNorm on 2 ranks") {
  check_layer({{3, 2}});
}

TEST_CASE("part 4 (the layer): the same on 3 ranks with batches 1 and 4 and 2") {
  check_layer({{1, 4, 2}});
}

}  // namespace
