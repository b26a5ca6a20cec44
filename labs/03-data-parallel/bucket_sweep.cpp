// Lab 3's measurement: one training step of an MLP with the gradients averaged three ways: your
// naive loop (part 1), your bucketing by hand after backward (part 3), and the library's
// DistributedDataParallel, whose Reducer all-reduces each bucket during backward; the last two
// at several bucket caps. Run it under ddprun (README.md):
//
//   ddprun --standalone --nproc-per-node 2 build/labs/lab03_bucket_sweep_starter
//       [--steps 10] [--batch 64] [--width 384] [--depth 16] [--bucket-caps-mb 0.25,1,4,25]
//       [--trace-dir DIR]
//
// Rank 0 prints a row per method and cap: the median step time, the all-reduces issued per step
// (the process group's sequence number), and the communication backward did not hide (the time
// from the end of backward's computation until every gradient was averaged). With --trace-dir
// each rank writes DIR/rank<R>.json (monitor/chrome_trace.h): forward, backward and optimizer
// step on one row, every all-reduce on the other; tools/merge-traces DIR puts the ranks together.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/init_process_group.h"
#include "data_parallel_lab.h"
#include "ddp/ddp.h"
#include "monitor/chrome_trace.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/threads.h"

using namespace ddplab;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kWarmup = 2;  // DDP's first backward rebuilds its buckets: not a typical step
constexpr double kMiB = 1024.0 * 1024.0;

struct Args {
  int steps = 10;
  int64_t batch = 64;  // per rank
  int64_t width = 384;
  int depth = 16;
  std::vector<double> caps_mb = {0.25, 1, 4, 25};
  std::string trace_dir;
};

const char* const kUsage =
    "usage: bucket_sweep [--steps N] [--batch B] [--width W] [--depth D] "
    "[--bucket-caps-mb C1,C2,...] [--trace-dir DIR]";

double positive_number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0))
    throw Error(flag + ": expected a positive number, got '" + text + "'");
  return v;
}

int64_t positive_integer(const std::string& flag, const std::string& text) {
  const double v = positive_number(flag, text);
  if (v != static_cast<double>(static_cast<int64_t>(v)))
    throw Error(flag + ": expected a positive integer, got '" + text + "'");
  return static_cast<int64_t>(v);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw Error(flag + ": missing its value\n" + kUsage);
    const std::string value = argv[i + 1];
    if (flag == "--steps") {
      a.steps = static_cast<int>(positive_integer(flag, value));
    } else if (flag == "--batch") {
      a.batch = positive_integer(flag, value);
    } else if (flag == "--width") {
      a.width = positive_integer(flag, value);
    } else if (flag == "--depth") {
      a.depth = static_cast<int>(positive_integer(flag, value));
    } else if (flag == "--bucket-caps-mb") {
      a.caps_mb.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');)
        a.caps_mb.push_back(positive_number(flag, item));
      if (a.caps_mb.empty()) throw Error(flag + ": expected a comma-separated list of MiB");
    } else if (flag == "--trace-dir") {
      a.trace_dir = value;
    } else {
      throw Error("unknown flag '" + flag + "'\n" + kUsage);
    }
  }
  return a;
}

// depth Linear layers of width x width (the last one width x 10), ReLU between.
std::shared_ptr<nn::Module> make_mlp(const Args& a) {
  manual_seed(0);  // the same weights on every rank, as after DDP's broadcast
  auto net = std::make_shared<nn::Sequential>();
  for (int i = 0; i < a.depth; ++i) {
    const bool last = i + 1 == a.depth;
    net->push_back(std::make_shared<nn::Linear>(a.width, last ? 10 : a.width));
    if (!last) net->push_back(std::make_shared<nn::ReLU>());
  }
  return net;
}

enum class Method { Naive, ByHand, DDP };

struct Config {
  Method method;
  double cap_mb;  // unused by Naive
  std::string label() const {
    char cap[32];
    std::snprintf(cap, sizeof cap, "%g MiB", cap_mb);
    if (method == Method::Naive) return "naive";
    return (method == Method::ByHand ? "by hand " : "ddp ") + std::string(cap);
  }
};

