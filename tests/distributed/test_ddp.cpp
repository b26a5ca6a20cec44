// DistributedDataParallel on CPU with the Gloo group: each case runs a scenario on W forked ranks
// (on_ranks, tests/distributed/ddp_scenario.h) and requires every rank to pass its checks. A
// scenario is one function, declared once, here; it checks its own result on every rank (most
// also train the single-process reference locally: it is small). Lines starting "RESULT " carry
// the numbers, so `meson test -v` prints them.
//
// Why processes and not threads: DDP is a multi-process design (one replica per process). The
// parent only forks (fork_ranks.h says why it must start no thread pool of its own).
#include <doctest/doctest.h>

#include "ddp_scenario.h"

using namespace ddplab;
using namespace ddplab::testing;
using namespace std::chrono_literals;

namespace {

// W ranks x batch B == one process x batch W*B after 5 SGD steps (kind
// "mlp" or "conv"; view: gradient_as_bucket_view)
void equivalence(const std::shared_ptr<ProcessGroup>& pg, const std::string& kind, bool view) {
  const int64_t B = 8;
  DDPOptions o;
  // About 100 bytes: several buckets even for these small models, also after the rebuild in
  // arrival order (conv: fc.weight arrives first and fills bucket 0 alone).
  o.reducer.bucket_cap_mb = 0.0001;
  o.reducer.first_bucket_cap_mb = 0.001;
  o.reducer.gradient_as_bucket_view = view;
  auto ddp = std::make_shared<DDP>(make_seeded(kind, 42 + g_rank), pg, o);
  const double diff = train_and_compare(*ddp, kind, B);
  std::cout << "RESULT buckets=" << ddp->reducer().buckets().size() << " max_rel_diff=" << diff
            << "\n";
  check(ddp->reducer().buckets().size() >= 3, "expected at least 3 buckets");
  check(diff <= 1e-5, "parameters differ from the single-process run: " + std::to_string(diff));
}

// bucket 0's all-reduce launches before the last gradient is ready
void overlap(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 64;
  DDPOptions o;
  o.reducer.bucket_cap_mb = 0.3;  // one 256x256 layer (256 KB) per bucket
  o.reducer.first_bucket_cap_mb = 0.3;
  auto ddp = std::make_shared<DDP>(make_seeded("deep", 7), pg, o);
  optim::SGD opt(ddp->parameters(), sgd_options());
  for (int step = 0; step < 3; ++step) {  // the last iteration's timeline is checked
    opt.zero_grad();
    loss_of(*ddp, global_batch(step, g_world * B).rows(g_rank * B, B)).backward();
    opt.step();
  }
  const IterationTimeline& tl = ddp->reducer().last_iteration_timeline();
  const auto& names = ddp->reducer().param_names();
  size_t last = 0;
  for (size_t i = 0; i < tl.param_ready_ms.size(); ++i) {
    if (tl.param_ready_ms[i] > tl.param_ready_ms[last]) last = i;
  }
  std::cout << "RESULT buckets=" << tl.buckets.size() << " iteration=" << tl.iteration
            << " bucket0_launched_ms=" << tl.buckets[0].launched_ms << " last_grad=" << names[last]
            << " last_grad_ready_ms=" << tl.param_ready_ms[last]
            << " backward_end_ms=" << tl.backward_end_ms << " finalized_ms=" << tl.finalized_ms
            << "\n";
  for (size_t b = 0; b < tl.buckets.size(); ++b) {
    std::cout << "RESULT bucket" << b << " ready=" << tl.buckets[b].ready_ms
              << " launched=" << tl.buckets[b].launched_ms
              << " finished=" << tl.buckets[b].finished_ms << "\n";
    check(tl.buckets[b].ready_ms >= 0 && tl.buckets[b].launched_ms >= tl.buckets[b].ready_ms &&
              tl.buckets[b].finished_ms >= tl.buckets[b].launched_ms,
          "bucket " + std::to_string(b) + " times out of order");
    if (b > 0) {
      check(tl.buckets[b].launched_ms >= tl.buckets[b - 1].launched_ms,
            "buckets launched out of order");
    }
  }
  check(tl.buckets.size() >= 3, "expected at least 3 buckets");
  check(tl.buckets[0].launched_ms < tl.param_ready_ms[last],
        "bucket 0 was not launched before the last gradient was ready");
  check(names[last] == "0.weight" || names[last] == "0.bias",
        "the first layer's gradient should arrive last, got " + names[last]);
}

// an unused parameter: the next forward throws, naming it
void unused_error(const std::shared_ptr<ProcessGroup>& pg) {
  auto ddp = std::make_shared<DDP>(make_seeded("unused", 42), pg);
  const Batch b = global_batch(0, 8 * g_world).rows(8 * g_rank, 8);
  loss_of(*ddp, b).backward();
  std::string msg;
  try {
    loss_of(*ddp, b);
  } catch (const Error& e) {
    msg = e.what();
  }
  std::cout << "RESULT message=" << msg << "\n";
  check(msg.find("module.unused") == std::string::npos, "names must be the inner module's");
  check(msg.find("unused.weight") != std::string::npos, "message lacks unused.weight");
  check(msg.find("unused.bias") != std::string::npos, "message lacks unused.bias");
  check(msg.find("fc1.weight") == std::string::npos, "message names a used parameter");
  check(msg.find("find_unused_parameters") != std::string::npos,
        "message lacks find_unused_parameters");
  check(msg.find("Expected to have finished reduction in the prior iteration") != std::string::npos,
        "message lacks PyTorch's wording");
}

// the same model with find_unused_parameters trains like one process
void unused_flag(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 8;
  DDPOptions o;
  o.find_unused_parameters = true;
  o.reducer.bucket_cap_mb = 0.002;
  o.reducer.first_bucket_cap_mb = 0.001;
  auto ddp = std::make_shared<DDP>(make_seeded("unused", 42 + g_rank), pg, o);
  const double diff = train_and_compare(*ddp, "unused", B);
  auto* m = dynamic_cast<WithUnused*>(ddp->module().get());
  std::cout << "RESULT max_rel_diff=" << diff << "\n";
  check(diff <= 1e-5, "parameters differ from the single-process run");
  check(!m->unused->weight.grad().defined(), "an unused parameter got a gradient");
}

// 3 micro-batches under no_sync + 1 synced == one 4x batch (view:
// gradient_as_bucket_view, .grad zeroed in place)
void no_sync(const std::shared_ptr<ProcessGroup>& pg, bool view) {
  const int64_t B = 4, k = 4;
  DDPOptions o;
  o.reducer.bucket_cap_mb = 0.002;
  o.reducer.first_bucket_cap_mb = 0.001;
  o.reducer.gradient_as_bucket_view = view;
  auto ddp = std::make_shared<DDP>(make_seeded("mlp", 42 + g_rank), pg, o);
  optim::SGD opt(ddp->parameters(), sgd_options());
  for (int step = 0; step < kSteps; ++step) {
    const Batch global = global_batch(step, k * g_world * B);
    opt.zero_grad(/*set_to_none=*/!view);  // with views: .grad stays the bucket slot
    // Micro-batch m of rank r: rows [(m*W + r)*B, +B). Any split works: all rows are summed.
    auto micro = [&](int64_t m) {
      (loss_of(*ddp, global.rows((m * g_world + g_rank) * B, B)) * (1.0 / k)).backward();
    };
    {
      auto guard = ddp->no_sync();
      for (int64_t m = 0; m < k - 1; ++m) {
        micro(m);
        check(!ddp->reducer().reduction_pending(), "no_sync armed the reducer");
      }
    }
    micro(k - 1);
    opt.step();
  }
  auto ref = train_reference("mlp", k * g_world * B);
  const double diff = max_param_diff(*ddp->module(), *ref);
  std::cout << "RESULT max_rel_diff=" << diff << "\n";
  check(diff <= 1e-5, "no_sync accumulation differs from one 4x batch");
}

// rank 1 builds a different layer: construction fails, naming it
void mismatch(const std::shared_ptr<ProcessGroup>& pg) {
  // Rank 1 builds fc2 with 5 outputs instead of 10; rank 2 (if any) also adds a layer.
  class Odd : public nn::Module {
   public:
    explicit Odd(int rank) {
      fc1 = register_module("fc1", std::make_shared<nn::Linear>(kIn, 8));
      fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, rank == 1 ? 5 : kClasses));
      if (rank == 2) register_module("extra", std::make_shared<nn::Linear>(2, 2));
    }
    std::shared_ptr<nn::Linear> fc1, fc2;
  };
  std::string msg;
  try {
    DDP ddp(std::make_shared<Odd>(g_rank), pg);
  } catch (const Error& e) {
    msg = e.what();
  }
  std::cout << "RESULT message=" << msg << "\n";
  check(msg.find("fc2.weight: rank 1 has [5, 8] float32, rank 0 has [10, 8] float32") !=
            std::string::npos,
        "message lacks fc2.weight's shapes");
  check(msg.find("fc2.bias: rank 1 has [5]") != std::string::npos, "message lacks fc2.bias");
  check(msg.find("fc1.weight") == std::string::npos, "message names a matching parameter");
  if (g_world > 2) {
    check(msg.find("rank 2 has param extra.weight [2, 2] float32, which rank 0 lacks") !=
              std::string::npos,
          "message lacks rank 2's extra layer");
  }
}

