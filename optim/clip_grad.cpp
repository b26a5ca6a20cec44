// Gradient clipping by global norm (see optim/clip_grad.h).
#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>

#include "autograd/node.h"
#include "tensor/ops.h"

namespace ddplab::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  double total = 0;
  if (std::isinf(norm_type)) {
    for (const Tensor& g : grads) total = std::max(total, ops::amax(ops::abs(g)).item<double>());
  } else {
    // Per-tensor norms, then the norm of those: one reduction per tensor, one host sync each.
    for (const Tensor& g : grads)
      total += std::pow(ops::norm(g, norm_type).item<double>(), norm_type);
    total = std::pow(total, 1.0 / norm_type);
  }
  DDP_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_: the total norm of order "
                                                             << norm_type << " is " << total
                                                             << " (non-finite gradients)");
  double coef = max_norm / (total + 1e-6);
  if (coef < 1) {
    for (const Tensor& g : grads) ops::mul_(g, coef);
  }
  return total;
}

}  // namespace ddplab::optim
