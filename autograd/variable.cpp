// Tensor's autograd side: requires_grad, .grad, grad_fn, detach, backward; the thread-local grad
// mode; how an op joins the graph (needs_grad, gradient_edge, set_history); hooks; and the
// AccumulateGrad node that delivers gradients into leaves.
#include <algorithm>
#include <atomic>
#include <utility>

#include "autograd/accumulate_grad.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "tensor/ops.h"

namespace ddplab {
namespace autograd {

namespace {
// Creation order of nodes. Global (not per thread) so that nodes built by different threads
// still compare; atomic because data loaders and DDP helpers may run ops on other threads.
std::atomic<uint64_t> next_sequence_nr{0};
thread_local bool grad_mode_enabled = true;

// The meta if the tensor has one, else null (never creates).
AutogradMeta* meta_or_null(const Tensor& t) {
  return t.defined() ? t.impl().autograd_meta.get() : nullptr;
}
}  // namespace

Node::Node() : sequence_nr(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

bool grad_enabled() {
  return grad_mode_enabled;
}
void set_grad_enabled(bool enabled) {
  grad_mode_enabled = enabled;
}

AutogradMeta& autograd_meta(const Tensor& t) {
  auto& m = t.impl().autograd_meta;
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta_or_null(t);
  if (m == nullptr) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  // A leaf: reuse its accumulator while some graph still holds it, so that two uses of the same
  // parameter in one forward meet in one node (their gradients are summed before accumulation).
  std::shared_ptr<Node> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

void set_history(const std::vector<Tensor>& outputs, const std::shared_ptr<Node>& node,
                 const std::vector<Tensor>& inputs) {
  node->next_edges.clear();
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) continue;
    AutogradMeta& m = autograd_meta(outputs[i]);
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(i);
    m.grad_accumulator.reset();
  }
}

namespace {

uint64_t next_hook_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

template <class Fn>
uint64_t get_id(const RegisteredHook<Fn>& h) {
  return h.id;
}
uint64_t get_id(const std::pair<uint32_t, RegisteredHook<GradHook>>& h) {  // (output_nr, hook)
  return h.second.id;
}

template <class Hook>
void erase_hook(std::vector<Hook>& hooks, uint64_t id) {
  hooks.erase(
      std::remove_if(hooks.begin(), hooks.end(), [id](const Hook& h) { return get_id(h) == id; }),
      hooks.end());
}

}  // namespace

void RemovableHandle::remove() {
  if (remover_) std::exchange(remover_, nullptr)();
}

// The handles hold weak pointers: a hook lives as long as its tensor's metadata (leaf) or its
// graph node (non-leaf), and removing it after that is a no-op rather than a dangling access.
RemovableHandle register_hook(const Tensor& t, GradHook hook) {
  DDP_CHECK(t.requires_grad(), "register_hook: the tensor (shape "
                                   << shape_str(t.shape())
                                   << ") does not require grad, so no gradient will reach it");
  AutogradMeta& m = autograd_meta(t);
  const uint64_t id = next_hook_id();
  if (m.grad_fn) {
    m.grad_fn->tensor_pre_hooks.emplace_back(m.output_nr, RegisteredHook(std::move(hook), id));
    return RemovableHandle([node = std::weak_ptr<Node>(m.grad_fn), id] {
      if (auto n = node.lock()) erase_hook(n->tensor_pre_hooks, id);
    });
  }
  m.hooks.emplace_back(std::move(hook), id);
  return RemovableHandle([meta = std::weak_ptr<AutogradMeta>(t.impl().autograd_meta), id] {
    if (auto mm = meta.lock()) erase_hook(mm->hooks, id);
  });
}

RemovableHandle register_post_accumulate_grad_hook(const Tensor& leaf,
                                                   PostAccumulateGradHook hook) {
  DDP_CHECK(leaf.requires_grad() && leaf.is_leaf(),
            "register_post_accumulate_grad_hook: expected a leaf tensor that requires grad "
            "(a parameter), got shape "
                << shape_str(leaf.shape())
                << (leaf.is_leaf() ? " that does not require grad" : " with a grad_fn"));
  AutogradMeta& m = autograd_meta(leaf);
  const uint64_t id = next_hook_id();
  m.post_accumulate_hooks.emplace_back(std::move(hook), id);
  return RemovableHandle([meta = std::weak_ptr<AutogradMeta>(leaf.impl().autograd_meta), id] {
    if (auto mm = meta.lock()) erase_hook(mm->post_accumulate_hooks, id);
  });
}

}  // namespace autograd

// --- Tensor methods ------------------------------------------------------------------------------

bool Tensor::requires_grad() const {
  const autograd::AutogradMeta* m = impl().autograd_meta.get();
  return m != nullptr && (m->requires_grad || m->grad_fn != nullptr);
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  autograd::AutogradMeta* m = impl().autograd_meta.get();
  DDP_CHECK(m == nullptr || m->grad_fn == nullptr,
            "set_requires_grad: only leaf tensors can change requires_grad; this tensor of shape "
                << shape_str(shape()) << " was computed by " << m->grad_fn->name()
                << " (use detach() to get a leaf)");
  DDP_CHECK(!requires_grad || is_floating(dtype()),
            "set_requires_grad: only floating-point tensors can require gradients, got "
                << dtype_name(dtype()));
  if (m == nullptr && !requires_grad) return *this;
  autograd::autograd_meta(*this).requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  const autograd::AutogradMeta* m = impl().autograd_meta.get();
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  DDP_CHECK(!g.defined() || g.shape() == shape(),
            "set_grad: gradient of shape " << (g.defined() ? shape_str(g.shape()) : "")
                                           << " for a tensor of shape " << shape_str(shape()));
  if (!g.defined() && impl().autograd_meta == nullptr) return;
  autograd::autograd_meta(*this).grad = g;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  const autograd::AutogradMeta* m = impl().autograd_meta.get();
  return m ? m->grad_fn : nullptr;
}

bool Tensor::is_leaf() const {
  return grad_fn() == nullptr;
}

Tensor Tensor::detach() const {
  auto impl2 = std::make_shared<TensorImpl>();
  impl2->storage = impl().storage;
  impl2->offset = impl().offset;
  impl2->shape = impl().shape;
  impl2->strides = impl().strides;
  impl2->dtype = impl().dtype;
  return Tensor(std::move(impl2));
}

Tensor Tensor::clone() const {
  return ddplab::clone(*this);
}

void Tensor::backward(const Tensor& grad_output, bool retain_graph) const {
  std::vector<Tensor> grads;
  if (grad_output.defined()) grads.push_back(grad_output);
  autograd::backward({*this}, grads, retain_graph);
}

}  // namespace ddplab
