// The autograd graph: nodes, edges and the metadata a tensor carries to join the graph.
//
// Running an op on tensors that require gradients records a Node holding what the backward pass
// will need (saved inputs/outputs). Each node points, through `next_edges`, at the nodes that
// produced its inputs; leaf tensors (parameters) end in an AccumulateGrad node that adds the
// incoming gradient into `.grad`. backward() walks this graph from the loss (autograd/engine.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ddplab::autograd {

class Node;

using GradHook = std::function<Tensor(const Tensor& grad)>;  // may replace the gradient
using PostAccumulateGradHook = std::function<void(const Tensor& param)>;  // after .grad is updated

// A hook as stored: the function and the id its RemovableHandle finds it by. Called like the
// function itself, so the code that runs hooks does not see the id.
template <class Fn>
struct RegisteredHook {
  RegisteredHook(Fn fn, uint64_t id = 0) : fn(std::move(fn)), id(id) {}  // NOLINT: implicit
  template <class... Args>
  auto operator()(Args&&... args) const {
    return fn(std::forward<Args>(args)...);
  }
  Fn fn;
  uint64_t id;  // 0: registered without a handle, cannot be removed
};

// What register_hook and register_post_accumulate_grad_hook return (PyTorch's RemovableHandle):
// remove() unregisters the hook. Letting the handle go does NOT remove the hook (as in PyTorch),
// so an owner that installs hooks keeps its handles and removes them when it goes away (the
// Reducer does, in its destructor). Do not remove a hook from inside a hook of the same tensor.
class RemovableHandle {
 public:
  RemovableHandle() = default;
  explicit RemovableHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  // Idempotent; a no-op when the tensor or graph node holding the hook is already gone.
  void remove();

 private:
  std::function<void()> remover_;
};

// Where a gradient goes: input slot `input_nr` of node `fn`.
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients of the inputs (one per next_edge, undefined where no gradient flows) from the
  // gradients of the outputs (undefined where an output received none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors after a backward without retain_graph.
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  // Creation order. The engine runs ready nodes latest-created first, which makes backward
  // visit layers last-to-first, the order DDP's buckets are built for.
  uint64_t sequence_nr;

  // Hooks registered on non-leaf tensors this node produced, as (output_nr, hook). The engine runs
  // them on the fully summed gradient of that output just before apply(). They live on the node,
  // not on the tensor, because the graph usually outlives the intermediate tensor's handle.
  std::vector<std::pair<uint32_t, RegisteredHook<GradHook>>> tensor_pre_hooks;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;         // null for leaves
  uint32_t output_nr = 0;                // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;  // leaves: their AccumulateGrad node, made on demand
  // Leaves only (non-leaf hooks: Node::tensor_pre_hooks).
  std::vector<RegisteredHook<GradHook>> hooks;
  std::vector<RegisteredHook<PostAccumulateGradHook>> post_accumulate_hooks;
};

// --- for op authors ----------------------------------------------------------------------------
// Grad mode (thread-local): while disabled, ops record nothing.
bool grad_enabled();
void set_grad_enabled(bool enabled);
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// True when grad mode is on and some input requires a gradient: the op must record a node.
bool needs_grad(const std::vector<Tensor>& inputs);
// The edge a gradient for `t` must follow: its grad_fn slot, or its leaf accumulator, or none.
Edge gradient_edge(const Tensor& t);
// Connects `node` to the inputs (next_edges) and makes it the grad_fn of `outputs`
// (output_nr = position). Call only when needs_grad(inputs).
void set_history(const std::vector<Tensor>& outputs, const std::shared_ptr<Node>& node,
                 const std::vector<Tensor>& inputs);

// --- hooks
// ------------------------------------------------------------------------------------------
// Runs on the gradient of `t` before it moves on (leaf: before it is accumulated into .grad;
// non-leaf: on the fully summed gradient); a defined return value replaces the gradient.
RemovableHandle register_hook(const Tensor& t, GradHook hook);
// Runs after the engine has accumulated a new gradient into leaf.grad() (DDP's readiness signal).
RemovableHandle register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);

// The tensor's autograd metadata, created on first use (extension: op authors rarely need it).
AutogradMeta& autograd_meta(const Tensor& t);

}  // namespace ddplab::autograd
