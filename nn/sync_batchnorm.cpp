// SyncBatchNorm (see nn/sync_batchnorm.h): statistics over every rank's batch, one collective in
// forward, one in backward.
//
// Note [SyncBatchNorm: combining statistics across ranks]
// =====================================================
// BatchNorm2d normalises channel c with the mean and (biased) variance of the M values it sees.
// SyncBatchNorm must produce what BatchNorm2d would produce on the concatenation of every rank's
// batch, so it needs the global mean and variance over M = M_0 + M_1 + ... values.
//
// Why the per-rank means cannot simply be all-reduced (averaged). The global mean is the
// count-weighted average  mean = sum_r M_r * mean_r / M.  Averaging the means gives each rank the
// same weight 1/R, which is right only when every M_r is equal; with uneven batches (the last
// batch of an epoch, a rank with fewer samples, a rank with none) it is wrong. The variance is
// worse: it is not an average of per-rank variances at all, because each rank's deviations are
// measured from its own mean. Chan et al.'s parallel formula fixes that exactly:
//
//     M2   = sum_r [ M2_r + M_r * (mean_r - mean)^2 ],    var = M2 / M,
//
// where M2_r = sum over rank r's values of (x - mean_r)^2. So each rank contributes its count, mean
// and M2 per channel. These are packed into one buffer [count, mean (C), M2 (C)] and all-gathered
// in ONE collective; every rank then combines the R rows identically, in float64. (Summing
// count, sum and sum of squares with one all-reduce would also be exact in exact arithmetic, but
// E[x^2] - E[x]^2 cancels catastrophically when the mean is large compared with the spread;
// mean and M2 do not.) The running statistics are then updated with the global unbiased
// variance M2 / (M - 1), the same on every rank, so the replicas stay identical.
//
// Backward needs two per-channel sums over the GLOBAL batch, because every output depends on
// every input through the mean and variance: with xhat = (x - mean) * invstd,
//
//     dx = weight * invstd * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M).
//
// Each rank computes its local sum(dy) and sum(dy * (x - mean)), packs them into one buffer and
// ONE all-reduce (SUM) gives the global sums. The weight and bias gradients, sum(dy * xhat) and
// sum(dy), stay local: they are gradients of parameters, which DDP's reducer averages anyway.
//
// Why a rank with an empty batch must still join. Collectives are matched by position: the k-th
// collective a rank issues pairs with the k-th collective of every other rank. If a rank with no
// data skipped the layer, the others would wait in their all-gather forever (or until the
// timeout), or worse, its next collective (the next layer's, or a DDP bucket's all-reduce) would
// be paired with this one, mixing unrelated buffers. So an empty rank calls the same collectives
// and contributes count 0 (its mean and M2 rows are zeros, weighted by 0). For the same reason,
// every rank must run the backward of every SyncBatchNorm it ran forward: a rank whose loss does
// not depend on a layer's output would skip that layer's all-reduce.
//
// The local work runs batch_norm's own steps (nn/batchnorm_kernels.h: its CPU kernels, or the
// same formulas in generic tensor ops on CUDA); this file adds the collectives and the
// combination. Whenever there is nothing to synchronise, SyncBatchNorm is BatchNorm2d itself.
#include "nn/sync_batchnorm.h"

#include <functional>
#include <utility>
#include <vector>

#include "autograd/function_node.h"
#include "autograd/functions.h"
#include "comm/join.h"
#include "nn/batchnorm_kernels.h"
#include "tensor/ops.h"