// BatchNorm running stats equal rank 0's after forward (broadcast), or differ (no
// broadcast: the control)
void buffers(const std::shared_ptr<ProcessGroup>& pg, bool bcast) {
  DDPOptions o;
  o.broadcast_buffers = bcast;
  auto ddp = std::make_shared<DDP>(make_seeded("bn", 42 + g_rank), pg, o);
  auto* m = dynamic_cast<WithBatchNorm*>(ddp->module().get());
  optim::SGD opt(ddp->parameters(), sgd_options());
  // Different data per rank: the local running stats drift apart.
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    loss_of(*ddp, global_batch(step, 8 * g_world).rows(8 * g_rank, 8)).backward();
    opt.step();
  }
  // The same batch everywhere: after this forward each rank holds (the stats it started the
  // forward with) updated by the same batch, so equal stats mean equal starting stats.
  opt.zero_grad();
  loss_of(*ddp, global_batch(99, 8)).backward();
  double diff = 0;
  for (const Tensor& t : {m->bn->running_mean, m->bn->running_var}) {
    Tensor rank0 = ops::clone(t);
    pg->broadcast(rank0, 0)->wait();
    diff = std::max(diff, ops::max_abs_diff(t, rank0));
  }
  Tensor count = ops::clone(m->bn->num_batches_tracked);
  pg->broadcast(count, 0)->wait();
  std::cout << "RESULT broadcast_buffers=" << bcast << " max_abs_diff_to_rank0=" << diff
            << " num_batches_tracked=" << m->bn->num_batches_tracked.item<int64_t>() << "\n";
  if (bcast) {
    check(diff == 0, "running stats differ from rank 0's");
  } else if (g_rank != 0) {
    check(diff > 0, "control: without broadcast_buffers the stats should differ");
  }
  check(count.item<int64_t>() == m->bn->num_batches_tracked.item<int64_t>(),
        "num_batches_tracked differs");
}

