// DDP under Join on W forked ranks (on_ranks, tests/distributed/ddp_scenario.h): uneven inputs,
// with SyncBatchNorm and with a GradScaler, and throw_on_early_termination. The deadlines are
// short because the failure these tests guard against is a hang.
#include <doctest/doctest.h>

#include "ddp_scenario.h"

using namespace ddplab;
using namespace ddplab::testing;
using namespace std::chrono_literals;

namespace {

// Rank r has 5 - r batches inside a Join. Every step's gradients equal one process's on the
// running ranks' rows (the k running ranks' rows, loss scaled by k / W: Note [Join]); nothing
// hangs; the final models are equal. throw_early: throw_on_early_termination, every rank raises.
// kind "bn": with SyncBatchNorm, whose collectives the joined ranks replay.
void join(const std::shared_ptr<ProcessGroup>& pg, bool throw_early, const std::string& kind) {
  const int64_t B = 8;
  auto batches_of = [](int r) { return kSteps - r; };
  // Reference first: its gradients at every step, and its final parameters.
  auto ref = make_seeded(kind, 42);  // bn: BatchNorm2d over the running ranks' rows
  optim::SGD ref_opt(ref->parameters(), sgd_options());
  std::vector<std::vector<Tensor>> ref_grads;
  for (int step = 0; step < kSteps; ++step) {
    int k = 0;
    while (k < g_world && batches_of(k) > step) ++k;
    ref_opt.zero_grad();
    (loss_of(*ref, global_batch(step, g_world * B).rows(0, k * B)) *
     (static_cast<double>(k) / g_world))
        .backward();
    std::vector<Tensor> g;
    for (const Tensor& p : ref->parameters()) g.push_back(ops::clone(p.grad()));
    ref_grads.push_back(g);
    ref_opt.step();
  }

  auto model = make_seeded(kind, 42 + g_rank);
  if (kind == "bn") model = nn::convert_sync_batchnorm(model, pg);  // statistics over all ranks
  DDPOptions o;
  o.reducer.bucket_cap_mb = 0.0001;  // several buckets, interleaved with SyncBatchNorm's all-reduce
  o.reducer.first_bucket_cap_mb = 0.001;
  auto ddp = std::make_shared<DDP>(model, pg, o);
  optim::SGD opt(ddp->parameters(), sgd_options());
  double worst = 0;
  std::string raised;
  try {
    Join join({ddp.get()}, /*enable=*/true, throw_early);
    for (int step = 0; step < batches_of(g_rank); ++step) {
      opt.zero_grad();
      loss_of(*ddp, global_batch(step, g_world * B).rows(g_rank * B, B)).backward();
      // Relative to the step's largest gradient: a conv bias before BatchNorm has a gradient of
      // ~0 (BatchNorm cancels it), which a per-tensor relative error would blow up.
      const std::vector<Tensor> params = ddp->parameters();
      double scale = 1e-30, diff = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        scale = std::max(scale, ops::amax(ops::abs(ref_grads[step][i])).item<double>());
        diff = std::max(diff, ops::max_abs_diff(params[i].grad(), ref_grads[step][i]));
      }
      worst = std::max(worst, diff / scale);
      opt.step();
    }
  } catch (const Error& e) {
    raised = e.what();
  }
  std::cout << "RESULT rank " << g_rank << " batches=" << batches_of(g_rank)
            << " max_rel_grad_diff=" << worst << " raised=" << raised << "\n";
  if (throw_early) {
    check(raised.find("throw_on_early_termination") != std::string::npos,
          "every rank should raise with throw_on_early_termination");
    return;
  }
  check(raised.empty(), "unexpected error: " + raised);
  check(worst <= 1e-5, "a step's gradients differ from the single process's");
  const double final_diff = max_param_diff(*ddp->module(), *ref);
  std::cout << "RESULT rank " << g_rank << " final max_rel_param_diff=" << final_diff << "\n";
  check(final_diff <= 1e-5, "the final model differs from the single process's");
}

