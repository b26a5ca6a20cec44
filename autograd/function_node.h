// FunctionNode: the one Node type behind every differentiable op in autograd/functions*.cpp,
// and `record`, the call that puts it into the graph.
//
// A differentiable op is three lines of intent: compute the output with the raw ops::, say which
// tensors backward needs (saved), and give the backward as a closure:
//
//   Tensor exp(const Tensor& x) {
//     Tensor y = ops::exp(x);
//     return autograd::record("ExpBackward", y, {x}, {y},
//         [](const Tensor& g, const Saved& s, const Needs&) { return Grads{ops::mul(g, s[0])}; });
//   }
//
// Rule: the closure captures only plain values (shapes, dims, scalars); tensors go through
// `saved`, so that release_saved() really frees them after a backward without retain_graph.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/node.h"

namespace ddplab::autograd {

using Saved = std::vector<Tensor>;
using Needs = std::vector<bool>;  // needs[i]: input i leads somewhere that wants its gradient
using Grads = std::vector<Tensor>;
// Gradients of the inputs (undefined where not needed) from the gradient of the output.
using BackwardFn = std::function<Grads(const Tensor& grad, const Saved& saved, const Needs& needs)>;

class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, Saved saved, BackwardFn backward);
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return name_; }
  void release_saved() override;

 private:
  std::string name_;
  Saved saved_;
  BackwardFn backward_;
  bool released_ = false;  // saved tensors were freed: a second backward must fail loudly
};

// Makes `output` (just computed from `inputs`) record `backward` when needs_grad(inputs), and
// returns it. Saved tensors are stored detached (saving an op's own output with its history would
// make a reference cycle). An output that is the same handle as an input (an op that returned its
// argument unchanged) is re-wrapped first so the input's own history is not overwritten.
Tensor record(const char* name, Tensor output, const std::vector<Tensor>& inputs, Saved saved,
              BackwardFn backward);

// Sums a gradient over broadcast dimensions back to `shape`: the single place where the
// broadcasting rule is undone. Leading extra dims are summed away, size-1 dims are summed with
// keepdim. Returns `grad` itself when the shapes already match.
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace ddplab::autograd