// naive_allreduce_grads gives the Reducer's gradients
void naive(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 8;
  DDPOptions o;
  o.reducer.bucket_cap_mb = 0.002;
  o.reducer.first_bucket_cap_mb = 0.001;
  auto ddp = std::make_shared<DDP>(make_seeded("mlp", 42 + g_rank), pg, o);
  auto plain = make_seeded("mlp", 0);
  plain->load_state_dict(ddp->module()->state_dict());  // rank 0's weights, after the broadcast
  const Batch b = global_batch(0, g_world * B).rows(g_rank * B, B);
  loss_of(*ddp, b).backward();
  loss_of(*plain, b).backward();
  naive_allreduce_grads(*plain, *pg);
  auto pa = ddp->module()->named_parameters(), pb = plain->named_parameters();
  double diff = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    diff = std::max(diff, ops::max_rel_error(pa[i].second.grad(), pb[i].second.grad()));
  }
  std::cout << "RESULT max_rel_diff=" << diff << "\n";
  check(diff <= 1e-6, "naive_allreduce_grads and the Reducer disagree");
}

// a model registered in reverse order of use: after step 1 the buckets follow the
// arrival order, bucket 0 launches after fewer gradients than with the static layout, and training
// equals one process (view: gradient_as_bucket_view, whose .grad views must move)
void rebuild(const std::shared_ptr<ProcessGroup>& pg, bool view) {
  const int64_t B = 64;  // a backward of a few ms, so the reported times mean something
  int64_t grads_before_launch[2] = {0, 0};
  double launch_ms[2] = {0, 0};
  for (bool rebuild_on : {false, true}) {
    DDPOptions o;
    o.reducer.bucket_cap_mb = 0.3;  // about one 256x256 layer per bucket
    o.reducer.first_bucket_cap_mb = 0.3;
    o.reducer.gradient_as_bucket_view = view;
    o.reducer.rebuild_buckets = rebuild_on;
    auto ddp = std::make_shared<DDP>(make_seeded("reversed", 42 + g_rank), pg, o);
    const Reducer& reducer = ddp->reducer();
    const std::vector<Bucket> static_layout = reducer.buckets();
    optim::SGD opt(ddp->parameters(), sgd_options());
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad(/*set_to_none=*/!view);  // with views, keep .grad a view (docs/ddp.md)
      loss_of(*ddp, global_batch(step, g_world * B).rows(g_rank * B, B)).backward();
      check(reducer.buckets_rebuilt() == rebuild_on, "buckets_rebuilt() after a step");
      opt.step();
    }
    auto ref = train_reference("reversed", g_world * B);
    const double diff = max_param_diff(*ddp->module(), *ref);
    const IterationTimeline& tl = reducer.last_iteration_timeline();
    const auto& names = reducer.param_names();
    std::string bucket0;
    for (size_t i : reducer.buckets()[0].params) bucket0 += names[i] + " ";
    grads_before_launch[rebuild_on] = tl.buckets[0].grads_ready_at_launch;
    launch_ms[rebuild_on] = tl.buckets[0].launched_ms;
    std::cout << "RESULT " << (rebuild_on ? "rebuilt" : "static")
              << " buckets=" << reducer.buckets().size() << " bucket0=[ " << bucket0
              << "] grads_ready_at_bucket0_launch=" << tl.buckets[0].grads_ready_at_launch << "/"
              << names.size() << " bucket0_launched_ms=" << tl.buckets[0].launched_ms
              << " backward_end_ms=" << tl.backward_end_ms << " max_rel_diff=" << diff << "\n";
    check(diff <= 1e-5, "parameters differ from the single-process run: " + std::to_string(diff));
    if (!rebuild_on) continue;
    // Bucket 0 now holds the last layer (the first gradients of backward), as rank 0 saw them.
    check(bucket0.find("fc5.weight") != std::string::npos &&
              bucket0.find("fc5.bias") != std::string::npos &&
              bucket0.find("fc0.") == std::string::npos,
          "rebuilt bucket 0 should hold fc5, not fc0: " + bucket0);
    check(static_layout[0].params != reducer.buckets()[0].params, "the layout did not change");
    if (view) {  // every .grad must be a view into the NEW buckets
      for (const Bucket& b : reducer.buckets()) {
        for (size_t k = 0; k < b.params.size(); ++k) {
          // A copy, not a reference: named_parameters() returns a temporary vector.
          const Tensor p = ddp->module()->named_parameters()[b.params[k]].second;
          check(p.grad().data_ptr<float>() == b.views[k].data_ptr<float>(),
                names[b.params[k]] + ".grad is not a view into its rebuilt bucket");
        }
      }
    }
  }
  check(grads_before_launch[1] < grads_before_launch[0],
        "with rebuilt buckets, bucket 0 should launch after fewer gradients");
  std::cout << "RESULT first_launch static: " << grads_before_launch[0] << " grads, "
            << launch_ms[0] << " ms; rebuilt: " << grads_before_launch[1] << " grads, "
            << launch_ms[1] << " ms\n";
}

