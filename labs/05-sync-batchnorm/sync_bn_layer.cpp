// Lab 5's layer (given, not graded on its own): the student's three parts wired into an autograd
// function and a module, the way nn/sync_batchnorm.cpp wires the library's. Read it to see where
// each of your functions runs; nothing here communicates except through them.
#include <utility>

#include "autograd/function_node.h"
#include "sync_bn_lab.h"
#include "tensor/ops.h"

namespace lab5 {

using namespace ddplab;

int64_t spatial_size(const Tensor& x) {
  int64_t s = 1;
  for (int64_t d = 2; d < x.dim(); ++d) s *= x.size(d);
  return s;
}

namespace {

// The student's functions work in float64 on contiguous memory. to() returns the tensor itself
// when it is float64 already: callers must not write into the result.
Tensor as_f64(const Tensor& t) {
  return ops::contiguous(ops::to(t, kFloat64));
}

// The affine parameters as float64 [C]; without them (affine=false) the identity: 1 and 0.
Tensor param_or(const Tensor& p, int64_t c, double identity) {
  return p.defined() ? as_f64(p) : ops::full({c}, identity, kFloat64);
}

}  // namespace

Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const std::shared_ptr<ProcessGroup>& pg) {
  DDP_CHECK(x.defined() && x.dim() >= 2,
            "lab5::sync_batch_norm: expected input [N, C, ...], got " << shape_str(x.shape()));
  DDP_CHECK(pg != nullptr, "lab5::sync_batch_norm: needs a process group");
  const int64_t c = x.size(1);
  const Tensor x64 = as_f64(x);
  // The shift: a value per channel every rank already holds, near the mean once training runs.
  const Tensor shift = running_mean.defined() ? as_f64(running_mean) : ops::zeros({c}, kFloat64);
  BatchStats stats = global_batch_stats(x64, shift, *pg);  // part 1: the forward's collective
  DDP_CHECK(stats.count > 1,
            "lab5::sync_batch_norm: expected more than 1 value per channel over all ranks "
            "when training, got "
                << stats.count);
  if (running_mean.defined()) {
    autograd::NoGradGuard no_grad;
    // Updated in float64 copies, then written back (copies: the buffers are float32).
    Tensor mean = ops::clone(as_f64(running_mean)), var = ops::clone(as_f64(running_var));
    update_running_stats(mean, var, stats, momentum);  // part 2
    ops::copy_(running_mean, mean);
    ops::copy_(running_var, var);
  }
  const Tensor w = param_or(weight, c, 1.0);
  Tensor y = ops::to(normalize(x64, stats, w, param_or(bias, c, 0.0), eps), x.dtype());  // part 2

  std::vector<Tensor> inputs{x};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  const bool has_w = weight.defined(), has_b = bias.defined();
  const int64_t count = stats.count;
  return autograd::record("Lab5SyncBatchNormBackward", y, inputs, {x64, stats.mean, stats.var, w},
                          [pg, count, eps, has_w, has_b](const Tensor& dy, const autograd::Saved& s,
                                                         const autograd::Needs& /*needs*/) {
                            // Every rank runs this for every layer it ran forward, so the all-reduces pair up.
                            const BatchStats stats{s[1], s[2], count};
                            BackwardResult r =
                                sync_batch_norm_backward(as_f64(dy), s[0], stats, s[3], eps, *pg);
                            autograd::Grads grads{ops::to(r.dx, dy.dtype())};
                            if (has_w) grads.push_back(ops::to(r.dweight, dy.dtype()));
                            if (has_b) grads.push_back(ops::to(r.dbias, dy.dtype()));
                            return grads;
                          });
}

SyncBatchNorm::SyncBatchNorm(const nn::BatchNorm2d& bn, std::shared_ptr<ProcessGroup> pg)
    : nn::BatchNorm2d(bn, ShareState{}), process_group(std::move(pg)) {}

Tensor SyncBatchNorm::forward(const Tensor& x) {
  // As the library's: eval normalises with the running statistics, equal on every rank.
  if (!is_training()) return nn::BatchNorm2d::forward(x);
  DDP_CHECK(x.dim() == 4 && x.size(1) == num_features,
            "lab5::SyncBatchNorm(" << num_features << "): expected input [N, " << num_features
                                   << ", H, W], got " << shape_str(x.shape()));
  if (track_running_stats) {
    autograd::NoGradGuard no_grad;
    ops::add_(num_batches_tracked, 1.0);
  }
  return lab5::sync_batch_norm(x, running_mean, running_var, weight, bias, momentum, eps,
                               process_group);
}

int convert_sync_batchnorm(const nn::ModulePtr& module, const std::shared_ptr<ProcessGroup>& pg) {
  int replaced = 0;
  // A copy of the list: replace_module rewrites entries of the original.
  const auto children = module->named_children();
  for (const auto& [name, child] : children) {
    auto* bn = dynamic_cast<nn::BatchNorm2d*>(child.get());
    if (bn != nullptr && dynamic_cast<SyncBatchNorm*>(bn) == nullptr) {
      module->replace_module(name, std::make_shared<SyncBatchNorm>(*bn, pg));
      ++replaced;
    } else {
      replaced += convert_sync_batchnorm(child, pg);
    }
  }
  return replaced;
}

}  // namespace lab5