namespace ddplab::nn {

namespace functional {

namespace {

// This rank's [count, mean (C), M2 (C)] in float64: the row it contributes to the all-gather.
Tensor local_moments(const Tensor& x) {
  const int64_t c = x.size(1);
  const int64_t count = x.numel() / c;
  Tensor row = ops::zeros({2 * c + 1}, {kFloat64, x.device()});
  ops::fill_(ops::narrow(row, 0, 0, 1), static_cast<double>(count));
  if (count == 0) return row;  // mean and M2 stay 0; weighted by count 0 they add nothing
  const BatchNormMoments m = batch_norm_moments(x);
  ops::copy_(ops::narrow(row, 0, 1, c), m.mean);
  ops::copy_(ops::narrow(row, 0, 1 + c, c), m.m2);
  return row;
}

struct GlobalMoments {
  double count;
  Tensor mean, var;  // [C] float64; var is biased (divided by count)
};

// Chan's parallel combination of the gathered rows [R, 2C + 1] (see the Note).
GlobalMoments combine(const Tensor& rows, int64_t c) {
  Tensor counts = ops::narrow(rows, 1, 0, 1);  // [R, 1]
  Tensor means = ops::narrow(rows, 1, 1, c);   // [R, C]
  Tensor m2s = ops::narrow(rows, 1, 1 + c, c);
  const double total = ops::sum_all(counts);
  DDP_CHECK(total > 1,
            "sync_batch_norm: expected more than 1 value per channel over all ranks "
            "when training, got "
                << total);
  Tensor mean = ops::div(ops::sum(ops::mul(counts, means), {0}), total);
  Tensor spread = ops::mul(counts, ops::square(ops::sub(means, mean)));
  Tensor m2 = ops::add(ops::sum(m2s, {0}), ops::sum(spread, {0}));
  return {total, mean, ops::div(m2, total)};
}

// running = (1 - momentum) * running + momentum * stat, computed in float64 as BatchNorm2d does.
void update_running(const Tensor& running, const Tensor& stat, double momentum) {
  Tensor r = ops::to(running, kFloat64);
  ops::axpby_(r, 1 - momentum, stat, momentum);
  ops::copy_(running, r);
}

}  // namespace

Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const std::shared_ptr<distributed::ProcessGroup>& group) {
  DDP_CHECK(x.defined() && x.dim() >= 2,
            "sync_batch_norm: expected input [N, C, ...], got " << shape_str(x.shape()));
  // bfloat16 activations (autocast, Note [Autocast]) run the float32 path on a widened copy and
  // come back rounded, with float32 parameter gradients; the statistics are double either way.
  if (x.dtype() == kBFloat16) {
    return ddplab::to(sync_batch_norm(ddplab::to(x, kFloat32), running_mean, running_var, weight,
                                      bias, momentum, eps, group),
                      kBFloat16);
  }
  DDP_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64,
            "sync_batch_norm: supports float32 and float64, got " << dtype_name(x.dtype()));
  DDP_CHECK(running_mean.defined() == running_var.defined(),
            "sync_batch_norm: pass both running_mean and running_var, or neither");
  const int64_t c = x.size(1);

  // Forward: one all-gather of [count, mean, M2] rows, then the same combination on every rank.
  // A joined rank replaying an iteration (comm/join.h) takes part with a count of 0.
  const bool shadow = distributed::is_join_shadowing();
  Tensor mine = local_moments(x);
  if (shadow) ops::zero_(mine);
  const int world = group ? group->size() : 1;
  Tensor rows = ops::empty({world, 2 * c + 1}, {kFloat64, x.device()});
  if (group) {
    std::vector<Tensor> outputs;
    outputs.reserve(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) outputs.push_back(ops::select(rows, 0, r));
    group->all_gather(outputs, mine)->wait();
  } else {
    ops::copy_(rows, ops::reshape(mine, {1, 2 * c + 1}));
  }
  const GlobalMoments g = combine(rows, c);
  Tensor invstd = ops::rsqrt(ops::add(g.var, eps));

  if (running_mean.defined()) {
    autograd::NoGradGuard no_grad;
    update_running(running_mean, g.mean, momentum);
    update_running(running_var, ops::mul(g.var, g.count / (g.count - 1)), momentum);
  }
  Tensor y = batch_norm_normalize(x, g.mean, invstd, weight, bias);

