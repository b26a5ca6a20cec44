// SyncBatchNorm: batch normalisation whose statistics span every rank of a process group
// (PyTorch's torch.nn.SyncBatchNorm), and the conversions between it and BatchNorm2d.
//
// Under DDP each rank sees only its slice of the global batch. BatchNorm2d normalises with that
// slice's statistics, which for small per-rank batches are noisy; SyncBatchNorm normalises with
// the statistics of the whole global batch, so N ranks of batch B train like one process with
// batch N * B. It costs one collective in forward and one in backward per layer.
//
//   auto model = models::create("resnet20", 10);
//   nn::SyncBatchNorm::convert_sync_batchnorm(model, pg);  // every BatchNorm2d, in place
//   distributed::DistributedDataParallel ddp(model, pg);
//
// How it works, and why the statistics are all-gathered rather than all-reduced: see the Note at
// the top of nn/sync_batchnorm.cpp.
#pragma once

#include <memory>
#include <string>

#include "comm/process_group.h"
#include "nn/layers.h"

namespace ddplab::nn {

// Unlike PyTorch's (a sibling of BatchNorm2d), ddplab's SyncBatchNorm derives from BatchNorm2d:
// it has exactly its parameters, buffers and checks (4-D input), and a model's
// `std::shared_ptr<BatchNorm2d> bn1` member can hold it after conversion.
//
// Training forward uses the global batch statistics when the group has more than one rank.
// Without a group (ddplab has no implicit global group: pass the one from init_process_group),
// with a group of one rank, in eval mode with running statistics, it is BatchNorm2d exactly, and
// communicates nothing.
class SyncBatchNorm : public BatchNorm2d {
 public:
  explicit SyncBatchNorm(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                         bool affine = true, bool track_running_stats = true,
                         std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);
  // Holds `bn`'s own parameters and buffers (see BatchNorm2d's ShareState constructor).
  SyncBatchNorm(const BatchNorm2d& bn, std::shared_ptr<distributed::ProcessGroup> process_group);

  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "SyncBatchNorm"; }
  bool runs_collectives() const override { return true; }

  // Replaces every BatchNorm2d in `module`'s tree by a SyncBatchNorm on `process_group` that
  // holds the same parameter and buffer tensors, under the same names (checkpoints load either
  // way). Children are replaced in place (members bound with register_module follow, see
  // nn/module.h); the result is returned, which differs from `module` only when `module` is
  // itself a BatchNorm2d. Existing SyncBatchNorms are left as they are.
  static ModulePtr convert_sync_batchnorm(
      const ModulePtr& module, std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);

  std::shared_ptr<distributed::ProcessGroup> process_group;
};

// The same as SyncBatchNorm::convert_sync_batchnorm.
ModulePtr convert_sync_batchnorm(
    const ModulePtr& module, std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);
// The inverse: every SyncBatchNorm becomes a BatchNorm2d holding the same tensors (e.g. to
// evaluate or export a model trained with DDP in one process).
ModulePtr revert_sync_batchnorm(const ModulePtr& module);

namespace functional {

// batch_norm in training mode with the statistics of the whole group's batch: the differentiable
// function behind SyncBatchNorm. Input [N, C, ...] with N >= 0 on each rank (an empty rank still
// takes part). Updates running_mean/running_var (if defined) identically on every rank with the
// global unbiased variance. Every rank of `group` must call it, in the same order as its other
// collectives. A null group means this process alone (the same formulas, no communication).
Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const std::shared_ptr<distributed::ProcessGroup>& group);

}  // namespace functional

}  // namespace ddplab::nn
