// Lab 5, your code: replace each LAB_TODO (README.md; the contracts are in sync_bn_lab.h).
// Check your work with `scripts/lab 5`. Tensors here are float64 and contiguous: read and write
// them through data_ptr<double>(); spatial_size(x) is H * W. A collective on `pg`:
//   pg.all_reduce(buffer, distributed::ReduceOp::Sum)->wait();   // in place, every rank's sum
#include "sync_bn_lab.h"
#include "lab_todo.h"
#include "tensor/ops.h"

namespace lab5 {

using namespace ddplab;

BatchStats global_batch_stats(const Tensor& x, const Tensor& shift, ProcessGroup& pg) {
  LAB_TODO("part 1: global_batch_stats (one all_reduce of the count and the shifted sums)");
}

Tensor normalize(const Tensor& x, const BatchStats& stats, const Tensor& weight, const Tensor& bias,
                 double eps) {
  LAB_TODO("part 2: normalize");
}

void update_running_stats(const Tensor& running_mean, const Tensor& running_var,
                          const BatchStats& stats, double momentum) {
  LAB_TODO("part 2: update_running_stats (unbiased running_var)");
}

BackwardResult sync_batch_norm_backward(const Tensor& dy, const Tensor& x, const BatchStats& stats,
                                        const Tensor& weight, double eps, ProcessGroup& pg) {
  LAB_TODO("part 3: sync_batch_norm_backward (one all_reduce of sum(dy) and sum(dy * xhat))");
}

}  // namespace lab5
