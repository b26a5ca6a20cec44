// Learning-rate schedules (see optim/lr_scheduler.h).
#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>

namespace ddplab::optim {

namespace {
constexpr double kPi = 3.14159265358979323846;
}

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (auto& g : optimizer_.param_groups()) {
    // The first scheduler on an optimizer records the starting lr; later ones reuse it.
    g.options.emplace("initial_lr", g.get("lr"));
    base_lrs_.push_back(g.get("initial_lr"));
  }
}

void LRScheduler::step() {
  set_last_epoch(last_epoch_ + 1);
}

void LRScheduler::set_last_epoch(int64_t epoch) {
  last_epoch_ = epoch;
  apply(epoch);
}

void LRScheduler::apply(int64_t epoch) {
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    groups[i].options["lr"] = lr_at(epoch, i, base_lrs_[i]);
}

nlohmann::json LRScheduler::state_dict() const {
  return {{"last_epoch", last_epoch_}, {"base_lrs", base_lrs_}};
}

void LRScheduler::load_state_dict(const nlohmann::json& state) {
  DDP_CHECK(state.is_object() && state.contains("last_epoch") &&
                state["last_epoch"].is_number_integer() && state.contains("base_lrs") &&
                state["base_lrs"].is_array(),
            "LRScheduler::load_state_dict: expected {\"last_epoch\": int, \"base_lrs\": [...]}");
  auto base = state["base_lrs"].get<std::vector<double>>();
  DDP_CHECK(base.size() == base_lrs_.size(), "LRScheduler::load_state_dict: state has "
                                                 << base.size() << " base lrs, the optimizer has "
                                                 << base_lrs_.size() << " param groups");
  base_lrs_ = std::move(base);
  set_last_epoch(state["last_epoch"].get<int64_t>());
}

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (const auto& g : optimizer_.param_groups()) out.push_back(g.get("lr"));
  return out;
}

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : LRScheduler(opt), step_size(step_size), gamma(gamma) {
  DDP_CHECK(step_size > 0, "StepLR: step_size must be positive, got " << step_size);
  initialize();
}

double StepLR::lr_at(int64_t epoch, size_t, double base_lr) const {
  return base_lr *
         std::pow(gamma,
                  static_cast<double>(
                      epoch / step_size));  // NOLINT(bugprone-integer-division): StepLR floors
}

MultiStepLR::MultiStepLR(Optimizer& opt, std::vector<int64_t> ms, double gamma)
    : LRScheduler(opt), milestones(std::move(ms)), gamma(gamma) {
  std::sort(milestones.begin(), milestones.end());
  initialize();
}

double MultiStepLR::lr_at(int64_t epoch, size_t, double base_lr) const {
  auto passed = std::upper_bound(milestones.begin(), milestones.end(), epoch) - milestones.begin();
  return base_lr * std::pow(gamma, static_cast<double>(passed));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min)
    : LRScheduler(opt), t_max(t_max), eta_min(eta_min) {
  DDP_CHECK(t_max > 0, "CosineAnnealingLR: T_max must be positive, got " << t_max);
  initialize();
}

double CosineAnnealingLR::lr_at(int64_t epoch, size_t, double base_lr) const {
  return eta_min +
         (base_lr - eta_min) *
             (1 + std::cos(kPi * static_cast<double>(epoch) / static_cast<double>(t_max))) / 2;
}

LinearLR::LinearLR(Optimizer& opt, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(opt),
      start_factor(start_factor),
      end_factor(end_factor),
      total_iters(total_iters) {
  DDP_CHECK(
      start_factor > 0 && start_factor <= 1 && end_factor >= 0 && end_factor <= 1,
      "LinearLR: factors must be in (0, 1] and [0, 1], got " << start_factor << ", " << end_factor);
  initialize();
}

double LinearLR::lr_at(int64_t epoch, size_t, double base_lr) const {
  double frac = total_iters > 0 ? static_cast<double>(std::min(epoch, total_iters)) /
                                      static_cast<double>(total_iters)
                                : 1.0;
  return base_lr * (start_factor + (end_factor - start_factor) * frac);
}

LambdaLR::LambdaLR(Optimizer& opt, std::function<double(int64_t)> f)
    : LRScheduler(opt), factor(std::move(f)) {
  initialize();
}

double LambdaLR::lr_at(int64_t epoch, size_t, double base_lr) const {
  return base_lr * factor(epoch);
}

OneCycleLR::OneCycleLR(Optimizer& opt, double max_lr, int64_t total_steps, OneCycleOptions o)
    : LRScheduler(opt), max_lr(max_lr), total_steps(total_steps), options(o) {
  DDP_CHECK(total_steps > 1, "OneCycleLR: total_steps must be > 1, got " << total_steps);
  DDP_CHECK(o.pct_start > 0 && o.pct_start < 1, "OneCycleLR: pct_start must be in (0, 1)");
  for (auto& g : optimizer_.param_groups()) g.options["initial_lr"] = max_lr / o.div_factor;
  if (o.cycle_momentum) {
    const auto& g0 = optimizer_.param_groups().at(0);
    DDP_CHECK(g0.has("momentum") || g0.has("beta1"),
              "OneCycleLR: cycle_momentum needs an optimizer with momentum or betas");
  }
  initialize();
}

double OneCycleLR::anneal(int64_t step, double a0, double a1, double a2) const {
  // Phase 1 ends at step pct_start * total - 1 (a float, as in PyTorch); phase 2 at total - 1.
  const double end1 = options.pct_start * static_cast<double>(total_steps) - 1;
  const double end2 = static_cast<double>(total_steps) - 1;
  const double s = static_cast<double>(step);
  double start, end, pct;
  if (s <= end1) {
    start = a0, end = a1, pct = s / end1;
  } else {
    start = a1, end = a2, pct = (s - end1) / (end2 - end1);
  }
  return end + (start - end) / 2 * (std::cos(kPi * pct) + 1);
}

double OneCycleLR::lr_at(int64_t epoch, size_t, double) const {
  DDP_CHECK(epoch <= total_steps,
            "OneCycleLR: stepped " << epoch << " times, more than total_steps=" << total_steps);
  const double initial = max_lr / options.div_factor;
  return anneal(epoch, initial, max_lr, initial / options.final_div_factor);
}

double OneCycleLR::momentum_at(int64_t epoch) const {
  return anneal(epoch, options.max_momentum, options.base_momentum, options.max_momentum);
}

void OneCycleLR::apply(int64_t epoch) {
  LRScheduler::apply(epoch);
  if (!options.cycle_momentum) return;
  double m = momentum_at(epoch);
  for (auto& g : optimizer_.param_groups()) g.options[g.has("momentum") ? "momentum" : "beta1"] = m;
}

}  // namespace ddplab::optim
