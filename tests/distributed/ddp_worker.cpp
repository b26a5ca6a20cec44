// ddp_worker: one rank of a DDP test job (tests/distributed/test_ddp.cpp starts W of them).
//
//   ddp_worker SCENARIO RANK WORLD STORE_PORT [ARGS...]
//
// Each process joins a Gloo group through the TCPStore the test hosts on 127.0.0.1:STORE_PORT,
// runs SCENARIO, checks its own result (most scenarios also train the single-process reference
// locally: it is small) and exits 0 on success, 1 on a failed check. Lines starting "RESULT "
// on stdout carry numbers the test reports; failures are explained on stderr.
//
// Scenarios:
//   equivalence KIND VIEW  W ranks x batch B == one process x batch W*B after 5 SGD steps
//                          (KIND mlp|conv; VIEW 1: gradient_as_bucket_view)
//   overlap                bucket 0's all-reduce launches before the last gradient is ready
//   unused_error           an unused parameter: the next forward throws, naming it
//   unused_flag            the same model with find_unused_parameters trains like one process
//   no_sync [VIEW]         3 micro-batches under no_sync + 1 synced == one 4x batch
//                          (VIEW 1: gradient_as_bucket_view, .grad zeroed in place)
//   mismatch               rank 1 builds a different layer: construction fails, naming it
//   buffers BCAST          BatchNorm running stats equal rank 0's after forward (BCAST 1), or
//                          differ (BCAST 0: the control)
//   naive                  naive_allreduce_grads gives the Reducer's gradients
//   rebuild VIEW           a model registered in reverse order of use: after step 1 the buckets
//                          follow the arrival order, bucket 0 launches after fewer gradients than
//                          with the static layout, and training equals one process
//                          (VIEW 1: gradient_as_bucket_view, whose .grad views must move)
//   rewrap                 a model wrapped in DDP, unwrapped, wrapped again: one set of hooks,
//                          the same training as one process
//   forward_only           a training forward without backward, then normal steps: no error, and
//                          the same training as one process
//   hook_calls             a custom communication hook is called once per bucket per step, and
//                          (delegating to allreduce_hook) trains like one process
//   compress fp16|bf16     the 16-bit hooks give gradients close to plain averaging, half the bytes
//   powersgd_hand          PowerSGD rank 1 on a 4x3 gradient, computed by hand: P, Q, the result,
//                          the error feedback, warm start in step 2; the naive hook agrees
//   powersgd_bytes         resnet20: bytes all-reduced per step, PowerSGD rank 2 vs plain; the
//                          replicas stay identical
//   join THROW [KIND]      rank r has 5 - r batches inside a Join; every step's gradients equal one
//                          process on the running ranks' batches (times k/W); no hang; the final
//                          models equal (THROW 1: throw_on_early_termination, every rank raises;
//                          KIND bn: with SyncBatchNorm, which the joined ranks replay)
//   join_scaler            the same uneven batches with a GradScaler in the Join; an inf at step 1
//                          (last rank) and step 4 (rank 0, the others joined): every rank skips
//                          both, the scale and the model equal one process's, no hang
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "comm/join.h"
#include "comm/process_group_gloo.h"
#include "comm/store/store.h"
#include "ddp/comm_hooks/default_hooks.h"
#include "ddp/comm_hooks/powerSGD_hook.h"
#include "ddp/ddp.h"
#include "ddp/naive_allreduce_grads.h"
#include "models/models.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/sync_batchnorm.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/threads.h"

using namespace ddplab;
using namespace ddplab::distributed;

namespace {

constexpr int kSteps = 5;
constexpr int64_t kIn = 16, kClasses = 10;

int g_rank = 0, g_world = 1;
bool g_failed = false;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "rank " << g_rank << ": CHECK FAILED: " << what << "\n";
    g_failed = true;
  }
}

// --- models ----------------------------------------------------------------------------------

std::shared_ptr<nn::Module> make_mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(kIn, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, kClasses)});
}

