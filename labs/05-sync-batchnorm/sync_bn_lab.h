// Lab 5: SyncBatchNorm with one collective in forward and one in backward. The functions the
// student writes (starter/, graded by grader/grader.cpp against BatchNorm2d on the concatenated
// batch and against the library's nn::SyncBatchNorm), and the layer built from them
// (sync_bn_layer.cpp, given). Handout: README.md.
//
// Every tensor the student's functions see is float64 and contiguous (the layer converts): x and
// dy are [N, C, H, W], where N may differ between ranks and may be 0; per-channel tensors are [C].
// Element (n, c, h, w) of x is x.data_ptr<double>()[(n * C + c) * S + h * W + w], S = H * W.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/process_group.h"
#include "nn/layers.h"

namespace lab5 {

using ddplab::Tensor;
using ddplab::distributed::ProcessGroup;

// The statistics every rank normalises with: those of the concatenation of all ranks' batches.
struct BatchStats {
  Tensor mean;        // [C]
  Tensor var;         // [C], biased: divided by count, as batch norm normalises
  int64_t count = 0;  // values per channel over all ranks: the sum of N_r * H * W
};

// Part 1. The global per-channel mean and biased variance of x over every rank of `pg`, with ONE
// all_reduce (SUM) of one float64 buffer holding, per channel, the count, sum(x - shift) and
// sum((x - shift)^2). `shift` [C] is any value per channel that every rank agrees on (the layer
// passes running_mean): the sums are taken of x - shift so that they stay small when the values
// are large but close together. Every rank calls it, also one whose N is 0.
BatchStats global_batch_stats(const Tensor& x, const Tensor& shift, ProcessGroup& pg);

// Part 2. y = (x - mean) / sqrt(var + eps) * weight + bias, per channel (local: no collective).
Tensor normalize(const Tensor& x, const BatchStats& stats, const Tensor& weight, const Tensor& bias,
                 double eps);

// Part 2. PyTorch's running-statistics rule, in place on the [C] buffers:
//   running = (1 - momentum) * running + momentum * batch statistic,
// where running_var takes the UNBIASED variance var * count / (count - 1).
void update_running_stats(const Tensor& running_mean, const Tensor& running_var,
                          const BatchStats& stats, double momentum);

// Part 3. The backward of normalize for the loss L whose gradient dL/dy is `dy` (this rank's
// rows), with ONE all_reduce (SUM) of one buffer holding the per-channel sum(dy) and
// sum(dy * xhat), xhat = (x - mean) / sqrt(var + eps). Every output depends on every rank's
// inputs through the mean and variance, so dx needs these sums over the GLOBAL batch:
//   dx = weight / sqrt(var + eps) * (dy - sum(dy) / count - xhat * sum(dy * xhat) / count).
// dweight = sum(dy * xhat) and dbias = sum(dy) are this rank's LOCAL sums (as in the library:
// they are parameter gradients, which DDP then averages over ranks like any other).
struct BackwardResult {
  Tensor dx;       // [N, C, H, W]
  Tensor dweight;  // [C]
  Tensor dbias;    // [C]
};
BackwardResult sync_batch_norm_backward(const Tensor& dy, const Tensor& x, const BatchStats& stats,
                                        const Tensor& weight, double eps, ProcessGroup& pg);

// --- the layer, built from the parts above (sync_bn_layer.cpp) ---------------------------------

// Values per channel of one rank's batch: N * H * W, and S = H * W (the stride of a channel).
int64_t spatial_size(const Tensor& x);

// Training-mode batch norm over the whole group, differentiable: your parts 1 and 2 forward,
// your part 3 as its backward. Any float dtype (computed in float64, returned in x's dtype);
// weight and bias may be undefined (affine=false); running_mean/var may be undefined.
Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const std::shared_ptr<ProcessGroup>& pg);

// Your layer: BatchNorm2d whose training statistics span the group (eval mode: BatchNorm2d with
// the running statistics, no communication). It holds `bn`'s own tensors, as the library's does.
class SyncBatchNorm : public ddplab::nn::BatchNorm2d {
 public:
  SyncBatchNorm(const ddplab::nn::BatchNorm2d& bn, std::shared_ptr<ProcessGroup> pg);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "lab5::SyncBatchNorm"; }
  std::shared_ptr<ProcessGroup> process_group;
};

// Replaces every BatchNorm2d in `module`'s tree by your SyncBatchNorm on `pg` (in place, as
// nn::convert_sync_batchnorm does with the library's). Returns how many it replaced.
int convert_sync_batchnorm(const ddplab::nn::ModulePtr& module,
                           const std::shared_ptr<ProcessGroup>& pg);

}  // namespace lab5
