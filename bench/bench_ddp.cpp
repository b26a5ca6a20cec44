// bench_ddp: how fast is ddplab's DDP? Measures, on CPU with the Gloo group:
//
//   bench_ddp single    [--steps N] [--batch 64]   one process: resnet20 training step, 1 thread
//   bench_ddp ddp       [--steps N] [--batch 32]   under ddprun: the same step through DDP
//   bench_ddp naive     [--steps N] [--batch 32]   under ddprun: naive_allreduce_grads instead
//                                                  (no buckets, no overlap), for comparison
//   bench_ddp syncbn    [--steps N] [--batch 32]   under ddprun: the DDP step with every
//                                                  BatchNorm2d converted to SyncBatchNorm
//   bench_ddp allreduce [--iters N]                under ddprun: all-reduce of 1M and 16M floats
//
// The step modes take --model resnet20|resnet18|cnn (default resnet20; cnn on 28x28x1 inputs,
// the ResNets on 32x32x3), and ddp takes --comm-hook none|fp16|bf16|powersgd with
// --powersgd-rank R (default 2; PowerSGD compresses from the first step, warm-up included): it
// then also prints the bytes the hook all-reduced per step (bench/bench_hooks.py compares them).
//
// Every mode prints "BENCH <key> <value>" lines (rank 0 only), which bench/bench_ddp.py collects
// next to PyTorch's numbers for the same measurements; see bench/README.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "distributed/comm_hooks/builtin.h"
#include "distributed/ddp.h"
#include "distributed/init_process_group.h"
#include "distributed/naive_allreduce_grads.h"
#include "models/models.h"
#include "nn/functional.h"
#include "nn/sync_batchnorm.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/threads.h"

using namespace ddplab;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (argv[i] == name) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

std::string string_flag(int argc, char** argv, const std::string& name,
                        const std::string& fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  return fallback;
}

// What a step mode trains, and how DDP communicates.
struct StepConfig {
  std::string model = "resnet20";
  distributed::BuiltinCommHookOptions hook;  // name "none": DDP's default hook, untouched
};

// Median seconds per training step of the model on random data of its input size.
// mode: "single" (no communication), "ddp" (through the wrapper), "naive" (after-backward loop),
// "syncbn" (through the wrapper, with SyncBatchNorm: two more collectives per BatchNorm layer).
void bench_step(const std::string& mode, const StepConfig& config, int64_t batch, int64_t steps,
                const std::shared_ptr<distributed::ProcessGroup>& pg) {
  DDP_CHECK(config.model == "resnet20" || config.model == "resnet18" || config.model == "cnn",
            "--model: expected resnet20, resnet18 or cnn, got '" << config.model << "'");
  DDP_CHECK(config.hook.name == "none" || mode == "ddp",
            "--comm-hook applies to the ddp mode only (got mode " << mode << ")");
  const bool small = config.model == "cnn";  // Fashion-MNIST's shape, as in examples/train
  const int64_t channels = small ? 1 : 3, side = small ? 28 : 32;
  manual_seed(0);
  auto net = models::create(config.model, 10, channels, side);
  std::shared_ptr<distributed::DDP> ddp;
  nn::Module* model = net.get();
  if (mode == "syncbn") net = nn::convert_sync_batchnorm(net, pg);
  if (mode == "ddp" || mode == "syncbn") {
    ddp = std::make_shared<distributed::DDP>(net, pg);
    if (config.hook.name != "none") distributed::register_builtin_comm_hook(*ddp, config.hook);
    model = ddp.get();
  } else if (mode == "naive") {
    distributed::broadcast_coalesced(*pg, net->parameters(), 0);
  }
  optim::SGD opt(model->parameters(), optim::SGDOptions{0.1, 0.9});
  Generator gen(1 + (pg ? pg->rank() : 0));
  const Tensor x = ops::randn({batch, channels, side, side}, kFloat32, &gen);
  const Tensor y = ops::randint(0, 10, {batch}, &gen);

  std::vector<double> times, exposed;
  const int64_t warmup = 2;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    if (pg) pg->barrier()->wait();  // ranks start each step together
    const auto t = Clock::now();
    opt.zero_grad();
    Tensor loss = nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    if (mode == "naive") distributed::naive_allreduce_grads(*net, *pg);
    opt.step();
    if (s < warmup) continue;
    times.push_back(seconds_since(t));
    if (ddp) {
      const auto& tl = ddp->reducer().last_iteration_timeline();
      exposed.push_back(tl.finalized_ms - tl.backward_end_ms);
    }
  }
  std::sort(times.begin(), times.end());
  if (pg && pg->rank() != 0) return;
  std::printf("BENCH %s_step_ms %.2f\n", mode.c_str(), 1e3 * times[times.size() / 2]);
  std::printf("BENCH %s_images_per_sec %.1f\n", mode.c_str(),
              static_cast<double>(batch * (pg ? pg->size() : 1)) / times[times.size() / 2]);
  if (mode == "ddp") {
    std::sort(exposed.begin(), exposed.end());
    const auto& tl = ddp->reducer().last_iteration_timeline();
    std::printf("BENCH ddp_buckets %zu\n", tl.buckets.size());
    std::printf("BENCH ddp_exposed_comm_ms %.2f\n", exposed[exposed.size() / 2]);
    for (size_t b = 0; b < tl.buckets.size(); ++b) {
      std::printf("BENCH ddp_bucket%zu_ready_launched_finished_ms %.2f %.2f %.2f\n", b,
                  tl.buckets[b].ready_ms, tl.buckets[b].launched_ms, tl.buckets[b].finished_ms);
    }
    std::printf("BENCH ddp_backward_end_ms %.2f\n", tl.backward_end_ms);
    // Equal in every step once PowerSGD compresses (from the first step here).
    std::printf("BENCH ddp_bytes_all_reduced_per_step %lld\n",
                static_cast<long long>(ddp->reducer().bytes_all_reduced_last_iteration()));
  }
}

