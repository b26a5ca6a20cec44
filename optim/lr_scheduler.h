// Learning-rate schedules (PyTorch's torch.optim.lr_scheduler), as closed forms of the step
// count: StepLR, MultiStepLR, CosineAnnealingLR, LinearLR (linear warm-up), OneCycleLR and
// LambdaLR for anything else.
//
// Semantics follow PyTorch: constructing a scheduler sets every group's lr to the schedule's
// value at step 0 and records the group's starting lr as "initial_lr" (the base lr); each
// `step()` advances one step (an epoch or an iteration, as the caller decides) and sets
// lr = lr_at(step, base lr). Call `optimizer.step()` before `scheduler.step()`, as in PyTorch.
#pragma once

#include <functional>
#include <vector>

#include "optim/optimizer.h"

namespace ddplab::optim {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  // Advances one step and updates the optimizer's learning rates.
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  // Jumps to `epoch` (resuming from a checkpoint) and sets the lrs for it.
  void set_last_epoch(int64_t epoch);
  std::vector<double> get_last_lr() const;
  // The position and base lrs, as PyTorch's scheduler state_dict; load_state_dict restores them
  // and sets the optimizer's lrs for that position. The schedule's own parameters (step_size,
  // T_max, ...) come from the constructor, as they do when PyTorch code resumes.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);
  // The schedule itself: the lr of a group at step `epoch`, given its base lr.
  virtual double lr_at(int64_t epoch, size_t group, double base_lr) const = 0;

 protected:
  // Derived constructors call this last (a virtual call from the base constructor would not
  // reach them): applies the step-0 lr, as PyTorch's constructor does.
  void initialize() { set_last_epoch(0); }
  virtual void apply(int64_t epoch);

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;
};

// lr = base * gamma ^ floor(epoch / step_size)
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch, size_t group, double base_lr) const override;
  int64_t step_size;
  double gamma;
};

// lr = base * gamma ^ (number of milestones <= epoch)
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma = 0.1);
  double lr_at(int64_t epoch, size_t group, double base_lr) const override;
  std::vector<int64_t> milestones;
  double gamma;
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min = 0);
  double lr_at(int64_t epoch, size_t group, double base_lr) const override;
  int64_t t_max;
  double eta_min;
};

// Linear warm-up: lr = base * (start + (end - start) * min(epoch, total_iters) / total_iters).
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& opt, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);
  double lr_at(int64_t epoch, size_t group, double base_lr) const override;
  double start_factor, end_factor;
  int64_t total_iters;
};

// lr = base * factor(epoch)
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& opt, std::function<double(int64_t)> factor);
  double lr_at(int64_t epoch, size_t group, double base_lr) const override;
  std::function<double(int64_t)> factor;
};

struct OneCycleOptions {
  double pct_start = 0.3;         // fraction of steps spent increasing the lr
  double div_factor = 25;         // initial lr = max_lr / div_factor
  double final_div_factor = 1e4;  // final lr = initial lr / final_div_factor
  bool cycle_momentum = true;     // momentum (SGD) or beta1 (Adam) runs opposite to the lr
  double base_momentum = 0.85, max_momentum = 0.95;
};

// Smith & Topin's 1cycle policy with cosine annealing (PyTorch's defaults, two phases): the lr
// rises from max_lr/div_factor to max_lr over pct_start of total_steps, then falls to
// initial/final_div_factor. `base_lr` is ignored: the schedule is set by max_lr. Like PyTorch it
// also sets the momentum, even for an SGD constructed with momentum 0.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& opt, double max_lr, int64_t total_steps, OneCycleOptions options = {});
  double lr_at(int64_t epoch, size_t group, double base_lr) const override;
  double momentum_at(int64_t epoch) const;
  double max_lr;
  int64_t total_steps;
  OneCycleOptions options;

 protected:
  void apply(int64_t epoch) override;

 private:
  // Position in the phase holding `step`: (start value, end value, fraction done); lr or momentum.
  double anneal(int64_t step, double a0, double a1, double b1) const;
};

}  // namespace ddplab::optim
