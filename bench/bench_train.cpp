// Training-step benchmark: forward + cross_entropy + backward + SGD step of a model from
// models/ on random data, timed step by step. bench/bench_train.py runs the same step in PyTorch
// and, in its driver mode, runs both programs interleaved and prints the ratios (the machine is
// shared: only ratios measured in one run mean anything).
//
//   build/bench/bench_train [--model resnet20|cnn|...] [--batch 128] [--threads 1]
//                           [--warmup 3] [--steps 10] [--device cpu|cuda] [--amp bf16|fp16] [--profile]
//
// On a GPU (--device cuda; scripts/gpu-check) the step ends with a synchronize, and so does each
// timed part: the times are those of the GPU work, not of queueing it.
// After each step it calls adapt_threads() as examples/train does: --threads is the most threads
// a step runs with, fewer while other programs hold the cores (Note [Threads under load] in
// tensor/adaptive_threads.cpp; DDPLAB_ADAPTIVE_THREADS=0 keeps --threads fixed).
// --amp bf16 runs the forward and the loss under autocast (nn/autocast.h): convolutions and
// linear layers in bfloat16, with bfloat16 activations between layers on the CPU (Note
// [Autocast]); statistics, loss and parameters float32.
//
// Prints one human-readable line and one `RESULT key=value ...` line (parsed by the driver):
// median step time, images/s, and the medians of its forward (incl. loss), backward and
// optimizer parts. --profile adds a per-op breakdown: forward by layer kind (a timed copy of the
// model's forward making the same calls, for the ResNets and the small CNN) and backward by
// autograd node (a pre-hook on every node of the graph records when it starts).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "models/models.h"
#include "nn/autocast.h"
#include "nn/functional.h"
#include "optim/sgd.h"
#include "tensor/adaptive_threads.h"
#include "tensor/backend.h"
#include "tensor/ops.h"
#include "tensor/threads.h"

