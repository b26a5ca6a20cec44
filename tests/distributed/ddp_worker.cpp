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
//   no_sync                3 micro-batches under no_sync + 1 synced == one 4x batch
//   mismatch               rank 1 builds a different layer: construction fails, naming it
//   buffers BCAST          BatchNorm running stats equal rank 0's after forward (BCAST 1), or
//                          differ (BCAST 0: the control)
//   naive                  naive_allreduce_grads gives the Reducer's gradients
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "distributed/ddp.h"
#include "distributed/naive_allreduce_grads.h"
#include "distributed/process_group_gloo.h"
#include "distributed/store/store.h"
#include "nn/functional.h"
#include "nn/layers.h"
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
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4));
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

std::shared_ptr<nn::Module> make(const std::string& kind) {
  if (kind == "mlp") return make_mlp();
  if (kind == "conv") return std::make_shared<TinyConv>();
  if (kind == "deep") return make_deep();
  if (kind == "unused") return std::make_shared<WithUnused>();
  if (kind == "bn") return std::make_shared<WithBatchNorm>();
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
  o.bucket_cap_mb = 0.002;  // a few KB: several buckets even for these small models
  o.first_bucket_cap_mb = 0.001;
  o.gradient_as_bucket_view = view;
  auto ddp = std::make_shared<DDP>(make_seeded(kind, 42 + g_rank), pg, o);
  optim::SGD opt(ddp->parameters(), sgd_options());
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    loss_of(*ddp, global_batch(step, g_world * B).rows(g_rank * B, B)).backward();
    opt.step();
  }
  auto ref = train_reference(kind, g_world * B);
  const double diff = max_param_diff(*ddp->module(), *ref);
  std::cout << "RESULT buckets=" << ddp->reducer().buckets().size() << " max_rel_diff=" << diff
            << "\n";
  check(ddp->reducer().buckets().size() >= 3, "expected at least 3 buckets");
  check(diff <= 1e-5, "parameters differ from the single-process run: " + std::to_string(diff));
}

void overlap(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 64;
  DDPOptions o;
  o.bucket_cap_mb = 0.3;  // one 256x256 layer (256 KB) per bucket
  o.first_bucket_cap_mb = 0.3;
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
  o.bucket_cap_mb = 0.002;
  o.first_bucket_cap_mb = 0.001;
  auto ddp = std::make_shared<DDP>(make_seeded("unused", 42 + g_rank), pg, o);
  optim::SGD opt(ddp->parameters(), sgd_options());
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    loss_of(*ddp, global_batch(step, g_world * B).rows(g_rank * B, B)).backward();
    opt.step();
  }
  auto ref = train_reference("unused", g_world * B);
  const double diff = max_param_diff(*ddp->module(), *ref);
  auto* m = dynamic_cast<WithUnused*>(ddp->module().get());
  std::cout << "RESULT max_rel_diff=" << diff << "\n";
  check(diff <= 1e-5, "parameters differ from the single-process run");
  check(!m->unused->weight.grad().defined(), "an unused parameter got a gradient");
}

void no_sync(const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t B = 4, k = 4;
  DDPOptions o;
  o.bucket_cap_mb = 0.002;
  o.first_bucket_cap_mb = 0.001;
  auto ddp = std::make_shared<DDP>(make_seeded("mlp", 42 + g_rank), pg, o);
  optim::SGD opt(ddp->parameters(), sgd_options());
  for (int step = 0; step < kSteps; ++step) {
    const Batch global = global_batch(step, k * g_world * B);
    opt.zero_grad();
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
  o.bucket_cap_mb = 0.002;
  o.first_bucket_cap_mb = 0.001;
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
      no_sync(pg);
    } else if (scenario == "mismatch") {
      mismatch(pg);
    } else if (scenario == "buffers") {
      buffers(pg, args.at(0) == "1");
    } else if (scenario == "naive") {
      naive(pg);
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
