// Lab 8's given helpers (powersgd_lab.h): the plumbing around the PowerSGD step.
#include <algorithm>

#include "powersgd_lab.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace lab8 {

using namespace ddplab;

void all_reduce_mean(distributed::CommHookState& comm, const Tensor& t) {
  // Divide first, as the default hook does: every rank's addend is already small, so the sum
  // cannot overflow where the average would not.
  ops::mul_(t, 1.0 / comm.process_group->size());
  comm.all_reduce(t)->wait();
}

Tensor as_matrix(const Tensor& grad) {
  DDP_CHECK(grad.dim() >= 2, "as_matrix: expected a gradient with 2 or more dimensions, got "
                                 << shape_str(grad.shape()));
  return ops::view(grad, {grad.size(0), grad.numel() / grad.size(0)});
}

int64_t compression_rank(const Tensor& grad, int64_t matrix_approximation_rank,
                         double min_compression_rate) {
  if (grad.dim() < 2 || grad.numel() == 0) return 0;
  const int64_t n = grad.size(0), m = grad.numel() / n;
  const int64_t r = std::min({n, m, matrix_approximation_rank});
  const bool worth_it =
      static_cast<double>((n + m) * r) * min_compression_rate < static_cast<double>(n * m);
  return worth_it ? r : 0;
}

std::vector<MatrixMemory> new_memories(Generator& rng, const std::vector<Tensor>& grads,
                                       const std::vector<int64_t>& ranks) {
  DDP_CHECK(grads.size() == ranks.size(),
            "new_memories: " << grads.size() << " gradients but " << ranks.size() << " ranks");
  int64_t q_numel = 0;
  for (size_t k = 0; k < grads.size(); ++k) q_numel += as_matrix(grads[k]).size(1) * ranks[k];
  Tensor qs = ops::empty({q_numel}, grads.empty() ? TensorOptions{} : grads[0].options());
  ops::normal_(qs, 0, 1, &rng);
  std::vector<MatrixMemory> out;
  int64_t at = 0;
  for (size_t k = 0; k < grads.size(); ++k) {
    const Tensor m = as_matrix(grads[k]);
    const int64_t len = m.size(1) * ranks[k];
    // A copy, not a view of `qs`: each matrix's Q then lives on its own.
    out.push_back({ops::zeros_like(m),
                   ops::clone(ops::view(ops::narrow(qs, 0, at, len), {m.size(1), ranks[k]}))});
    at += len;
  }
  return out;
}

}  // namespace lab8
