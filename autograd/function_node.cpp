// FunctionNode, record() and sum_to(): the shared machinery of the differentiable ops.
#include "autograd/function_node.h"

#include "tensor/ops.h"

namespace ddplab::autograd {

FunctionNode::FunctionNode(std::string name, Saved saved, BackwardFn backward)
    : name_(std::move(name)), saved_(std::move(saved)), backward_(std::move(backward)) {}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grad_outputs) {
  DDP_CHECK(!released_, "backward through "
                            << name_
                            << " a second time: its saved tensors were freed by the first "
                               "backward. Pass retain_graph=true to the first backward() if "
                               "you need to backward through the same graph twice");
  Needs needs(next_edges.size());
  for (size_t i = 0; i < next_edges.size(); ++i) needs[i] = next_edges[i].valid();
  Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[0];
  if (!g.defined()) return Grads(next_edges.size());
  return backward_(g, saved_, needs);
}

void FunctionNode::release_saved() {
  // Nodes that saved nothing (add, reshape, ...) can run again, as in PyTorch.
  if (saved_.empty()) return;
  saved_.clear();
  released_ = true;
}

Tensor record(const char* name, Tensor output, const std::vector<Tensor>& inputs, Saved saved,
              BackwardFn backward) {
  if (!needs_grad(inputs)) return output;
  for (const Tensor& in : inputs) {
    if (in.defined() && output.is_same(in)) {
      output = output.detach();
      break;
    }
  }
  for (Tensor& s : saved) {
    if (s.defined()) s = s.detach();
  }
  auto node = std::make_shared<FunctionNode>(name, std::move(saved), std::move(backward));
  set_history({output}, node, inputs);
  return output;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  DDP_CHECK(lead >= 0, "sum_to: cannot reduce a gradient of shape " << shape_str(grad.shape())
                                                                    << " to the larger shape "
                                                                    << shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < lead; ++i) dims.push_back(i);
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t gs = grad.shape()[lead + i];
    if (shape[i] == 1 && gs != 1) {
      dims.push_back(lead + static_cast<int64_t>(i));
    } else {
      DDP_CHECK(shape[i] == gs, "sum_to: gradient of shape " << shape_str(grad.shape())
                                                             << " does not broadcast from "
                                                             << shape_str(shape));
    }
  }
  Tensor r = dims.empty() ? grad : ops::sum(grad, dims, /*keepdim=*/true);
  return ops::reshape(r, shape);
}

}  // namespace ddplab::autograd
