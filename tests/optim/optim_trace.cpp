// Records optimizer updates and LR schedules for check_optim.py to recompute in PyTorch.
//
//   optim_trace OUT.safetensors
//
// For each optimizer configuration: <cfg>.p0 (initial parameter), <cfg>.g<k> (the gradient fed
// at step k) and <cfg>.p<k+1> (the parameter after step k), 6 steps. For each schedule:
// sched.<name>.lr (float64, the lr after construction and after each of 12 steps) and for
// OneCycleLR also sched.onecycle.momentum.
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>

#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace ddplab;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  try {
    std::vector<std::pair<std::string, Tensor>> out;
    using Factory = std::function<std::unique_ptr<optim::Optimizer>(const Tensor&)>;
    std::vector<std::pair<std::string, Factory>> configs = {
        {"sgd",
         [](const Tensor& p) {
           return std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions{0.1});
         }},
        {"sgd_momentum_wd",
         [](const Tensor& p) {
           return std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                               optim::SGDOptions{0.1, 0.9, 0, 5e-4, false});
         }},
        {"sgd_dampening",
         [](const Tensor& p) {
           return std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                               optim::SGDOptions{0.05, 0.8, 0.3, 0, false});
         }},
        {"sgd_nesterov",
         [](const Tensor& p) {
           return std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                               optim::SGDOptions{0.1, 0.9, 0, 1e-3, true});
         }},
        {"adam",
         [](const Tensor& p) {
           return std::make_unique<optim::Adam>(std::vector<Tensor>{p}, optim::AdamOptions{});
         }},
        {"adam_wd",
         [](const Tensor& p) {
           return std::make_unique<optim::Adam>(
               std::vector<Tensor>{p}, optim::AdamOptions{0.01, 0.8, 0.99, 1e-6, 0.1, false});
         }},
        {"adam_amsgrad",
         [](const Tensor& p) {
           return std::make_unique<optim::Adam>(
               std::vector<Tensor>{p}, optim::AdamOptions{0.01, 0.9, 0.999, 1e-8, 0, true});
         }},
        {"adamw",
         [](const Tensor& p) {
           optim::AdamWOptions o;
           o.lr = 0.01;
           return std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, o);
         }},
    };
    Generator gen(7);
    for (auto& [name, make] : configs) {
      Tensor p = ops::randn({3, 4}, {}, &gen);
      out.emplace_back(name + ".p0", ops::clone(p));
      auto opt = make(p);
      for (int k = 0; k < 6; ++k) {
        // Gradients of varying scale, so amsgrad's max matters.
        Tensor g = ops::mul(ops::randn({3, 4}, {}, &gen), k % 2 ? 0.3 : 2.0);
        p.set_grad(ops::clone(g));
        opt->step();
        out.emplace_back(name + ".g" + std::to_string(k), g);
        out.emplace_back(name + ".p" + std::to_string(k + 1), ops::clone(p));
      }
    }

    using SchedFactory = std::function<std::unique_ptr<optim::LRScheduler>(optim::Optimizer&)>;
    std::vector<std::pair<std::string, SchedFactory>> scheds = {
        {"step", [](optim::Optimizer& o) { return std::make_unique<optim::StepLR>(o, 3, 0.5); }},
        {"multistep",
         [](optim::Optimizer& o) {
           return std::make_unique<optim::MultiStepLR>(o, std::vector<int64_t>{2, 5, 9}, 0.1);
         }},
        {"cosine",
         [](optim::Optimizer& o) {
           return std::make_unique<optim::CosineAnnealingLR>(o, 10, 0.001);
         }},
        {"linear",
         [](optim::Optimizer& o) { return std::make_unique<optim::LinearLR>(o, 0.1, 1.0, 4); }},
        {"onecycle",
         [](optim::Optimizer& o) { return std::make_unique<optim::OneCycleLR>(o, 0.5, 13); }},
    };
    for (auto& [name, make] : scheds) {
      Tensor p = ops::zeros({1});
      optim::SGD opt({p}, {0.1, 0.9});
      auto s = make(opt);
      std::vector<double> lrs{opt.lr()}, moms{opt.param_groups()[0].get("momentum")};
      for (int k = 0; k < 12; ++k) {
        s->step();
        lrs.push_back(opt.lr());
        moms.push_back(opt.param_groups()[0].get("momentum"));
      }
      int64_t n = static_cast<int64_t>(lrs.size());
      out.emplace_back("sched." + name + ".lr", ops::from_vector(lrs, {n}, kFloat64));
      if (name == "onecycle") {
        out.emplace_back("sched." + name + ".momentum", ops::from_vector(moms, {n}, kFloat64));
      }
    }
    nn::save_safetensors(argv[1], out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optim_trace: %s\n", e.what());
    return 1;
  }
}
