// The backward engine: dependency counting plus a ready queue ordered by sequence_nr.
//
// A backward pass is one GraphTask:
//   1. Walk the graph from the roots and count, for every node, how many edges point at it
//      (its dependencies: the number of gradients it must wait for).
//   2. Seed the roots' input buffers with grad_roots and push the nodes with no pending
//      dependency into the ready queue.
//   3. Pop the node with the highest sequence_nr (the latest created; AccumulateGrad nodes have
//      the maximum, so a finished leaf gradient is delivered at once), run its pre-hooks and
//      apply(), and add each produced gradient into the buffer of the node it flows to. A node
//      whose dependency count reaches zero has all its gradients summed: it becomes ready.
//   4. After the queue drains, run the callbacks queued during the pass (DDP's "wait for the
//      last all-reduce").
// autograd::grad() runs the same pass with a Capture (below): it keeps the gradients arriving at
// its inputs and skips nodes that do not lead to them. backward(), DDP's path, has none.
// Why the order matters: running the latest-created node first makes backward visit layers last
// to first, so gradients become ready in the reverse of registration order, which is the order
// DDP's buckets are laid out in (see docs/autograd.md).
#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "autograd/accumulate_grad.h"
#include "tensor/ops.h"

namespace ddplab::autograd {

namespace {

struct Capture;

// The ready queue entry: higher sequence_nr first; ties (several AccumulateGrad nodes) first in,
// first out so that the order is deterministic.
struct ReadyItem {
  uint64_t sequence_nr;
  uint64_t order;
  Node* node;
  bool operator<(const ReadyItem& o) const {
    if (sequence_nr != o.sequence_nr) return sequence_nr < o.sequence_nr;
    return order > o.order;
  }
};

struct GraphTask {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;  // summed input gradients per node
  std::priority_queue<ReadyItem> ready;
  uint64_t pushed = 0;  // ReadyItem::order of the next push
  std::vector<std::function<void()>> callbacks;
  Capture* capture = nullptr;  // set only by grad(); backward() leaves it null

  void push_ready(Node* n) { ready.push({n->sequence_nr, pushed++, n}); }
};

thread_local GraphTask* current_task = nullptr;

// Restores the outer task (a hook may itself call backward, e.g. for gradient checkpointing).
struct TaskScope {
  GraphTask* prev;
  explicit TaskScope(GraphTask* t) : prev(current_task) { current_task = t; }
  ~TaskScope() { current_task = prev; }
};

// Whether `t` may be summed into in place: nothing but t itself sees its memory (no other
// tensor, view or saved copy), and its elements are distinct and dense (an expanded view, such as
// sum's gradient, repeats one element).
bool writable_sum(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 &&
         ops::is_contiguous(t, ops::suggest_memory_format(t));
}

void add_into(std::vector<Tensor>& buffer, uint32_t slot, const Tensor& g) {
  if (buffer.size() <= slot) buffer.resize(slot + 1);
  Tensor& b = buffer[slot];
  if (!b.defined()) {
    b = g;
  } else if (writable_sum(b) && b.shape() == g.shape() && b.dtype() == g.dtype() &&
             b.device() == g.device()) {
    // In place, as PyTorch's InputBuffer does when no one else holds the sum so far: it saves
    // a fresh buffer per sum (the residual networks sum a gradient at every block).
    ops::add_(b, g);
  } else {
    // Out of place: either operand may be a view that another node still reads.
    b = ops::add(b, g);
  }
}

// Step 1: count dependencies of every node reachable from `roots` (iteratively: graphs of deep
// networks are long chains). Fills `nodes` with every reached node.
void count_dependencies(GraphTask& task, const std::vector<Edge>& roots,
                        std::vector<Node*>& nodes) {
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const Edge& e : roots) {
    if (e.valid() && !seen[e.fn.get()]) {
      seen[e.fn.get()] = true;
      stack.push_back(e.fn.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    nodes.push_back(n);
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      task.dependencies[e.fn.get()] += 1;
      if (!seen[e.fn.get()]) {
        seen[e.fn.get()] = true;
        stack.push_back(e.fn.get());
      }
    }
  }
}

// What grad() adds to a pass: it keeps the gradients arriving at its inputs' (node, slot) pairs
// and runs only the nodes that lead there. Leaves' AccumulateGrad never runs, so .grad is left
// alone. backward() has no Capture: every reached node runs.
struct Capture {
  // node -> (input slot, index into `result`) of each gradient to keep.
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> targets;
  std::vector<Tensor> result;
  std::unordered_map<Node*, bool> needed;

