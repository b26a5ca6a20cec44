// SGD with momentum, dampening, Nesterov and L2 weight decay, in PyTorch's exact update order:
//
//   g = grad + weight_decay * p
//   buf = g                                    (first step)
//   buf = momentum * buf + (1 - dampening) * g (later steps)
//   g = g + momentum * buf  (nesterov)   or   g = buf
//   p = p - lr * g
//
// Note the momentum is applied to the lr-free gradient and lr multiplies the whole update, so
// changing lr mid-run (a schedule) does not rescale the stored buffer (unlike Sutskever et al.).
#pragma once

#include "optim/optimizer.h"

namespace ddplab::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  SGD(const std::vector<Tensor>& params, SGDOptions options)
      : SGD(std::vector<ParamGroup>{ParamGroup(params)}, options) {}
  void step() override;
  std::string type_name() const override { return "SGD"; }
};

}  // namespace ddplab::optim
