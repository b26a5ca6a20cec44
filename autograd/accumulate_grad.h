// AccumulateGrad: the node at the end of every path to a leaf tensor (a parameter).
//
// The engine reaches a leaf through this node; it adds the incoming gradient into leaf.grad()
// and then runs the leaf's post-accumulate hooks. Those hooks are DDP's "this parameter's
// gradient is ready" signal, so this is where communication and backward start to overlap.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "autograd/node.h"

namespace ddplab::autograd {

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);

  // Runs the leaf's grad hooks, then: the first gradient is stored as a fresh tensor (never an
  // alias of the incoming buffer, which may be a broadcast view or shared with another node);
  // later gradients are added in place, so a .grad that is a view into a DDP bucket stays one.
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }

  const Tensor& variable() const { return variable_; }

 private:
  Tensor variable_;  // the leaf; held strongly (the leaf's meta holds this node weakly)
};

}  // namespace ddplab::autograd
