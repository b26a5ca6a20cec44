// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019), PyTorch's formulas:
//
//   t += 1
//   Adam:  g = grad + weight_decay * p         AdamW: p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g^2
//   v_max = max(v_max, v)                      (amsgrad; then v_max replaces v below)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p = p - lr / (1 - beta1^t) * m / denom
//
// eps is added after the bias correction of v, as PyTorch does (not inside the square root).
#pragma once

#include "optim/optimizer.h"

namespace ddplab::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // Adam: L2 added to the gradient; AdamW: decoupled decay
  bool amsgrad = false;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, AdamOptions options);
  Adam(const std::vector<Tensor>& params, AdamOptions options)
      : Adam(std::vector<ParamGroup>{ParamGroup(params)}, options) {}
  void step() override;
  std::string type_name() const override { return decoupled_ ? "AdamW" : "Adam"; }

 protected:
  Adam(std::vector<ParamGroup> groups, AdamOptions options, bool decoupled);

 private:
  bool decoupled_ = false;
};

// AdamW: PyTorch's default weight_decay for AdamW is 1e-2.
struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 1e-2; }
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
      : Adam(std::move(groups), options, true) {}
  AdamW(const std::vector<Tensor>& params, AdamWOptions options)
      : AdamW(std::vector<ParamGroup>{ParamGroup(params)}, options) {}
};

}  // namespace ddplab::optim