// a model wrapped in DDP, unwrapped, wrapped again: one set of hooks, the same training as
// one process
void rewrap(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 8;
  DDPOptions o;
  o.reducer.bucket_cap_mb = 0.002;
  o.reducer.first_bucket_cap_mb = 0.001;
  auto model = make_seeded("mlp", 42 + g_rank);
  const Batch first_batch = global_batch(0, g_world * B).rows(g_rank * B, B);
  Tensor orphan_loss;
  {
    DDP first(model, pg, o);
    loss_of(first, first_batch).backward();
    orphan_loss = loss_of(first, first_batch);  // a graph built under `first`...
  }
  orphan_loss.backward();  // ...backpropagated after it is gone: its hooks must not fire
  auto ddp = std::make_shared<DDP>(model, pg, o);
  size_t most_hooks = 0;
  for (const Tensor& p : model->parameters()) {
    most_hooks = std::max(most_hooks, autograd::autograd_meta(p).post_accumulate_hooks.size());
  }
  const double diff = train_and_compare(*ddp, "mlp", B);
  std::cout << "RESULT hooks_per_parameter=" << most_hooks << " max_rel_diff=" << diff << "\n";
  check(most_hooks == 1, "the first DDP's hooks are still installed");
  check(diff <= 1e-5, "parameters differ from the single-process run: " + std::to_string(diff));
}

