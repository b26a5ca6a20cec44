// GradScaler on 2 forked Gloo ranks: the overflow decision is shared (Note [One scale on every
// rank] in optim/grad_scaler.cpp).
//
// Each rank holds the same parameters and sets its gradients by hand (no DDP), so an inf planted
// on ONE rank stays on that rank: only the scaler's all-reduced flag can make the other rank skip.
// Without it, rank 0 would step and halve nothing, and the replicas and scales would diverge.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "ddp/ddp.h"
#include "fork_ranks.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;
using namespace ddplab::testing;

namespace {

// Every element of `t` equal on all ranks (rank 0's copy is broadcast and compared exactly).
bool same_on_every_rank(distributed::ProcessGroup& pg, const Tensor& t) {
  Tensor root = ops::clone(t);
  pg.broadcast(root, 0)->wait();
  return ops::max_abs_diff(root, t) == 0;
}

}  // namespace

TEST_CASE("GradScaler: an inf on one rank makes every rank skip; the scale grows after the run") {
  run_ranks(2, [](int rank, int world, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, world, store);
    std::shared_ptr<distributed::ProcessGroup> group(pg.get(), [](distributed::ProcessGroup*) {});
    optim::GradScalerOptions o;
    o.init_scale = 1024;
    o.growth_interval = 3;  // small, so the test sees a growth
    optim::GradScaler scaler(o, group);

    Tensor w = ops::from_vector<float>({1.0f, -2.0f, 3.0f}, {3});
    w.set_requires_grad(true);
    optim::SGD opt({w}, {0.1});
    // The true gradient is 0.5 everywhere; backward would deliver it multiplied by the scale.
    auto set_scaled_grad = [&](bool plant_inf) {
      Tensor g = ops::full({3}, 0.5 * scaler.get_scale());
      if (plant_inf) {
        std::vector<float> v = g.to_vector<float>();
        v[1] = std::numeric_limits<float>::infinity();
        g = ops::from_vector<float>(v, {3});
      }
      w.set_grad(g);
    };

    // Step 1: rank 1 overflows. Both ranks skip, both halve the scale, nobody's weights move.
    const Tensor before = ops::clone(w);
    set_scaled_grad(/*plant_inf=*/rank == 1);
    const bool stepped = scaler.step(opt);
    scaler.update();
    EXPECT(!stepped, "rank " << rank << " stepped although rank 1 overflowed");
    EXPECT(ops::max_abs_diff(w, before) == 0, "the skipped step changed the weights");
    EXPECT(scaler.get_scale() == 512, "scale " << scaler.get_scale() << ", expected 512");
    EXPECT(scaler.get_growth_tracker() == 0, "tracker " << scaler.get_growth_tracker());
    EXPECT(same_on_every_rank(*pg, w), "weights differ across ranks after the skipped step");

    // Steps 2-4: clean. The scale holds for growth_interval - 1 steps, then doubles.
    const std::vector<double> want_scale = {512, 512, 1024};
    for (int s = 0; s < 3; ++s) {
      set_scaled_grad(false);
      EXPECT(scaler.step(opt), "clean step " << s << " was skipped");
      scaler.update();
      EXPECT(scaler.get_scale() == want_scale[s],
             "after clean step " << s << ": scale " << scaler.get_scale());
    }
    // Three true steps of 0.1 * 0.5: the unscaled gradient reached the optimizer.
    const std::vector<float> got = w.to_vector<float>();
    const std::vector<float> want = {1.0f - 0.15f, -2.0f - 0.15f, 3.0f - 0.15f};
    for (size_t i = 0; i < 3; ++i)
      EXPECT(std::abs(got[i] - want[i]) < 1e-6, "w[" << i << "] = " << got[i] << " vs " << want[i]);
    EXPECT(same_on_every_rank(*pg, w), "weights differ across ranks");
    const Tensor scale_here = ops::full({1}, scaler.get_scale());
    EXPECT(same_on_every_rank(*pg, scale_here), "the scales diverged");

    // A NaN on rank 0 this time: again both skip.
    set_scaled_grad(false);
    if (rank == 0) w.set_grad(ops::full({3}, std::numeric_limits<double>::quiet_NaN()));
    EXPECT(!scaler.step(opt), "rank " << rank << " stepped although rank 0 had a NaN");
    scaler.update();
    EXPECT(scaler.get_scale() == 512, "scale " << scaler.get_scale() << " after the NaN");
    finish(pg, *store);
  });
}

TEST_CASE("clip_grad_norm_ after DDP's backward: the same norm and gradients on every rank") {
  run_ranks(2, [](int rank, int world, const std::shared_ptr<TCPStore>& store) {
    auto pg = make_group(rank, world, store);
    std::shared_ptr<distributed::ProcessGroup> group(pg.get(), [](distributed::ProcessGroup*) {});
    manual_seed(1);  // DDP broadcasts rank 0's weights anyway
    auto net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(8, 3)});
    distributed::DDP ddp(net, group);
    // Different data per rank: the local gradients differ, the averaged ones must not.
    manual_seed(100 + rank);
    const Tensor x = ops::mul(ops::randn({5, 6}), 10.0);
    const Tensor target = ops::from_vector<int64_t>({0, 1, 2, rank, 1 - rank}, {5}, kInt64);
    Tensor loss = F::cross_entropy(ddp(x), target);
    loss.backward();
    const double norm = optim::clip_grad_norm_(ddp.parameters(), /*max_norm=*/0.01);
    EXPECT(norm > 0.01, "the norm " << norm << " is too small to test clipping");
    EXPECT(same_on_every_rank(*pg, ops::full({1}, norm, kFloat64)), "the total norms differ");
    for (const Tensor& p : ddp.parameters())
      EXPECT(same_on_every_rank(*pg, p.grad()), "a clipped gradient differs across ranks");
    // And it was clipped: the norm is now max_norm (to float rounding).
    const double after = optim::clip_grad_norm_(ddp.parameters(), 1e9);
    EXPECT(std::abs(after - 0.01) < 1e-6, "norm after clipping " << after);
    finish(pg, *store);
  });
}