// Input [N, 16] seen as a 1x4x4 image.
class TinyConv : public nn::Module {
 public:
  TinyConv() {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1));
    fc = register_module("fc", std::make_shared<nn::Linear>(4 * 4 * 4, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = nn::functional::relu(conv->forward(reshape(x, {x.size(0), 1, 4, 4})));
    return fc->forward(reshape(h, {x.size(0), 4 * 4 * 4}));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::Linear> fc;
};

// Wide and deep enough that backward takes a few milliseconds, so overlap is measurable.
std::shared_ptr<nn::Module> make_deep() {
  std::vector<nn::ModulePtr> layers{std::make_shared<nn::Linear>(kIn, 256),
                                    std::make_shared<nn::ReLU>()};
  for (int i = 0; i < 6; ++i) {
    layers.push_back(std::make_shared<nn::Linear>(256, 256));
    layers.push_back(std::make_shared<nn::ReLU>());
  }
  layers.push_back(std::make_shared<nn::Linear>(256, kClasses));
  return std::make_shared<nn::Sequential>(layers);
}

// `unused` is registered between the used layers and never called in forward.
class WithUnused : public nn::Module {
 public:
  WithUnused() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kIn, 32));
    unused = register_module("unused", std::make_shared<nn::Linear>(32, 32));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    return fc2->forward(nn::functional::relu(fc1->forward(x)));
  }
  std::shared_ptr<nn::Linear> fc1, unused, fc2;
};

class WithBatchNorm : public nn::Module {
 public:
  WithBatchNorm() {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1));
    // Bound, so that convert_sync_batchnorm re-points `bn` at the SyncBatchNorm (nn/module.h).
    register_module("bn", bn, std::make_shared<nn::BatchNorm2d>(4));
    fc = register_module("fc", std::make_shared<nn::Linear>(4 * 4 * 4, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = bn->forward(conv->forward(reshape(x, {x.size(0), 1, 4, 4})));
    return fc->forward(reshape(nn::functional::relu(h), {x.size(0), 4 * 4 * 4}));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Linear> fc;
};

// Registered last layer first, used first layer first: reverse registration order (the static
// bucket layout) puts the gradients that arrive LAST into bucket 0 (Note [Rebuilding buckets]).
class ReverseRegistered : public nn::Module {
 public:
  static constexpr int kLayers = 6;
  ReverseRegistered() {
    layers.resize(kLayers);
    for (int i = kLayers - 1; i >= 0; --i) {
      const int64_t in = i == 0 ? kIn : 256, out = i == kLayers - 1 ? kClasses : 256;
      layers[i] = register_module("fc" + std::to_string(i), std::make_shared<nn::Linear>(in, out));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (int i = 0; i < kLayers; ++i) {
      h = layers[i]->forward(h);
      if (i + 1 < kLayers) h = nn::functional::relu(h);
    }
    return h;
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};

std::shared_ptr<nn::Module> make(const std::string& kind) {
  if (kind == "mlp") return make_mlp();
  if (kind == "conv") return std::make_shared<TinyConv>();
  if (kind == "deep") return make_deep();
  if (kind == "unused") return std::make_shared<WithUnused>();
  if (kind == "bn") return std::make_shared<WithBatchNorm>();
  if (kind == "reversed") return std::make_shared<ReverseRegistered>();
  throw Error("unknown model " + kind);
}

// Every rank initialises differently (seed + rank): DDP's broadcast must make them equal.
std::shared_ptr<nn::Module> make_seeded(const std::string& kind, uint64_t seed) {
  manual_seed(seed);
  return make(kind);
}

// --- data: global batch `step` of `rows` rows, the same on every rank ---------------------------

struct Batch {
  Tensor x, y;
  Batch rows(int64_t lo, int64_t n) const {
    return {ops::contiguous(ops::narrow(x, 0, lo, n)), ops::contiguous(ops::narrow(y, 0, lo, n))};
  }
};

Batch global_batch(int step, int64_t rows) {
  Generator gen(1000 + step);
  return {ops::randn({rows, kIn}, kFloat32, &gen), ops::randint(0, kClasses, {rows}, &gen)};
}

optim::SGDOptions sgd_options() {
  optim::SGDOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 1e-4;
  return o;
}

Tensor loss_of(nn::Module& m, const Batch& b) {
  return nn::functional::cross_entropy(m.forward(b.x), b.y);
}

// The single-process reference: batch = the whole global batch.
std::shared_ptr<nn::Module> train_reference(const std::string& kind, int64_t global_rows) {
  auto model = make_seeded(kind, 42);
  optim::SGD opt(model->parameters(), sgd_options());
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    loss_of(*model, global_batch(step, global_rows)).backward();
    opt.step();
  }
  return model;
}

// max over parameters of max|a - b| / max|b|; names are matched in order.
double max_param_diff(const nn::Module& a, const nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i)
    worst = std::max(worst, ops::max_rel_error(pa[i].second, pb[i].second));
  return worst;
}

// Trains `ddp` for kSteps, each rank on its B rows of every global batch, and returns how far its
// parameters end from the single-process reference trained on the whole batches.
double train_and_compare(DDP& ddp, const std::string& kind, int64_t B) {
  optim::SGD opt(ddp.parameters(), sgd_options());
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    loss_of(ddp, global_batch(step, g_world * B).rows(g_rank * B, B)).backward();
    opt.step();
  }
  return max_param_diff(*ddp.module(), *train_reference(kind, g_world * B));
}

