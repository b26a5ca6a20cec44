// The DDP scenarios' common ground: small models, the global batches every rank derives alike, the
// single-process reference they are compared with, and on_ranks, which runs a scenario on W
// forked ranks (tests/distributed/fork_ranks.h, the one multi-process harness of these tests).
//
// The guarantee most scenarios check is DDP's contract: W ranks with batch B each end with the
// parameters of one process trained on the W*B rows (train_and_compare).
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
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
#include "fork_ranks.h"
#include "models/models.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/sync_batchnorm.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/threads.h"

namespace ddplab::testing {

using namespace ddplab::distributed;

constexpr int kSteps = 5;
constexpr int64_t kIn = 16, kClasses = 10;

// This process's rank and the job's size, set by on_ranks; check() failures are collected.
inline int g_rank = 0, g_world = 1;
inline bool g_failed = false;

inline void check(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "rank " << g_rank << ": CHECK FAILED: " << what << "\n";
    g_failed = true;
  }
}

// --- models ----------------------------------------------------------------------------------

inline std::shared_ptr<nn::Module> make_mlp() {
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
inline std::shared_ptr<nn::Module> make_deep() {
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

inline std::shared_ptr<nn::Module> make(const std::string& kind) {
  if (kind == "mlp") return make_mlp();
  if (kind == "conv") return std::make_shared<TinyConv>();
  if (kind == "deep") return make_deep();
  if (kind == "unused") return std::make_shared<WithUnused>();
  if (kind == "bn") return std::make_shared<WithBatchNorm>();
  if (kind == "reversed") return std::make_shared<ReverseRegistered>();
  throw Error("unknown model " + kind);
}

// Every rank initialises differently (seed + rank): DDP's broadcast must make them equal.
inline std::shared_ptr<nn::Module> make_seeded(const std::string& kind, uint64_t seed) {
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

inline Batch global_batch(int step, int64_t rows) {
  Generator gen(1000 + step);
  return {ops::randn({rows, kIn}, kFloat32, &gen), ops::randint(0, kClasses, {rows}, &gen)};
}

inline optim::SGDOptions sgd_options() {
  optim::SGDOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 1e-4;
  return o;
}

inline Tensor loss_of(nn::Module& m, const Batch& b) {
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
inline double max_param_diff(const nn::Module& a, const nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i)
    worst = std::max(worst, ops::max_rel_error(pa[i].second, pb[i].second));
  return worst;
}

// Trains `ddp` for kSteps, each rank on its B rows of every global batch, and returns how far its
// parameters end from the single-process reference trained on the whole batches.
inline double train_and_compare(DDP& ddp, const std::string& kind, int64_t B) {
  optim::SGD opt(ddp.parameters(), sgd_options());
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    loss_of(ddp, global_batch(step, g_world * B).rows(g_rank * B, B)).backward();
    opt.step();
  }
  return max_param_diff(*ddp.module(), *train_reference(kind, g_world * B));
}

// The mlp of rank-dependent init (DDP must broadcast) in buckets of about 2 KB: several buckets.
inline std::shared_ptr<DDP> small_bucket_mlp(const std::shared_ptr<ProcessGroup>& pg) {
  DDPOptions o;
  o.reducer.bucket_cap_mb = 0.002;
  o.reducer.first_bucket_cap_mb = 0.001;
  return std::make_shared<DDP>(make_seeded("mlp", 42 + g_rank), pg, o);
}

// Runs `scenario` on `world` forked ranks, each with a Gloo group of its own process; a failed
// check() or an exception fails that rank, and so the test. One thread per rank: the test machine
// may have fewer cores than ranks. Every rank passes a barrier before its group is torn down.
inline void on_ranks(int world,
                     const std::function<void(const std::shared_ptr<ProcessGroup>&)>& scenario,
                     std::chrono::seconds deadline = std::chrono::seconds(50)) {
  run_ranks(
      world,
      [&](int rank, int w, const std::shared_ptr<TCPStore>& store) {
        g_rank = rank;
        g_world = w;
        set_num_threads(1);
        std::shared_ptr<ProcessGroup> pg = make_group(rank, w, store, std::chrono::seconds(60));
        scenario(pg);
        pg->barrier()->wait();
        EXPECT(!g_failed, "a check failed on rank " << rank << " (see above)");
      },
      deadline);
}

}  // namespace ddplab::testing
