// Lab 6: LossScaler (loss_scaler.h), the student's functions in optim::GradScaler's loop.
#include "loss_scaler.h"

#include <vector>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "loss_scaling_lab.h"

namespace lab6 {

using namespace ddplab;

LossScaler::LossScaler(optim::GradScalerOptions options,
                       std::shared_ptr<distributed::ProcessGroup> pg)
    : options_(options), pg_(std::move(pg)), scale_(options.init_scale) {}

Tensor LossScaler::scale(const Tensor& loss) const {
  return options_.enabled ? ddplab::mul(loss, scale_) : loss;
}

bool LossScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  std::vector<Tensor> grads;
  for (const optim::ParamGroup& group : optimizer.param_groups())
    for (const Tensor& p : group.params) grads.push_back(p.grad());
  {
    autograd::NoGradGuard no_grad;  // unscaling is not part of the model's math
    found_inf_ = unscale_grads_(grads, scale_);
  }
  // Without this, a rank whose gradients are finite would step while another skips, and the
  // replicas would drift apart from here on.
  if (pg_) found_inf_ = any_rank_found_inf(*pg_, found_inf_);
  if (!found_inf_) optimizer.step();
  return !found_inf_;
}

void LossScaler::update() {
  if (!options_.enabled) return;
  update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                options_.backoff_factor, options_.growth_interval);
  found_inf_ = false;
}

}  // namespace lab6