std::shared_ptr<ProcessGroup> connect(int port) {
  auto store = std::make_shared<TCPStore>("127.0.0.1", port, false, std::chrono::seconds(60));
  GlooOptions o;
  o.timeout = std::chrono::seconds(60);
  return std::make_shared<ProcessGroupGloo>(store, g_rank, g_world, o);
}

// --- scenarios --------------------------------------------------------------------------------

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

// The mlp of rank-dependent init (DDP must broadcast) in buckets of about 2 KB: several buckets.
std::shared_ptr<DDP> small_bucket_mlp(const std::shared_ptr<ProcessGroup>& pg) {
  DDPOptions o;
  o.reducer.bucket_cap_mb = 0.002;
  o.reducer.first_bucket_cap_mb = 0.001;
  return std::make_shared<DDP>(make_seeded("mlp", 42 + g_rank), pg, o);
}

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

// Counts calls by bucket, then averages like the default hook.
struct CountingState : CommHookState {
  using CommHookState::CommHookState;
  std::vector<size_t> current;             // bucket indices hooked in this step so far
  std::vector<std::vector<size_t>> steps;  // ... in every finished step (ended by is_last)
};

void hook_calls(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 8;
  auto ddp = small_bucket_mlp(pg);
  auto state = std::make_shared<CountingState>(pg);
  ddp->register_comm_hook(state, [](CountingState& s, GradBucket& b) {
    s.current.push_back(b.index());
    if (b.is_last()) s.steps.push_back(std::move(s.current)), s.current.clear();
    return allreduce_hook(s, b);
  });
  const size_t static_buckets = ddp->reducer().buckets().size();
  std::string twice;
  try {
    ddp->register_comm_hook(std::make_shared<CommHookState>(pg), allreduce_hook);
  } catch (const Error& e) {
    twice = e.what();
  }
  const double diff = train_and_compare(*ddp, "mlp", B);
  const size_t buckets = ddp->reducer().buckets().size();  // after the rebuild of step 1
  std::string calls;
  for (const auto& step : state->steps) {
    calls += "[";
    for (size_t b : step) calls += " " + std::to_string(b);
    calls += " ] ";
  }
  std::cout << "RESULT buckets static=" << static_buckets << " rebuilt=" << buckets
            << " hooked per step: " << calls
            << "bytes/step=" << ddp->reducer().bytes_all_reduced_last_iteration()
            << " max_rel_diff=" << diff << "\n";
  check(buckets >= 3, "expected several buckets");
  check(state->steps.size() == static_cast<size_t>(kSteps) && state->current.empty(),
        "is_last() should end every step once");
  for (size_t step = 0; step < state->steps.size(); ++step) {
    std::vector<size_t> expected(step == 0 ? static_buckets : buckets);
    for (size_t b = 0; b < expected.size(); ++b) expected[b] = b;
    check(state->steps[step] == expected,
          "step " + std::to_string(step) + " did not hook every bucket once, in order");
  }
  check(twice.find("only once") != std::string::npos, "a second registration must fail");
  int64_t numel = 0;
  for (const Tensor& p : ddp->parameters()) numel += p.numel();
  check(ddp->reducer().bytes_all_reduced_last_iteration() == numel * 4,
        "the default hook all-reduces every gradient once");
  check(diff <= 1e-5, "parameters differ from the single-process run: " + std::to_string(diff));
}