// The same uneven batches with a GradScaler in the Join; an inf at step 1 (last rank) and step 4
// (rank 0, the others joined): every rank skips both, the scale and the model equal one process's,
// no hang.
//
// join()'s batches with dynamic loss scaling: the overflow of step 4 is found while the other
// ranks sit in the Join, so they must take part in the found-inf all-reduce (Note [GradScaler
// under Join] in optim/grad_scaler.cpp) to skip it, and to halve their scale, with rank 0.
void join_scaler(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 8;
  auto batches_of = [](int r) { return kSteps - r; };
  optim::GradScalerOptions so;
  so.init_scale = 1024;
  so.growth_interval = 3;  // grows during the shadowed steps too
  // (step, rank) whose loss is multiplied by inf: one step where all run, one where one runs.
  auto poisoned = [](int step, int rank) {
    return (step == 1 && rank == g_world - 1) || (step == 4 && rank == 0);
  };
  const double inf = std::numeric_limits<double>::infinity();

  // Reference: one process on the running ranks' rows, loss scaled by k/W, the same overflows.
  auto ref = make_seeded("mlp", 42);
  optim::SGD ref_opt(ref->parameters(), sgd_options());
  optim::GradScaler ref_scaler(so);
  std::vector<bool> ref_stepped;
  for (int step = 0; step < kSteps; ++step) {
    int k = 0;
    while (k < g_world && batches_of(k) > step) ++k;
    ref_opt.zero_grad();
    Tensor loss = loss_of(*ref, global_batch(step, g_world * B).rows(0, k * B)) *
                  (static_cast<double>(k) / g_world);
    bool poison = false;
    for (int r = 0; r < k; ++r) poison = poison || poisoned(step, r);
    ref_scaler.scale(poison ? loss * inf : loss).backward();
    ref_stepped.push_back(ref_scaler.step(ref_opt));
    ref_scaler.update();
  }
  check(!ref_stepped[1] && !ref_stepped[4], "the reference should skip steps 1 and 4");

  auto ddp = std::make_shared<DDP>(make_seeded("mlp", 42 + g_rank), pg);
  optim::SGD opt(ddp->parameters(), sgd_options());
  optim::GradScaler scaler(so, pg);
  {
    Join join({ddp.get(), &scaler});
    for (int step = 0; step < batches_of(g_rank); ++step) {
      opt.zero_grad();
      Tensor loss = loss_of(*ddp, global_batch(step, g_world * B).rows(g_rank * B, B));
      scaler.scale(poisoned(step, g_rank) ? loss * inf : loss).backward();
      const bool stepped = scaler.step(opt);
      scaler.update();
      check(stepped == ref_stepped[step], "step " + std::to_string(step) + ": stepped " +
                                              std::to_string(stepped) + ", one process " +
                                              std::to_string(ref_stepped[step]));
    }
  }  // the Join's end: the ranks with fewer batches shadow the others' steps here
  std::cout << "RESULT rank " << g_rank << " batches=" << batches_of(g_rank)
            << " scale=" << scaler.get_scale() << " (one process " << ref_scaler.get_scale()
            << ") tracker=" << scaler.get_growth_tracker() << "\n";
  check(scaler.get_scale() == ref_scaler.get_scale() &&
            scaler.get_growth_tracker() == ref_scaler.get_growth_tracker(),
        "the scale or growth tracker differs from the single process's");
  const double final_diff = max_param_diff(*ddp->module(), *ref);
  std::cout << "RESULT rank " << g_rank << " final max_rel_param_diff=" << final_diff << "\n";
  check(final_diff <= 1e-5, "the final model differs from the single process's");

  // Listed first, the scaler would leave the iteration count unissued: it refuses at once.
  bool refused = false;
  {
    Join wrong_order({&scaler, ddp.get()});
    loss_of(*ddp, global_batch(0, g_world * B).rows(g_rank * B, B)).backward();
    try {
      scaler.step(opt);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("list the DDP model first") != std::string::npos;
    }
  }
  check(refused, "a GradScaler first in a Join should be refused");
  scaler.update();
}

}  // namespace

TEST_CASE("DDP Join: uneven inputs finish, every step equals one process") {
  on_ranks(
      2, [](const std::shared_ptr<ProcessGroup>& pg) { join(pg, false, "mlp"); }, 40s);
  on_ranks(
      3, [](const std::shared_ptr<ProcessGroup>& pg) { join(pg, false, "mlp"); }, 40s);
  // With SyncBatchNorm, whose collectives the joined ranks replay.
  on_ranks(
      2, [](const std::shared_ptr<ProcessGroup>& pg) { join(pg, false, "bn"); }, 40s);
  on_ranks(
      3, [](const std::shared_ptr<ProcessGroup>& pg) { join(pg, false, "bn"); }, 40s);
}

TEST_CASE("DDP Join with a GradScaler: the joined ranks share every skip and the scale") {
  on_ranks(
      2, [](const std::shared_ptr<ProcessGroup>& pg) { join_scaler(pg); }, 40s);
  on_ranks(
      3, [](const std::shared_ptr<ProcessGroup>& pg) { join_scaler(pg); }, 40s);
}

TEST_CASE("DDP Join: throw_on_early_termination raises on every rank") {
  on_ranks(
      2, [](const std::shared_ptr<ProcessGroup>& pg) { join(pg, true, "mlp"); }, 40s);
  on_ranks(
      3, [](const std::shared_ptr<ProcessGroup>& pg) { join(pg, true, "mlp"); }, 40s);
}