// a training forward without backward, then normal steps: no error, and the same
// training as one process
void forward_only(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 8;
  auto ddp = small_bucket_mlp(pg);
  // An evaluation with grad mode on: the Reducer is armed, no backward follows.
  loss_of(*ddp, global_batch(50, g_world * B).rows(g_rank * B, B));
  check(ddp->reducer().reduction_pending(), "the training forward should arm the reducer");
  const double diff = train_and_compare(*ddp, "mlp", B);  // forwards again: must not throw
  std::cout << "RESULT max_rel_diff=" << diff << "\n";
  check(diff <= 1e-5, "parameters differ from the single-process run: " + std::to_string(diff));
}

}  // namespace

TEST_CASE("DDP on W ranks equals one process on a W times larger batch") {
  SUBCASE("mlp, 2 ranks") {
    on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { equivalence(pg, "mlp", false); });
  }
  SUBCASE("mlp, 3 ranks") {
    on_ranks(3, [](const std::shared_ptr<ProcessGroup>& pg) { equivalence(pg, "mlp", false); });
  }
  SUBCASE("conv, 2 ranks") {
    on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { equivalence(pg, "conv", false); });
  }
  SUBCASE("mlp, 3 ranks, gradient_as_bucket_view") {
    on_ranks(3, [](const std::shared_ptr<ProcessGroup>& pg) { equivalence(pg, "mlp", true); });
  }
}

TEST_CASE("DDP overlaps: bucket 0 is launched before the last gradient is ready") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { overlap(pg); });
}

TEST_CASE("DDP names unused parameters and suggests find_unused_parameters") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { unused_error(pg); });
}

TEST_CASE("DDP with find_unused_parameters trains like one process") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { unused_flag(pg); });
  on_ranks(3, [](const std::shared_ptr<ProcessGroup>& pg) { unused_flag(pg); });
}

TEST_CASE("DDP no_sync: 3 local micro-batches + 1 synced equal one 4x batch") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { no_sync(pg, false); });
  // gradient_as_bucket_view: .grad zeroed in place
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { no_sync(pg, true); });
}

TEST_CASE("DDP construction lists the parameters whose shapes differ across ranks") {
  on_ranks(3, [](const std::shared_ptr<ProcessGroup>& pg) { mismatch(pg); });
}

TEST_CASE("DDP broadcast_buffers makes BatchNorm running stats rank 0's") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { buffers(pg, true); });
  // The control: without the broadcast they drift apart.
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { buffers(pg, false); });
}

TEST_CASE("naive_allreduce_grads gives the Reducer's gradients") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { naive(pg); });
  on_ranks(3, [](const std::shared_ptr<ProcessGroup>& pg) { naive(pg); });
}

TEST_CASE("DDP rebuilds its buckets in gradient arrival order after the first iteration") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { rebuild(pg, false); });
  // gradient_as_bucket_view: the .grad views move with the buckets.
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { rebuild(pg, true); });
}

TEST_CASE("DDP removes its hooks: wrapping a model again leaves one set") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { rewrap(pg); });
}

TEST_CASE("DDP: a training forward without backward does not poison the next iteration") {
  on_ranks(2, [](const std::shared_ptr<ProcessGroup>& pg) { forward_only(pg); });
}