// Bus bandwidth of an all-reduce (GB/s): 2 (W - 1) / W * bytes / time, the bytes each link
// carries in a ring; comparable across world sizes (NCCL-tests' "busbw").
void bench_allreduce(int64_t iters, const std::shared_ptr<distributed::ProcessGroup>& pg) {
  for (int64_t n : {int64_t{1} << 20, int64_t{16} << 20}) {
    Tensor t = ops::ones({n});
    const int64_t reps = n > (1 << 20) ? std::max<int64_t>(iters / 4, 3) : iters;
    pg->all_reduce(t)->wait();  // warm-up
    pg->barrier()->wait();
    const auto start = Clock::now();
    for (int64_t i = 0; i < reps; ++i) pg->all_reduce(t)->wait();
    const double per = seconds_since(start) / static_cast<double>(reps);
    const double w = pg->size();
    const double busbw = 2 * (w - 1) / w * static_cast<double>(n) * 4 / per / 1e9;
    if (pg->rank() == 0) {
      std::printf("BENCH allreduce_%lldM_ms %.3f\n", static_cast<long long>(n >> 20), 1e3 * per);
      std::printf("BENCH allreduce_%lldM_busbw_GBps %.3f\n", static_cast<long long>(n >> 20),
                  busbw);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_ddp single|ddp|naive|syncbn|allreduce [--steps N] [--batch B]\n"
                 "       [--model resnet20|resnet18|cnn] [--comm-hook %s] [--powersgd-rank R]\n",
                 distributed::builtin_comm_hook_names());
    return 2;
  }
  const std::string mode = argv[1];
  set_num_threads(1);
  try {
    std::shared_ptr<distributed::ProcessGroup> pg;
    if (mode != "single") {
      distributed::InitOptions o;
      o.backend = "gloo";
      pg = distributed::init_process_group(o);
    }
    if (mode == "allreduce") {
      bench_allreduce(flag(argc, argv, "--iters", 20), pg);
    } else if (mode == "single" || mode == "ddp" || mode == "naive" || mode == "syncbn") {
      StepConfig config;
      config.model = string_flag(argc, argv, "--model", config.model);
      config.hook.name = string_flag(argc, argv, "--comm-hook", "none");
      config.hook.powersgd_rank = flag(argc, argv, "--powersgd-rank", 2);
      config.hook.powersgd_start_iter = 0;  // the timed steps measure compression
      bench_step(mode, config, flag(argc, argv, "--batch", mode == "single" ? 64 : 32),
                 flag(argc, argv, "--steps", 8), pg);
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
    if (pg) pg->barrier()->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ddp: %s\n", e.what());
    return 1;
  }
  return 0;
}