struct Result {
  double step_ms = 0;      // median
  double exposed_ms = 0;   // median: communication after backward's computation
  int64_t allreduces = 0;  // per step
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The collectives since sequence number `since`, from the group's flight recorder, as spans on
// the trace's communication row. The recorder stamps system_clock; the trace's axis is
// steady_clock, so each time is shifted by the offset between the two clocks, read now.
void trace_collectives(monitor::ChromeTrace& trace, distributed::ProcessGroup& pg, uint64_t since,
                       const std::string& label) {
  if (!pg.flight_recorder()) return;
  const auto steady_now = Clock::now();
  const int64_t system_now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count();
  auto steady_at = [&](int64_t system_us) {
    return steady_now - std::chrono::microseconds(system_now_us - system_us);
  };
  for (const auto& e : pg.flight_recorder()->entries()) {
    if (e.seq < since || e.finished_us == 0) continue;
    const int64_t start = e.started_us ? e.started_us : e.issued_us;
    trace.complete(e.op + " " + e.sizes, "collective", monitor::kCommTrack, steady_at(start),
                   steady_at(e.finished_us), {{"config", label}, {"seq", e.seq}});
  }
}

Result run(const Config& c, const Args& a, const std::shared_ptr<distributed::ProcessGroup>& pg,
           monitor::ChromeTrace* trace) {
  std::shared_ptr<nn::Module> net = make_mlp(a);
  std::shared_ptr<distributed::DDP> ddp;
  nn::Module* model = net.get();
  if (c.method == Method::DDP) {
    distributed::DDPOptions o;
    // Both caps equal and no rebuild in arrival order, so that "by hand" and "ddp" at one cap
    // build the same buckets and differ only in WHEN they communicate. (By default DDP's first
    // bucket is 1 MiB and it re-lays its buckets after the first backward: docs/ddp.md.)
    o.reducer.bucket_cap_mb = o.reducer.first_bucket_cap_mb = c.cap_mb;
    o.reducer.rebuild_buckets = false;
    ddp = std::make_shared<distributed::DDP>(net, pg, o);
    model = ddp.get();
  }
  optim::SGD opt(model->parameters(), optim::SGDOptions{0.01});
  Generator gen(1 + pg->rank());  // each rank its own mini-batch
  const Tensor x = ops::randn({a.batch, a.width}, kFloat32, &gen);
  const Tensor y = ops::randint(0, 10, {a.batch}, &gen);
  const auto cap_bytes = static_cast<size_t>(c.cap_mb * kMiB);
  const nlohmann::json args = {{"config", c.label()}};

  std::vector<double> step_ms, exposed_ms;
  Result r;
  for (int s = 0; s < kWarmup + a.steps; ++s) {
    pg->barrier()->wait();  // the ranks start each step together
    const uint64_t seq = pg->sequence_number();
    const auto t0 = Clock::now();
    opt.zero_grad();
    Tensor loss = nn::functional::cross_entropy(model->forward(x), y);
    const auto t1 = Clock::now();
    loss.backward();  // with DDP: the buckets' all-reduces run during it
    const auto t2 = Clock::now();
    if (c.method == Method::Naive) lab3::allreduce_gradients_naive(net->parameters(), *pg);
    if (c.method == Method::ByHand)
      lab3::allreduce_gradients_bucketed(net->parameters(), *pg, cap_bytes);
    const auto t3 = Clock::now();
    opt.step();
    const auto t4 = Clock::now();
    r.allreduces = static_cast<int64_t>(pg->sequence_number() - seq);
    if (trace) {
      trace->complete("forward", "compute", monitor::kComputeTrack, t0, t1, args);
      trace->complete("backward", "compute", monitor::kComputeTrack, t1, t2, args);
      if (ddp) {
        trace->add_reducer_iteration(ddp->reducer().last_iteration_timeline());
      } else {
        trace->complete("average gradients", "compute", monitor::kComputeTrack, t2, t3, args);
        trace_collectives(*trace, *pg, seq, c.label());
      }
      trace->complete("optimizer step", "compute", monitor::kComputeTrack, t3, t4, args);
    }
    if (s < kWarmup) continue;
    step_ms.push_back(ms_between(t0, t4));
    if (ddp) {
      // Backward's own computation ended at backward_end; the rest of backward was waiting.
      const auto& tl = ddp->reducer().last_iteration_timeline();
      exposed_ms.push_back(tl.finalized_ms - tl.backward_end_ms);
    } else {
      exposed_ms.push_back(ms_between(t2, t3));
    }
  }
  r.step_ms = median(step_ms);
  r.exposed_ms = median(exposed_ms);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    set_num_threads(1);  // one core per rank: ranks of one machine share its cores
    distributed::InitOptions init;
    init.backend = "gloo";
    auto pg = distributed::init_process_group(init);
    std::unique_ptr<monitor::ChromeTrace> trace;
    if (!a.trace_dir.empty())
      trace = std::make_unique<monitor::ChromeTrace>(
          a.trace_dir + "/rank" + std::to_string(pg->rank()) + ".json", pg->rank());

    std::vector<Config> configs = {{Method::Naive, 0}};
    for (double cap : a.caps_mb) {
      configs.push_back({Method::ByHand, cap});
      configs.push_back({Method::DDP, cap});
    }
    const bool print = pg->rank() == 0;
    if (print) {
      const double grad_mib = static_cast<double>(make_mlp(a)->num_parameters()) * 4 / kMiB;
      std::printf(
          "%d ranks; MLP of %d layers %lldx%lld: %.2f MiB of gradients in %d tensors; "
          "batch %lld per rank; median of %d steps\n",
          pg->size(), a.depth, static_cast<long long>(a.width), static_cast<long long>(a.width),
          grad_mib, 2 * a.depth, static_cast<long long>(a.batch), a.steps);
      std::printf("%-16s %16s %10s %26s\n", "method", "all-reduces/step", "step ms",
                  "comm after backward ms");
    }
    Config best = configs[0];
    double best_ms = 0;
    for (const Config& c : configs) {
      const Result r = run(c, a, pg, trace.get());
      if (!print) continue;
      std::printf("%-16s %16lld %10.2f %26.2f\n", c.label().c_str(),
                  static_cast<long long>(r.allreduces), r.step_ms, r.exposed_ms);
      if (best_ms == 0 || r.step_ms < best_ms) {
        best = c;
        best_ms = r.step_ms;
      }
    }
    if (print) std::printf("fastest here: %s (%.2f ms per step)\n", best.label().c_str(), best_ms);
    if (trace) trace->close();
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bucket_sweep: %s\n", e.what());
    return 1;
  }
  return 0;
}