  std::vector<Tensor> inputs{x};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  const bool has_w = weight.defined(), has_b = bias.defined();
  autograd::Saved saved{x, g.mean, invstd};
  if (has_w) saved.push_back(weight);
  const double count = g.count;
  return autograd::record(
      "SyncBatchNormBackward", y, inputs, std::move(saved),
      [group, count, has_w, has_b, shadow](const Tensor& dy, const autograd::Saved& s,
                                           const autograd::Needs& needs) {
        const Tensor &x = s[0], &mean = s[1], &invstd = s[2];
        const int64_t c = x.size(1);
        // This rank's [sum(dy), sum(dy * (x - mean))], packed for the one all-reduce.
        Tensor sums = batch_norm_grad_sums(x, dy, mean);
        if (shadow) ops::zero_(sums);  // a joined rank's replay adds nothing
        autograd::Grads grads(needs.size());
        const size_t iw = 1, ib = has_w ? 2 : 1;
        // Parameter gradients from the local sums (DDP averages them across ranks). Copies:
        // `sums` is all-reduced in place below, and to() of a float64 tensor is the tensor itself.
        if (has_w && needs[iw]) {
          grads[iw] = ops::to(ops::mul(ops::narrow(sums, 0, c, c), invstd), x.dtype());
        }
        if (has_b && needs[ib])
          grads[ib] = ops::to(ops::clone(ops::narrow(sums, 0, 0, c)), x.dtype());
        // Every rank runs the same graph, so either all of them need dx (and all-reduce) or none.
        if (needs[0]) {
          if (group) group->all_reduce(sums, distributed::ReduceOp::Sum)->wait();
          grads[0] =
              batch_norm_input_grad(x, dy, mean, invstd, has_w ? s[3] : Tensor(), sums, count);
        }
        return grads;
      });
}

}  // namespace functional

// --- the module --------------------------------------------------------------------------------

SyncBatchNorm::SyncBatchNorm(int64_t num_features, double eps, double momentum, bool affine,
                             bool track_running_stats,
                             std::shared_ptr<distributed::ProcessGroup> process_group)
    : BatchNorm2d(num_features, eps, momentum, affine, track_running_stats),
      process_group(std::move(process_group)) {}

SyncBatchNorm::SyncBatchNorm(const BatchNorm2d& bn,
                             std::shared_ptr<distributed::ProcessGroup> process_group)
    : BatchNorm2d(bn, ShareState{}), process_group(std::move(process_group)) {}

Tensor SyncBatchNorm::forward(const Tensor& x) {
  // Only training synchronises (as PyTorch): eval normalises with the running statistics, which
  // are already equal on every rank, or (without them) with each rank's own batch.
  if (!is_training() || !process_group || process_group->size() == 1) {
    return BatchNorm2d::forward(x);
  }
  DDP_CHECK(x.dim() == 4 && x.size(1) == num_features,
            "SyncBatchNorm(" << num_features << "): expected input [N, " << num_features
                             << ", H, W], got " << shape_str(x.shape()));
  if (track_running_stats) {
    autograd::NoGradGuard no_grad;
    ops::add_(num_batches_tracked, 1.0);
  }
  return functional::sync_batch_norm(x, running_mean, running_var, weight, bias, momentum, eps,
                                     process_group);
}

// --- conversion --------------------------------------------------------------------------------

namespace {

// Walks the tree from `module`: where swap(m) returns a module, that module takes m's place
// (children through replace_module, so bound members follow); elsewhere it descends.
ModulePtr swap_modules(const ModulePtr& module,
                       const std::function<ModulePtr(const ModulePtr&)>& swap) {
  if (ModulePtr replacement = swap(module)) return replacement;
  // A copy of the list: replace_module rewrites entries of the original.
  const auto children = module->named_children();
  for (const auto& [name, child] : children) {
    ModulePtr converted = swap_modules(child, swap);
    if (converted != child) module->replace_module(name, converted);
  }
  return module;
}

}  // namespace

ModulePtr SyncBatchNorm::convert_sync_batchnorm(
    const ModulePtr& module, std::shared_ptr<distributed::ProcessGroup> process_group) {
  return swap_modules(module, [&](const ModulePtr& m) -> ModulePtr {
    if (dynamic_cast<SyncBatchNorm*>(m.get())) return m;
    if (auto* bn = dynamic_cast<BatchNorm2d*>(m.get()))
      return std::make_shared<SyncBatchNorm>(*bn, process_group);
    return nullptr;
  });
}

ModulePtr convert_sync_batchnorm(const ModulePtr& module,
                                 std::shared_ptr<distributed::ProcessGroup> process_group) {
  return SyncBatchNorm::convert_sync_batchnorm(module, std::move(process_group));
}

ModulePtr revert_sync_batchnorm(const ModulePtr& module) {
  return swap_modules(module, [](const ModulePtr& m) -> ModulePtr {
    if (auto* sbn = dynamic_cast<SyncBatchNorm*>(m.get()))
      return std::make_shared<BatchNorm2d>(*sbn, BatchNorm2d::ShareState{});
    return nullptr;
  });
}

}  // namespace ddplab::nn