// One step of `kind` on this rank's rows; returns the DDP-averaged gradients (flattened).
std::vector<Tensor> one_step_grads(DDP& ddp) {
  const int64_t B = 8;
  loss_of(ddp, global_batch(0, g_world * B).rows(g_rank * B, B)).backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : ddp.parameters()) grads.push_back(ops::clone(p.grad()));
  return grads;
}

void compress(const std::shared_ptr<ProcessGroup>& pg, const std::string& dtype) {
  auto plain = std::make_shared<DDP>(make_seeded("conv", 42), pg);
  auto hooked = std::make_shared<DDP>(make_seeded("conv", 42), pg);
  hooked->register_comm_hook(std::make_shared<CommHookState>(pg),
                             dtype == "fp16" ? fp16_compress_hook : bf16_compress_hook);
  const std::vector<Tensor> a = one_step_grads(*plain), b = one_step_grads(*hooked);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, ops::max_rel_error(b[i], a[i]));
  const int64_t bytes_plain = plain->reducer().bytes_all_reduced_last_iteration();
  const int64_t bytes_hooked = hooked->reducer().bytes_all_reduced_last_iteration();
  std::cout << "RESULT " << dtype << " max_rel_diff_to_plain=" << worst
            << " bytes plain=" << bytes_plain << " hooked=" << bytes_hooked << "\n";
  // 11 (fp16) or 8 (bf16) significant bits, one rounding before and one after the sum.
  const double tol = dtype == "fp16" ? 2e-3 : 2e-2;
  check(worst > 0, "the 16-bit hook should round something");
  check(worst <= tol, dtype + " gradients too far from plain averaging");
  check(bytes_hooked * 2 == bytes_plain, "a 16-bit hook sends half the bytes");
}

// PowerSGD by hand (Note [PowerSGD] in powerSGD_hook.cpp), on a 4x3 gradient, rank 1: plain
// loops over doubles, nothing shared with the hook.
using Mat = std::vector<std::vector<double>>;  // rows

Mat mat_of(const Tensor& t, int64_t n, int64_t m) {
  const std::vector<float> v = ops::contiguous(t).to_vector<float>();
  Mat a(n, std::vector<double>(m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) a[i][j] = v[i * m + j];
  return a;
}

std::vector<double> normalized(std::vector<double> v) {
  double n = 0;
  for (double x : v) n += x * x;
  for (double& x : v) x /= std::sqrt(n);
  return v;
}

struct HandStep {
  Mat approx;               // P Q^T, the same on every rank
  std::vector<Mat> errors;  // by rank: input - approx
  std::vector<double> q;    // the averaged Q (warm start of the next step)
};

// inputs[r]: rank r's gradient plus its previous error; q: Q before orthogonalization.
HandStep powersgd_by_hand(const std::vector<Mat>& inputs, std::vector<double> q) {
  const size_t n = inputs[0].size(), m = inputs[0][0].size(), world = inputs.size();
  q = normalized(q);
  std::vector<double> p(n, 0.0);
  for (const Mat& a : inputs)  // P = sum_r M_r q
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < m; ++j) p[i] += a[i][j] * q[j];
  p = normalized(p);
  std::vector<double> qq(m, 0.0);
  for (const Mat& a : inputs)  // Q = (1/W) sum_r M_r^T p
    for (size_t j = 0; j < m; ++j)
      for (size_t i = 0; i < n; ++i) qq[j] += a[i][j] * p[i] / static_cast<double>(world);
  HandStep h;
  h.q = qq;
  h.approx.assign(n, std::vector<double>(m));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) h.approx[i][j] = p[i] * qq[j];
  for (const Mat& a : inputs) {
    Mat e = a;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < m; ++j) e[i][j] -= h.approx[i][j];
    h.errors.push_back(e);
  }
  return h;
}

