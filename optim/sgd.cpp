// SGD (see optim/sgd.h for the update rule).
#include "optim/sgd.h"

#include "autograd/node.h"
#include "tensor/ops.h"

namespace ddplab::optim {

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions o)
    : Optimizer(std::move(groups), {{"lr", o.lr},
                                    {"momentum", o.momentum},
                                    {"dampening", o.dampening},
                                    {"weight_decay", o.weight_decay},
                                    {"nesterov", o.nesterov ? 1.0 : 0.0}}) {
  for (const auto& g : groups_) {
    DDP_CHECK(g.get("momentum") >= 0, "SGD: invalid momentum " << g.get("momentum"));
    DDP_CHECK(g.get("weight_decay") >= 0, "SGD: invalid weight_decay " << g.get("weight_decay"));
    DDP_CHECK(g.get("nesterov") == 0 || (g.get("momentum") > 0 && g.get("dampening") == 0),
              "SGD: Nesterov momentum requires a momentum and zero dampening");
  }
}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  for_each_param_with_grad([&](ParamGroup& g, Tensor& p, size_t idx) {
    const double lr = g.get("lr"), momentum = g.get("momentum"), wd = g.get("weight_decay");
    const double dampening = g.get("dampening");
    const bool nesterov = g.get("nesterov") != 0;
    Tensor d_p = p.grad();
    if (wd != 0) d_p = ops::add(d_p, p, wd);  // a new tensor: .grad itself is left untouched
    if (momentum != 0) {
      auto& st = state_[idx];
      auto it = st.find("momentum_buffer");
      Tensor buf;
      if (it == st.end()) {
        buf = ops::clone(d_p);
        st["momentum_buffer"] = buf;
      } else {
        buf = it->second;
        ops::axpby_(buf, momentum, d_p, 1 - dampening);
      }
      d_p = nesterov ? ops::add(d_p, buf, momentum) : buf;
    }
    ops::add_(p, d_p, -lr);
    ++steps_[idx];
  });
}

}  // namespace ddplab::optim
