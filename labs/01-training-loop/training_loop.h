// Lab 1: a training loop from scratch. The four functions the student writes (in starter/,
// graded by grader/grader.cpp; solution/ is the course staff's version). The handout is
// README.md beside this file.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace lab1 {

using ddplab::Tensor;

// Part 1. A fully connected layer, y = x W^T + b, built from the differentiable ops of
// autograd/functions.h so that backward() reaches `weight` and `bias`.
//   x: [N, in], weight: [out, in], bias: [out]  ->  [N, out]
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// Part 2. The mean cross-entropy of `logits` [N, C] against class indices `target` (int64 [N]):
//   loss = mean_i ( logsumexp(logits[i, :]) - logits[i, target[i]] ),
// computed stably (subtract each row's maximum before exp) and differentiable.
Tensor cross_entropy(const Tensor& logits, const Tensor& target);

// Part 3. One step of SGD with momentum, in place, with PyTorch's update rule:
//   buf = grad                      on the first step (buf undefined),
//   buf = momentum * buf + grad     afterwards,
//   param = param - lr * buf.
// `buffers` has one entry per parameter, undefined before the first step; the function sets it.
// Parameters whose grad() is undefined are skipped. Runs outside the graph.
void sgd_step(const std::vector<Tensor>& params, std::vector<Tensor>& buffers, double lr,
              double momentum);

// Part 4. A two-layer MLP, relu(x W1^T + b1) W2^T + b2, trained full-batch on (x, y) for `steps`
// steps with your cross_entropy and sgd_step: zero the gradients, forward, loss, backward,
// step. params = {W1, b1, W2, b2} (leaves that require grad), updated in place. Returns the loss
// of every step, measured before that step's update.
std::vector<double> train(const std::vector<Tensor>& params, const Tensor& x, const Tensor& y,
                          int64_t steps, double lr, double momentum);

}  // namespace lab1