  // A node is needed when it is a target or leads to one. Computed by relaxing until nothing
  // changes (simple and fine for the graph sizes gradcheck uses).
  void mark_needed(const std::vector<Node*>& nodes) {
    for (Node* n : nodes) needed[n] = targets.count(n) > 0;
    bool changed = true;
    while (changed) {
      changed = false;
      for (Node* n : nodes) {
        if (needed[n]) continue;
        for (const Edge& e : n->next_edges) {
          if (e.valid() && needed[e.fn.get()]) {
            needed[n] = true;
            changed = true;
            break;
          }
        }
      }
    }
  }

  // Keeps the node's target gradients; returns whether the node must run.
  bool take(Node* node, const std::vector<Tensor>& inputs) {
    auto t = targets.find(node);
    if (t != targets.end()) {
      for (auto [slot, out_index] : t->second) {
        if (slot < inputs.size() && inputs[slot].defined()) result[out_index] = inputs[slot];
      }
    }
    if (dynamic_cast<AccumulateGrad*>(node) != nullptr) return false;
    for (const Edge& e : node->next_edges) {
      if (e.valid() && needed[e.fn.get()]) return true;
    }
    return false;
  }
};

Edge root_edge(const Tensor& root, size_t i) {
  DDP_CHECK(root.defined(), "backward: root " << i << " is an undefined tensor");
  DDP_CHECK(root.requires_grad(), "backward: root " << i << " (shape " << shape_str(root.shape())
                                                    << ") does not require grad and has no "
                                                       "grad_fn; did you run the forward under "
                                                       "no_grad or forget set_requires_grad()?");
  return gradient_edge(root);
}

Tensor root_grad(const Tensor& root, const std::vector<Tensor>& grad_roots, size_t i) {
  if (i < grad_roots.size() && grad_roots[i].defined()) {
    DDP_CHECK(grad_roots[i].shape() == root.shape(),
              "backward: grad_output " << i << " has shape " << shape_str(grad_roots[i].shape())
                                       << " but the root has shape " << shape_str(root.shape()));
    return grad_roots[i];
  }
  DDP_CHECK(root.numel() == 1, "backward: the root has shape "
                                   << shape_str(root.shape())
                                   << "; a gradient can be implied only for a one-element "
                                      "(scalar) root. Pass grad_output of shape "
                                   << shape_str(root.shape()) << ", or reduce with sum()/mean()");
  return ops::ones_like(root);
}

// Step 2: the roots' buffers get grad_roots; roots with nothing to wait for are ready.
void seed_roots(GraphTask& task, const std::vector<Edge>& edges, const std::vector<Tensor>& roots,
                const std::vector<Tensor>& grad_roots) {
  for (size_t i = 0; i < roots.size(); ++i) {
    add_into(task.buffers[edges[i].fn.get()], edges[i].input_nr,
             root_grad(roots[i], grad_roots, i));
  }
  std::unordered_map<Node*, bool> pushed;
  for (const Edge& e : edges) {
    Node* n = e.fn.get();
    if (task.dependencies[n] == 0 && !pushed[n]) {
      pushed[n] = true;
      task.push_ready(n);
    }
  }
}

// Step 3 for one node: pre-hooks, apply() (for an AccumulateGrad: add into .grad, then the
// post-accumulate hooks), and the produced gradients handed to the next nodes.
void run_node(GraphTask& task, Node* node, bool retain_graph) {
  std::vector<Tensor> inputs = std::move(task.buffers[node]);
  task.buffers.erase(node);

  for (auto& [slot, hook] : node->tensor_pre_hooks) {
    if (slot < inputs.size() && inputs[slot].defined()) {
      Tensor r = hook(inputs[slot]);
      if (r.defined()) inputs[slot] = r;
    }
  }
  // Only grad() may skip a node (and it keeps the gradients it wants here).
  const bool run = task.capture == nullptr || task.capture->take(node, inputs);
  bool any_input = false;
  for (const Tensor& t : inputs) any_input = any_input || t.defined();

  std::vector<Tensor> outputs;
  if (run && any_input) {
    outputs = node->apply(std::move(inputs));
    if (!retain_graph) node->release_saved();
    DDP_CHECK(
        outputs.size() <= node->next_edges.size() || dynamic_cast<AccumulateGrad*>(node) != nullptr,
        node->name() << " returned " << outputs.size() << " gradients for "
                     << node->next_edges.size() << " inputs");
  } else if (run && !retain_graph) {
    node->release_saved();
  }

  for (size_t i = 0; i < node->next_edges.size(); ++i) {
    const Edge& e = node->next_edges[i];
    if (!e.valid()) continue;
    Node* next = e.fn.get();
    if (i < outputs.size() && outputs[i].defined()) {
      add_into(task.buffers[next], e.input_nr, outputs[i]);
    }
    // The dependency is consumed even when no gradient flowed (an undefined gradient), so
    // that nodes downstream of a non-differentiable path still run.
    if (--task.dependencies[next] == 0) task.push_ready(next);
  }
}

// The pass, steps 1 to 4 (see the top of this file). backward() and grad() both run it; grad()
// sets task.capture first.
void run_graph(GraphTask& task, const std::vector<Tensor>& roots,
               const std::vector<Tensor>& grad_roots, bool retain_graph) {
  DDP_CHECK(!roots.empty(), "backward: no roots given");
  DDP_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(),
            "backward: " << roots.size() << " roots but " << grad_roots.size() << " grad_outputs");
  std::vector<Edge> edges;
  for (size_t i = 0; i < roots.size(); ++i) edges.push_back(root_edge(roots[i], i));

