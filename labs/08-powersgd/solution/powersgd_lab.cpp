// Lab 8, the reference solution (course staff). The library's version, which batches all the P's
// of a bucket into one all-reduce and overlaps it with backward, is
// ddp/comm_hooks/powerSGD_hook.cpp (powerSGD_hook_naive is the closest to this file).
#include <cmath>

#include "powersgd_lab.h"
#include "tensor/ops.h"

namespace lab8 {

using namespace ddplab;

void orthogonalize_(const Tensor& matrix, double epsilon) {
  const int64_t cols = matrix.size(1);
  for (int64_t k = 0; k < cols; ++k) {
    Tensor col = ops::narrow(matrix, 1, k, 1);
    const double norm = std::sqrt(ops::sum_all(ops::square(col)));
    if (norm + epsilon > 0) ops::mul_(col, 1.0 / (norm + epsilon));  // a zero column stays zero
    for (int64_t later = k + 1; later < cols; ++later) {
      Tensor other = ops::narrow(matrix, 1, later, 1);
      ops::sub_(other, col, ops::sum_all(ops::mul(col, other)));  // other -= (col . other) col
    }
  }
}

void powersgd_step(distributed::CommHookState& comm, const Tensor& m, MatrixMemory& memory,
                   double epsilon) {
  ops::add_(m, memory.error);  // error feedback
  // Last step's Q is M_avg^T P, whose columns are not orthonormal; orthonormal ones keep M Q well
  // conditioned for the Gram-Schmidt below. The span, all the result depends on, is unchanged.
  Tensor q = memory.q;
  orthogonalize_(q, epsilon);
  Tensor p = ops::mm(m, q);
  all_reduce_mean(comm, p);
  orthogonalize_(p, epsilon);
  q = ops::mm(ops::transpose(m, 0, 1), p);
  all_reduce_mean(comm, q);
  const Tensor approx = ops::mm(p, ops::transpose(q, 0, 1));
  memory.error = ops::sub(m, approx);
  ops::copy_(m, approx);
  memory.q = q;  // warm start
}

distributed::FuturePtr powersgd_hook(PowerSGDState& state, distributed::GradBucket& bucket) {
  if (state.iter < state.start_powerSGD_iter) {
    all_reduce_mean(state, bucket.buffer());
  } else {
    const auto& grads = bucket.gradients();
    std::vector<int64_t> ranks;
    std::vector<Tensor> fresh;
    std::vector<int64_t> fresh_ranks;
    std::vector<const void*> fresh_keys;
    for (size_t i = 0; i < grads.size(); ++i) {
      ranks.push_back(
          compression_rank(grads[i], state.matrix_approximation_rank, state.min_compression_rate));
      const void* key = bucket.parameters()[i].impl_ptr().get();
      if (ranks[i] > 0 && state.memory.count(key) == 0) {
        fresh.push_back(grads[i]);
        fresh_ranks.push_back(ranks[i]);
        fresh_keys.push_back(key);
      }
    }
    if (!fresh.empty()) {
      std::vector<MatrixMemory> made = new_memories(state.rng, fresh, fresh_ranks);
      for (size_t k = 0; k < made.size(); ++k) state.memory[fresh_keys[k]] = made[k];
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      if (ranks[i] == 0) {
        all_reduce_mean(state, grads[i]);
      } else {
        const void* key = bucket.parameters()[i].impl_ptr().get();
        powersgd_step(state, as_matrix(grads[i]), state.memory.at(key),
                      state.orthogonalization_epsilon);
      }
    }
  }
  if (bucket.is_last()) ++state.iter;
  return distributed::Future::completed(bucket.buffer());
}

}  // namespace lab8