double mat_diff(const Mat& a, const Mat& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) worst = std::max(worst, std::abs(a[i][j] - b[i][j]));
  return worst;
}

// Rank r's 4x3 gradient at `step`: fixed numbers, different by rank and step.
Mat hand_gradient(int rank, int step) {
  Mat a(4, std::vector<double>(3));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) a[i][j] = ((i * 3 + j) * (rank + 2) + step * 5) % 7 - 3.0 + 0.5 * i;
  return a;
}

void powersgd_hand(const std::shared_ptr<ProcessGroup>& pg) {
  const Tensor weight = ops::zeros({4, 3});  // the parameter whose gradient this is
  const std::vector<double> q0 = {1.0, -2.0, 0.5};
  // Both hooks, each with its own state, on the same inputs.
  for (bool naive : {false, true}) {
    auto state = std::make_shared<PowerSGDState>(pg);
    state->matrix_approximation_rank = 1;
    state->start_powerSGD_iter = 0;
    state->min_compression_rate = 1;  // (4 + 3) * 1 < 12: worth compressing
    // Seed the warm-start memory with a known Q instead of a random one.
    PowerSGDState::BucketMemory& mem = state->memory[0];
    mem.params = {weight.impl_ptr().get()};
    mem.error = ops::zeros({12});
    mem.p = ops::zeros({4});
    mem.q = ops::from_vector(std::vector<float>(q0.begin(), q0.end()), {3});
    std::vector<Mat> prev_errors(g_world, Mat(4, std::vector<double>(3, 0.0)));
    std::vector<double> q = q0;
    for (int step = 0; step < 2; ++step) {
      std::vector<Mat> inputs;
      for (int r = 0; r < g_world; ++r) {
        Mat a = hand_gradient(r, step);
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 3; ++j) a[i][j] += prev_errors[r][i][j];  // error feedback
        inputs.push_back(a);
      }
      const HandStep h = powersgd_by_hand(inputs, q);
      // The hook, on this rank's raw gradient (it adds its own stored error).
      const Mat mine = hand_gradient(g_rank, step);
      std::vector<float> flat;
      for (const auto& row : mine) flat.insert(flat.end(), row.begin(), row.end());
      Tensor buffer = ops::from_vector(flat, {12});
      GradBucket bucket(0, true, buffer, {ops::view(buffer, {4, 3})}, {weight});
      const Tensor out =
          (naive ? powerSGD_hook_naive(*state, bucket) : powerSGD_hook(*state, bucket))->wait();
      const double d_out = mat_diff(mat_of(out, 4, 3), h.approx);
      const double d_err = mat_diff(mat_of(state->memory[0].error, 4, 3), h.errors[g_rank]);
      const Mat q_mat = mat_of(state->memory[0].q, 1, 3);
      const double d_q = mat_diff(q_mat, Mat{h.q});
      std::cout << "RESULT " << (naive ? "naive" : "fast") << " step " << step
                << ": |result - P Q^T|=" << d_out << " |error - (M + e - P Q^T)|=" << d_err
                << " |Q - hand Q|=" << d_q << " result[0][0]=" << mat_of(out, 4, 3)[0][0]
                << " hand=" << h.approx[0][0] << "\n";
      check(d_out < 1e-5 && d_err < 1e-5 && d_q < 1e-5,
            "PowerSGD differs from the hand computation at step " + std::to_string(step));
      check(mat_diff(h.errors[g_rank], Mat(4, std::vector<double>(3, 0.0))) > 1e-3,
            "the test case should leave a residual (rank-1 approximation of a rank-3 matrix)");
      prev_errors = h.errors;
      q = h.q;  // warm start
    }
    check(state->iter == 2, "two iterations counted");
  }
}

