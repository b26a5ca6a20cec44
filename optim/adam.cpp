// Adam and AdamW (see optim/adam.h for the update rule).
#include "optim/adam.h"

#include <cmath>

#include "autograd/node.h"
#include "tensor/ops.h"

namespace ddplab::optim {

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions o) : Adam(std::move(groups), o, false) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions o, bool decoupled)
    : Optimizer(std::move(groups), {{"lr", o.lr},
                                    {"beta1", o.beta1},
                                    {"beta2", o.beta2},
                                    {"eps", o.eps},
                                    {"weight_decay", o.weight_decay},
                                    {"amsgrad", o.amsgrad ? 1.0 : 0.0}}),
      decoupled_(decoupled) {
  for (const auto& g : groups_) {
    DDP_CHECK(
        g.get("beta1") >= 0 && g.get("beta1") < 1 && g.get("beta2") >= 0 && g.get("beta2") < 1,
        type_name() << ": betas must be in [0, 1), got (" << g.get("beta1") << ", "
                    << g.get("beta2") << ")");
    DDP_CHECK(g.get("eps") >= 0, type_name() << ": invalid eps " << g.get("eps"));
  }
}

void Adam::step() {
  autograd::NoGradGuard no_grad;
  for_each_param_with_grad([&](ParamGroup& g, Tensor& p, size_t idx) {
    const double lr = g.get("lr"), beta1 = g.get("beta1"), beta2 = g.get("beta2");
    const double eps = g.get("eps"), wd = g.get("weight_decay");
    const bool amsgrad = g.get("amsgrad") != 0;
    auto& st = state_[idx];
    if (st.find("exp_avg") == st.end()) {
      st["exp_avg"] = ops::zeros_like(p);
      st["exp_avg_sq"] = ops::zeros_like(p);
      if (amsgrad) st["max_exp_avg_sq"] = ops::zeros_like(p);
    }
    const int64_t t = ++steps_[idx];
    Tensor grad = p.grad();
    if (wd != 0) {
      if (decoupled_) {
        ops::mul_(p, 1 - lr * wd);
      } else {
        grad = ops::add(grad, p, wd);
      }
    }
    Tensor m = st["exp_avg"], v = st["exp_avg_sq"];
    ops::axpby_(m, beta1, grad, 1 - beta1);
    ops::axpby_(v, beta2, ops::mul(grad, grad), 1 - beta2);
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(t));
    const double bc2_sqrt = std::sqrt(1 - std::pow(beta2, static_cast<double>(t)));
    Tensor second = v;
    if (amsgrad) {
      Tensor vmax = st["max_exp_avg_sq"];
      ops::copy_(vmax, ops::maximum(vmax, v));
      second = vmax;
    }
    Tensor denom = ops::div(ops::sqrt(second), bc2_sqrt);
    ops::add_(denom, eps);
    ops::add_(p, ops::div(m, denom), -lr / bc1);
  });
}

}  // namespace ddplab::optim
