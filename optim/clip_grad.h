// Gradient clipping by global norm (PyTorch's torch.nn.utils.clip_grad_norm_).
#pragma once

#include <limits>
#include <vector>

#include "tensor/tensor.h"

namespace ddplab::optim {

// The norm of all gradients taken together (the norm of the per-tensor norms); when it exceeds
// max_norm, every gradient is scaled by max_norm / (total + 1e-6). norm_type may be infinity.
// Returns the total norm before clipping. Parameters without a gradient are ignored.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2,
                       bool error_if_nonfinite = false);

constexpr double kInfNorm = std::numeric_limits<double>::infinity();

}  // namespace ddplab::optim
