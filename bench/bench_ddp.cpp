// bench_ddp: how fast is ddplab's DDP? Measures, on CPU with the Gloo group:
//
//   bench_ddp single    [--steps N] [--batch 64]   one process: resnet20 training step, 1 thread
//   bench_ddp local     [--steps N] [--batch 32]   under ddprun: every rank trains its own replica
//                                                  without communicating (the floor for ddp: same
//                                                  work, all cores busy, no all-reduce)
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
// ddp and syncbn also take DDPOptions by their PyTorch names, for A/B runs: --bucket-cap-mb X,
// --first-bucket-cap-mb X, --broadcast-buffers 0|1, --gradient-as-bucket-view 0|1.
// Every step mode prints the medians of its forward, backward and optimizer parts (DDP's own
// work included: buffer broadcast in forward, the wait for the last bucket in backward).
//
// Every mode prints "BENCH <key> <value>" lines (rank 0 only), which bench/bench_ddp.py collects
// next to PyTorch's numbers for the same measurements; see bench/README.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "comm/init_process_group.h"
#include "ddp/comm_hooks/builtin.h"
#include "ddp/ddp.h"
#include "ddp/naive_allreduce_grads.h"
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

// CPU seconds used so far by `clock`: CLOCK_THREAD_CPUTIME_ID (this thread, the one that
// computes) or CLOCK_PROCESS_CPUTIME_ID (every thread, the process group's helpers included).
// On a machine with as many busy ranks as cores, CPU time the helper threads use is taken from
// some rank's compute, so it is part of what DDP costs even when it overlaps in wall time.
double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The word after `name` on the command line (after the mode), or null when the flag is absent.
const char* flag_value(int argc, char** argv, const std::string& name) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  return nullptr;
}

int64_t flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  const char* v = flag_value(argc, argv, name);
  return v != nullptr ? std::atoll(v) : fallback;
}

double double_flag(int argc, char** argv, const std::string& name, double fallback) {
  const char* v = flag_value(argc, argv, name);
  return v != nullptr ? std::atof(v) : fallback;
}

std::string string_flag(int argc, char** argv, const std::string& name,
                        const std::string& fallback) {
  const char* v = flag_value(argc, argv, name);
  return v != nullptr ? v : fallback;
}