using namespace ddplab;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// How OpenMP threads wait between parallel regions decides the step time on a busy machine
// (docs/benchmarks.md), and libgomp reads it from these variables at start-up: the RESULT line
// records them ("-": unset, libgomp's default).
const char* env_or_dash(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : "-";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --- profile: forward by layer kind -------------------------------------------------------

// Seconds per category, summed over the profiled steps.
using Breakdown = std::map<std::string, double>;

// A convolution's arithmetic as a direct convolution counts it (2 FLOPs per multiply-add, so
// Winograd's savings show as a rate above the GEMM peak): forward, and backward data (only where
// the input needs a gradient: not the stem's images) plus backward weights.
struct ConvFlops {
  double forward = 0, backward = 0;
};

struct FwdTimer {
  Breakdown* out = nullptr;    // null: no timing (plain forward)
  ConvFlops* flops = nullptr;  // summed over the profiled steps
  Tensor operator()(const char* what, const std::function<Tensor()>& f) const {
    if (out == nullptr) return f();
    auto t0 = Clock::now();
    Tensor r = f();
    (*out)[what] += since(t0);
    return r;
  }
  Tensor conv(nn::Module& m, const Tensor& x) const {
    Tensor y = (*this)("conv", [&] { return m(x); });
    if (flops != nullptr) {
      const Tensor& w = dynamic_cast<nn::Conv2d&>(m).weight;
      const double f = 2.0 * static_cast<double>(y.numel() * (w.numel() / w.size(0)));
      flops->forward += f;
      flops->backward += x.requires_grad() ? 2 * f : f;
    }
    return y;
  }
};

// Each timed step calls what the model's own forward calls (BasicBlock::forward, ResNet::forward,
// SmallCNN::forward), fused ops included, so that the backward below walks the graph a real
// step builds: a walk with separate batch norm, relu and add calls would time other kernels.
Tensor timed_basic_block(models::BasicBlock& b, const Tensor& x, const FwdTimer& T) {
  Tensor out = T.conv(*b.conv1, x);
  out = T("batch_norm+relu", [&] { return b.bn1->forward_relu(out); });
  out = T.conv(*b.conv2, out);
  Tensor identity = x;
  if (b.downsample) {
    auto& ds = dynamic_cast<nn::Sequential&>(*b.downsample);
    identity = T.conv(*ds[0], x);
    identity = T("batch_norm", [&] { return (*ds[1])(identity); });
  }
  return T("batch_norm+add+relu", [&] { return b.bn2->forward_add_relu(out, identity); });
}

// The model's forward with every layer timed; null when the model is not one we know how to walk
// (then --profile reports the backward only).
std::function<Tensor(const Tensor&, const FwdTimer&)> timed_forward(nn::Module& model) {
  if (auto* r = dynamic_cast<models::ResNet*>(&model)) {
    return [r](const Tensor& x, const FwdTimer& T) {
      Tensor out = T.conv(*r->conv1, x);
      out = T("batch_norm+relu", [&] { return r->bn1->forward_relu(out); });
      for (auto& layer : r->layers) {
        for (size_t i = 0; i < layer->size(); ++i) {
          auto* b = dynamic_cast<models::BasicBlock*>((*layer)[i].get());
          DDP_CHECK(b != nullptr, "bench_train --profile: only BasicBlock ResNets are walked");
          out = timed_basic_block(*b, out, T);
        }
      }
      out = T("pool", [&] { return ddplab::flatten((*r->avgpool)(out), 1); });
      return T("linear", [&] { return (*r->fc)(out); });
    };
  }
  if (auto* c = dynamic_cast<models::SmallCNN*>(&model)) {
    return [c](const Tensor& x, const FwdTimer& T) {
      Tensor h = T.conv(*c->conv1, x);
      h = T("batch_norm+relu", [&] { return c->bn1->forward_relu(h); });
      h = T("pool", [&] { return F::max_pool2d(h, {2, 2}); });
      h = T.conv(*c->conv2, h);
      h = T("batch_norm+relu", [&] { return c->bn2->forward_relu(h); });
      h = T("pool", [&] { return F::max_pool2d(h, {2, 2}); });
      h = T("linear", [&] { return (*c->fc1)(ddplab::flatten(h, 1)); });
      h = T("relu", [&] { return F::relu(h); });
      return T("linear", [&] { return (*c->fc2)(h); });
    };
  }
  return nullptr;
}

// --- profile: backward by autograd node ---------------------------------------------------

// Every node of the graph gets a pre-hook that stamps the time it starts; a node's time is then
// the gap to the next stamp (or to the end of backward). AccumulateGrad nodes outlive the step
// (they belong to the parameters), so each is hooked only once.
struct BwdRecorder {
  std::vector<std::pair<std::string, Clock::time_point>> stamps;
  std::set<const autograd::Node*> persistent_hooked;
  std::vector<std::shared_ptr<autograd::Node>> keep;  // keeps hooked persistent nodes alive

  void hook_graph(const Tensor& root) {
    std::vector<std::shared_ptr<autograd::Node>> todo{autograd::autograd_meta(root).grad_fn};
    std::unordered_set<const autograd::Node*> seen;
    while (!todo.empty()) {
      std::shared_ptr<autograd::Node> n = todo.back();
      todo.pop_back();
      if (!n || !seen.insert(n.get()).second) continue;
      const std::string name = n->name();
      const bool persistent = name == "AccumulateGrad";
      if (!persistent || persistent_hooked.insert(n.get()).second) {
        if (persistent) keep.push_back(n);
        n->tensor_pre_hooks.emplace_back(0, [this, name](const Tensor&) {
          stamps.emplace_back(name, Clock::now());
          return Tensor();
        });
      }
      for (const autograd::Edge& e : n->next_edges) todo.push_back(e.fn);
    }
  }

  void collect(Clock::time_point end, Breakdown& out) {
    for (size_t i = 0; i < stamps.size(); ++i) {
      const auto next = i + 1 < stamps.size() ? stamps[i + 1].second : end;
      out[stamps[i].first] += std::chrono::duration<double>(next - stamps[i].second).count();
    }
    stamps.clear();
  }
};

void print_breakdown(const char* title, const Breakdown& b, int steps, double step_ms) {
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (const auto& [k, v] : b) {
    rows.emplace_back(v / steps * 1e3, k);
    total += v / steps * 1e3;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("%s (ms per step, mean of %d steps; total %.1f ms = %.0f%% of the step)\n", title,
              steps, total, 100 * total / step_ms);
  for (const auto& [ms, k] : rows)
    std::printf("  %-34s %8.2f  %5.1f%%\n", k.c_str(), ms, 100 * ms / step_ms);
}

// The convolutions' rate in direct-convolution GFLOP/s, to set beside bench_tensor's GEMM peak
// of the same precision: a rate near the peak leaves nothing for a faster direct kernel.
void print_conv_rates(const ConvFlops& flops, const Breakdown& fwd, const Breakdown& bwd) {
  double bwd_s = 0;
  for (const auto& [k, v] : bwd)
    if (k.rfind("ConvolutionBackward", 0) == 0) bwd_s += v;
  const double fwd_s = fwd.count("conv") ? fwd.at("conv") : 0;
  if (fwd_s <= 0 || bwd_s <= 0) return;
  std::printf(
      "convolutions (direct-convolution FLOPs): forward %.1f GFLOP/s, backward %.1f GFLOP/s, "
      "all %.1f GFLOP/s\n",
      flops.forward / fwd_s * 1e-9, flops.backward / bwd_s * 1e-9,
      (flops.forward + flops.backward) / (fwd_s + bwd_s) * 1e-9);
}

struct Config {
  std::string model = "resnet20";
  int64_t batch = 128;
  int threads = 1;
  int warmup = 3;
  int steps = 10;
  bool profile = false;
  std::string device = "cpu";
  std::string amp;  // "" (float32) or "bf16"
};

int run(const Config& c) {
  set_num_threads(c.threads);
  manual_seed(0);
  const bool small = c.model == "cnn" || c.model == "mlp";
  const int64_t channels = small ? 1 : 3, size = small ? 28 : 32;
  const Device device(c.device);
  auto model = models::create(c.model, 10, channels, size);
  model->to(device);
  model->train();
  optim::SGD opt(model->parameters(), {0.01, 0.9, 0, 5e-4, false});
  Tensor x = ops::to(ops::randn({c.batch, channels, size, size}), device);
  Tensor y = ops::to(ops::randint(0, 10, {c.batch}), device);
  Backend& backend = backend_for(device);  // synchronize(): a no-op on the CPU

  std::vector<double> step_s, fwd_s, bwd_s, opt_s;
  DDP_CHECK(c.amp.empty() || c.amp == "bf16" || c.amp == "fp16",
            "bench_train: --amp takes bf16 or fp16 (CUDA), got " << c.amp);
  const DType amp_dtype = c.amp == "fp16" ? kFloat16 : kBFloat16;
  // Forward and loss under autocast when asked (the guard is cheap: a thread-local flag).
  auto forward_loss = [&](const Tensor& in) {
    std::optional<amp::AutocastGuard> autocast;
    if (!c.amp.empty()) autocast.emplace(device, amp_dtype);
    return F::cross_entropy((*model)(in), y);
  };
  for (int i = 0; i < c.warmup + c.steps; ++i) {
    auto t0 = Clock::now();
    Tensor loss = forward_loss(x);
    backend.synchronize();
    auto t1 = Clock::now();
    loss.backward();
    backend.synchronize();
    auto t2 = Clock::now();
    opt.step();
    opt.zero_grad();
    backend.synchronize();
    auto t3 = Clock::now();
    adapt_threads();  // as examples/train does (DDPLAB_ADAPTIVE_THREADS=0: a fixed count)
    if (i < c.warmup) continue;
    fwd_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    bwd_s.push_back(std::chrono::duration<double>(t2 - t1).count());
    opt_s.push_back(std::chrono::duration<double>(t3 - t2).count());
    step_s.push_back(std::chrono::duration<double>(t3 - t0).count());
  }
  const double ms = median(step_s) * 1e3;
  const double ips = static_cast<double>(c.batch) / median(step_s);
  const std::string precision = c.amp.empty() ? "fp32" : c.amp;
  std::printf(
      "ddplab %s %s batch %lld threads %d %s: step %.1f ms (median of %d; forward %.1f, "
      "backward %.1f, optimizer %.1f), %.0f images/s\n",
      c.model.c_str(), c.device.c_str(), static_cast<long long>(c.batch), c.threads,
      precision.c_str(), ms, c.steps, median(fwd_s) * 1e3, median(bwd_s) * 1e3, median(opt_s) * 1e3,
      ips);
  std::printf(
      "RESULT impl=ddplab model=%s device=%s batch=%lld threads=%d precision=%s step_ms=%.3f "
      "fwd_ms=%.3f bwd_ms=%.3f opt_ms=%.3f ips=%.1f omp_wait_policy=%s gomp_spincount=%s "
      "threads_at_end=%d\n",
      c.model.c_str(), c.device.c_str(), static_cast<long long>(c.batch), c.threads,
      precision.c_str(), ms, median(fwd_s) * 1e3, median(bwd_s) * 1e3, median(opt_s) * 1e3, ips,
      env_or_dash("OMP_WAIT_POLICY"), env_or_dash("GOMP_SPINCOUNT"), get_num_threads());

  if (c.profile) {
    Breakdown fwd, bwd, opt_b;
    ConvFlops flops;
    auto walk = timed_forward(*model);
    BwdRecorder rec;
    for (int i = 0; i < c.steps; ++i) {
      FwdTimer timer{&fwd, &flops};
      Tensor loss;
      {
        std::optional<amp::AutocastGuard> autocast;
        if (!c.amp.empty()) autocast.emplace(device, amp_dtype);
        Tensor logits = walk ? walk(x, timer) : (*model)(x);
        loss = timer("cross_entropy", [&] { return F::cross_entropy(logits, y); });
      }
      rec.hook_graph(loss);
      loss.backward();
      rec.collect(Clock::now(), bwd);
      auto t0 = Clock::now();
      opt.step();
      opt_b["sgd step"] += since(t0);
      t0 = Clock::now();
      opt.zero_grad();
      opt_b["zero_grad"] += since(t0);
    }
    if (walk) print_breakdown("forward by layer kind", fwd, c.steps, ms);
    print_breakdown("backward by autograd node (AccumulateGrad: adding into .grad)", bwd, c.steps,
                    ms);
    print_breakdown("optimizer", opt_b, c.steps, ms);
    if (walk) print_conv_rates(flops, fwd, bwd);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      DDP_CHECK(i + 1 < argc, "bench_train: " << f << " needs a value");
      return argv[++i];
    };
    if (f == "--model") {
      c.model = value();
    } else if (f == "--batch") {
      c.batch = std::stoll(value());
    } else if (f == "--threads") {
      c.threads = std::stoi(value());
    } else if (f == "--warmup") {
      c.warmup = std::stoi(value());
    } else if (f == "--steps") {
      c.steps = std::stoi(value());
    } else if (f == "--device") {
      c.device = value();
    } else if (f == "--amp") {
      c.amp = value();
    } else if (f == "--profile") {
      c.profile = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_train [--model resnet20|cnn|...] [--batch N] [--threads N] "
                   "[--warmup N] [--steps N] [--device cpu|cuda] [--amp bf16|fp16] [--profile]\n");
      return 2;
    }
  }
  try {
    return run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
}
