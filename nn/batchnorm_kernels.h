// The steps of batch_norm's training path, for SyncBatchNorm (nn/sync_batchnorm.cpp), which runs
// a collective between them. They are PyTorch's batch_norm_stats, batch_norm_elemt,
// batch_norm_backward_reduce and batch_norm_backward_elemt.
//
// x and dy are [N, C, ...]; every per-channel statistic or sum is a float64 [C] tensor on x's
// device. CPU tensors run batch_norm's own kernels; other devices run the same formulas written
// with generic tensor ops (both in nn/batchnorm_steps.cpp). `generic = true` picks those on the
// CPU too, so the tests can hold the two versions together.
#pragma once

#include "tensor/tensor.h"

namespace ddplab::nn::functional {

// Per-channel mean and M2 = sum((x - mean)^2), in two passes in double. x must not be empty.
struct BatchNormMoments {
  Tensor mean, m2;
};
BatchNormMoments batch_norm_moments(const Tensor& x, bool generic = false);

// y = (x - mean) * invstd * weight + bias (weight, bias: x's dtype, or undefined).
Tensor batch_norm_normalize(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                            const Tensor& weight, const Tensor& bias, bool generic = false);

// [sum(dy), sum(dy * (x - mean))] per channel, packed into one float64 [2C] tensor (one buffer
// for SyncBatchNorm's all-reduce).
Tensor batch_norm_grad_sums(const Tensor& x, const Tensor& dy, const Tensor& mean,
                            bool generic = false);

// Training-mode input gradient from `sums` (as batch_norm_grad_sums packs them) taken over all
// `count` values of each channel:
//   dx = weight * invstd * (dy - sum_dy / count - (x - mean) * invstd^2 * sum_dy_xmu / count).
Tensor batch_norm_input_grad(const Tensor& x, const Tensor& dy, const Tensor& mean,
                             const Tensor& invstd, const Tensor& weight, const Tensor& sums,
                             double count, bool generic = false);

}  // namespace ddplab::nn::functional