// What a step mode trains, and how DDP communicates.
struct StepConfig {
  std::string model = "resnet20";
  distributed::BuiltinCommHookOptions hook;  // name "none": DDP's default hook, untouched
  distributed::DDPOptions ddp;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds per training step of the model on random data of its input size.
// mode: "single" (no communication), "ddp" (through the wrapper), "naive" (after-backward loop),
// "syncbn" (through the wrapper, with SyncBatchNorm: two more collectives per BatchNorm layer),
// "local" (every rank its own replica, no communication but the barrier between steps).
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
    ddp = std::make_shared<distributed::DDP>(net, pg, config.ddp);
    if (config.hook.name != "none") distributed::register_builtin_comm_hook(*ddp, config.hook);
    model = ddp.get();
  } else if (mode == "naive") {
    distributed::broadcast_coalesced(*pg, net->parameters(), 0);
  }
  optim::SGD opt(model->parameters(), optim::SGDOptions{0.1, 0.9});
  Generator gen(1 + (pg ? pg->rank() : 0));
  const Tensor x = ops::randn({batch, channels, side, side}, kFloat32, &gen);
  const Tensor y = ops::randint(0, 10, {batch}, &gen);

  std::vector<double> times, forward, backward, optimizer, exposed, cpu_main, cpu_helpers;
  const int64_t warmup = 2;
  // Ranks run in lock step: a step is timed from one barrier to the next, so it includes waiting
  // for the slowest rank. That is what a data-parallel loop pays, with or without DDP (the
  // all-reduce waits for every rank too), so "local" and "ddp" are compared on the same terms.
  if (pg) pg->barrier()->wait();
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const double main0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    const double process0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    const auto t = Clock::now();
    opt.zero_grad();
    Tensor loss = nn::functional::cross_entropy(model->forward(x), y);
    const double forward_s = seconds_since(t);
    const auto t_backward = Clock::now();
    loss.backward();
    if (mode == "naive") distributed::naive_allreduce_grads(*net, *pg);
    const double backward_s = seconds_since(t_backward);
    const auto t_optimizer = Clock::now();
    opt.step();
    const double optimizer_s = seconds_since(t_optimizer);
    if (pg) pg->barrier()->wait();
    if (s < warmup) continue;
    optimizer.push_back(optimizer_s);
    times.push_back(seconds_since(t));
    forward.push_back(forward_s);
    backward.push_back(backward_s);
    const double main_cpu = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - main0;
    cpu_main.push_back(main_cpu);
    cpu_helpers.push_back(cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process0 - main_cpu);
    if (ddp) {
      const auto& tl = ddp->reducer().last_iteration_timeline();
      exposed.push_back(tl.finalized_ms - tl.backward_end_ms);
    }
  }
  if (pg && pg->rank() != 0) return;
  const char* m = mode.c_str();
  std::printf("BENCH %s_step_ms %.2f\n", m, 1e3 * median(times));
  std::printf("BENCH %s_forward_ms %.2f\n", m, 1e3 * median(forward));
  std::printf("BENCH %s_backward_ms %.2f\n", m, 1e3 * median(backward));
  std::printf("BENCH %s_optimizer_ms %.2f\n", m, 1e3 * median(optimizer));
  std::printf("BENCH %s_cpu_main_thread_ms %.2f\n", m, 1e3 * median(cpu_main));
  std::printf("BENCH %s_cpu_other_threads_ms %.2f\n", m, 1e3 * median(cpu_helpers));
  std::printf("BENCH %s_images_per_sec %.1f\n", m,
              static_cast<double>(batch * (pg ? pg->size() : 1)) / median(times));
  if (mode == "ddp") {
    const auto& tl = ddp->reducer().last_iteration_timeline();
    std::printf("BENCH ddp_buckets %zu\n", tl.buckets.size());
    std::printf("BENCH ddp_exposed_comm_ms %.2f\n", median(exposed));
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

// Seconds per all-reduce of `n` floats: one warm-up, a barrier, then `reps` back to back.
double seconds_per_all_reduce(int64_t n, int64_t reps,
                              const std::shared_ptr<distributed::ProcessGroup>& pg) {
  Tensor t = ops::ones({n});
  pg->all_reduce(t)->wait();
  pg->barrier()->wait();
  const auto start = Clock::now();
  for (int64_t i = 0; i < reps; ++i) pg->all_reduce(t)->wait();
  return seconds_since(start) / static_cast<double>(reps);
}

void bench_allreduce(int64_t iters, const std::shared_ptr<distributed::ProcessGroup>& pg) {
  // The latency of one small collective, the size of a SyncBatchNorm layer's (129 doubles for
  // 64 channels): what each of its two collectives per layer costs at least.
  const double small = seconds_per_all_reduce(256, 1000, pg);
  if (pg->rank() == 0) std::printf("BENCH allreduce_1KiB_us %.1f\n", 1e6 * small);
  // Bus bandwidth of an all-reduce (GB/s): 2 (W - 1) / W * bytes / time, the bytes each link
  // carries in a ring; comparable across world sizes (NCCL-tests' "busbw").
  for (int64_t n : {int64_t{1} << 20, int64_t{16} << 20}) {
    const int64_t reps = n > (1 << 20) ? std::max<int64_t>(iters / 4, 3) : iters;
    const double per = seconds_per_all_reduce(n, reps, pg);
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
    std::fprintf(
        stderr,
        "usage: bench_ddp single|local|ddp|naive|syncbn|allreduce [--steps N] [--batch B]\n"
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
    } else if (mode == "single" || mode == "local" || mode == "ddp" || mode == "naive" ||
               mode == "syncbn") {
      StepConfig config;
      config.model = string_flag(argc, argv, "--model", config.model);
      config.hook.name = string_flag(argc, argv, "--comm-hook", "none");
      config.hook.powersgd_rank = flag(argc, argv, "--powersgd-rank", 2);
      config.hook.powersgd_start_iter = 0;  // the timed steps measure compression
      distributed::ReducerOptions& r = config.ddp.reducer;
      r.bucket_cap_mb = double_flag(argc, argv, "--bucket-cap-mb", r.bucket_cap_mb);
      r.first_bucket_cap_mb =
          double_flag(argc, argv, "--first-bucket-cap-mb", r.first_bucket_cap_mb);
      r.gradient_as_bucket_view =
          flag(argc, argv, "--gradient-as-bucket-view", r.gradient_as_bucket_view) != 0;
      config.ddp.broadcast_buffers =
          flag(argc, argv, "--broadcast-buffers", config.ddp.broadcast_buffers) != 0;
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