void powersgd_bytes(const std::shared_ptr<ProcessGroup>& pg) {
  const int steps = 3;
  int64_t bytes[2] = {0, 0};
  for (bool compressed : {false, true}) {
    manual_seed(7);
    auto ddp = std::make_shared<DDP>(models::create("resnet20", 10), pg);
    auto state = std::make_shared<PowerSGDState>(pg);
    state->matrix_approximation_rank = 2;
    state->start_powerSGD_iter = compressed ? 1 : 1000;  // after the bucket rebuild of step 1
    ddp->register_comm_hook(state, powerSGD_hook);
    optim::SGD opt(ddp->parameters(), sgd_options());
    for (int step = 0; step < steps; ++step) {
      Generator gen(500 + step * g_world + g_rank);
      Tensor x = ops::randn({2, 3, 32, 32}, kFloat32, &gen);
      Tensor y = ops::randint(0, 10, {2}, &gen);
      opt.zero_grad();
      nn::functional::cross_entropy(ddp->forward(x), y).backward();
      opt.step();
    }
    bytes[compressed] = ddp->reducer().bytes_all_reduced_last_iteration();
    // Every rank applied the same decompressed gradients: the replicas are still identical.
    double drift = 0;
    for (const Tensor& p : ddp->parameters()) {
      Tensor rank0 = ops::clone(p);
      pg->broadcast(rank0, 0)->wait();
      drift = std::max(drift, ops::max_abs_diff(p, rank0));
    }
    check(drift == 0, "replicas differ after PowerSGD steps");
  }
  std::cout << "RESULT resnet20 bytes all-reduced per step: plain " << bytes[0]
            << ", PowerSGD rank 2 " << bytes[1] << " (" << 100.0 * bytes[1] / bytes[0] << "%)\n";
  check(bytes[1] * 10 < bytes[0], "PowerSGD rank 2 should send < 10% of the bytes");
}

// Rank r has 5 - r batches. The single-process reference of step s: the k running ranks' rows,
// loss scaled by k / W (Note [Join]).
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

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: ddp_worker SCENARIO RANK WORLD STORE_PORT [ARGS...]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  g_rank = std::atoi(argv[2]);
  g_world = std::atoi(argv[3]);
  const int port = std::atoi(argv[4]);
  const std::vector<std::string> args(argv + 5, argv + argc);
  set_num_threads(1);  // the test machine may have fewer cores than ranks
  try {
    auto pg = connect(port);
    if (scenario == "equivalence") {
      equivalence(pg, args.at(0), args.at(1) == "1");
    } else if (scenario == "overlap") {
      overlap(pg);
    } else if (scenario == "unused_error") {
      unused_error(pg);
    } else if (scenario == "unused_flag") {
      unused_flag(pg);
    } else if (scenario == "no_sync") {
      no_sync(pg, !args.empty() && args[0] == "1");
    } else if (scenario == "mismatch") {
      mismatch(pg);
    } else if (scenario == "buffers") {
      buffers(pg, args.at(0) == "1");
    } else if (scenario == "naive") {
      naive(pg);
    } else if (scenario == "rebuild") {
      rebuild(pg, args.at(0) == "1");
    } else if (scenario == "rewrap") {
      rewrap(pg);
    } else if (scenario == "forward_only") {
      forward_only(pg);
    } else if (scenario == "hook_calls") {
      hook_calls(pg);
    } else if (scenario == "compress") {
      compress(pg, args.at(0));
    } else if (scenario == "powersgd_hand") {
      powersgd_hand(pg);
    } else if (scenario == "powersgd_bytes") {
      powersgd_bytes(pg);
    } else if (scenario == "join") {
      join(pg, args.at(0) == "1", args.size() > 1 ? args[1] : "mlp");
    } else if (scenario == "join_scaler") {
      join_scaler(pg);
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 2;
    }
    pg->barrier()->wait();  // nobody tears the group down while a peer still needs it
  } catch (const std::exception& e) {
    std::cerr << "rank " << g_rank << ": " << e.what() << "\n";
    return 1;
  }
  return g_failed ? 1 : 0;
}
