// The backward engine: runs the graph from the roots to the leaves.
#pragma once

#include <functional>
#include <unordered_set>
#include <vector>

#include "autograd/node.h"

namespace ddplab::autograd {

// Backpropagates grad_roots (ones for a scalar root when empty) from roots. A node runs once the
// gradients flowing into it from every consumer have been summed. Without retain_graph, saved
// tensors are freed as nodes finish.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {},
              bool retain_graph = false);

// Gradients of outputs w.r.t. inputs without touching .grad (for gradcheck and double checks).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

// Registers a callback that runs once the current backward pass has finished all nodes (DDP
// waits for its last all-reduces there). Only valid while a backward pass runs.
void queue_callback(std::function<void()> callback);

// The leaves (by TensorImpl) that a backward from `roots` would reach: DDP's
// find_unused_parameters walks the graph after forward with this.
std::unordered_set<const TensorImpl*> reachable_leaves(const std::vector<Tensor>& roots);

}  // namespace ddplab::autograd
