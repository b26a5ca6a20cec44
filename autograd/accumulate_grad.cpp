// AccumulateGrad: delivers a leaf's gradient into .grad and signals the post-accumulate hooks.
#include "autograd/accumulate_grad.h"

#include "tensor/ops.h"

namespace ddplab::autograd {

AccumulateGrad::AccumulateGrad(Tensor variable) : variable_(std::move(variable)) {
  // Highest priority: once a leaf's gradient is complete, deliver it at once. DDP launches a
  // bucket's all-reduce from the post-accumulate hook, so any delay here delays communication.
  sequence_nr = std::numeric_limits<uint64_t>::max();
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[0];
  if (!g.defined()) return {};
  AutogradMeta& m = autograd_meta(variable_);
  for (const auto& hook : m.hooks) {
    Tensor r = hook(g);
    if (r.defined()) g = r;
  }
  DDP_CHECK(g.shape() == variable_.shape(), "AccumulateGrad: gradient of shape "
                                                << shape_str(g.shape()) << " for a leaf of shape "
                                                << shape_str(variable_.shape()));
  if (!m.grad.defined()) {
    Tensor fresh = ops::empty(variable_.shape(), variable_.options());
    ops::copy_(fresh, g);
    m.grad = fresh;
  } else {
    ops::add_(m.grad, g.dtype() == m.grad.dtype() ? g : ops::to(g, m.grad.dtype()));
  }
  for (const auto& hook : m.post_accumulate_hooks) hook(variable_);
  return {};
}

}  // namespace ddplab::autograd