  std::vector<Node*> nodes;
  count_dependencies(task, edges, nodes);
  if (task.capture != nullptr) task.capture->mark_needed(nodes);

  // Gradients run without recording a graph (no double backward in ddplab).
  NoGradGuard no_grad;
  TaskScope scope(&task);

  seed_roots(task, edges, roots, grad_roots);
  while (!task.ready.empty()) {
    Node* node = task.ready.top().node;
    task.ready.pop();
    run_node(task, node, retain_graph);
  }

  // Step 4. Callbacks may queue further callbacks; run until none are left.
  for (size_t i = 0; i < task.callbacks.size(); ++i) {
    std::function<void()> cb = std::move(task.callbacks[i]);
    cb();
  }
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph) {
  GraphTask task;
  run_graph(task, roots, grad_roots, retain_graph);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  Capture capture;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DDP_CHECK(inputs[i].defined() && inputs[i].requires_grad(),
              "grad: input " << i << " does not require grad");
    Edge e = gradient_edge(inputs[i]);
    capture.targets[e.fn.get()].emplace_back(e.input_nr, i);
  }
  // Hold the edges' nodes alive: a leaf's AccumulateGrad may exist only through this edge.
  std::vector<std::shared_ptr<Node>> keep;
  for (size_t i = 0; i < inputs.size(); ++i) keep.push_back(gradient_edge(inputs[i]).fn);
  capture.result.resize(inputs.size());
  GraphTask task;
  task.capture = &capture;
  run_graph(task, outputs, grad_outputs, retain_graph);
  return capture.result;  // undefined where an input is not reached from the outputs
}

void queue_callback(std::function<void()> callback) {
  DDP_CHECK(current_task != nullptr,
            "queue_callback: no backward pass is running (call it from a hook during backward)");
  current_task->callbacks.push_back(std::move(callback));
}

std::unordered_set<const TensorImpl*> reachable_leaves(const std::vector<Tensor>& roots) {
  std::unordered_set<const TensorImpl*> leaves;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Tensor& r : roots) {
    if (!r.defined() || !r.requires_grad()) continue;
    if (r.is_leaf()) {
      leaves.insert(r.impl_ptr().get());
      continue;
    }
    Node* n = r.grad_fn().get();
    if (seen.insert(n).second) stack.push_back(n);
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n == nullptr) continue;
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      leaves.insert(acc->variable().impl_ptr().get());
      continue;
    }
    for (const Edge& e : n->next_edges) {
      if (e.valid() && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
  return leaves;
}

}  // namespace ddplab::autograd
