// PowerSGD: low-rank gradient compression as a DDP communication hook (Vogels, Karimireddy and
// Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
// NeurIPS 2019), with the options and defaults of PyTorch's powerSGD_hook.
//
//   auto state = std::make_shared<distributed::PowerSGDState>(pg);
//   state->matrix_approximation_rank = 2;
//   state->start_powerSGD_iter = 10;
//   ddp->register_comm_hook(state, distributed::powerSGD_hook);
//
// Each gradient of a bucket viewed as an n x m matrix M (a conv weight [out, in, kh, kw] as
// out x in*kh*kw) travels as two thin matrices, P (n x r) and Q (m x r): (n + m) * r numbers
// instead of n * m. Vectors (biases, BatchNorm weights) and matrices too small to gain
// min_compression_rate are all-reduced as they are. How and why: Note [PowerSGD] in
// powerSGD_hook.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "ddp/comm_hook.h"
#include "tensor/random.h"

namespace ddplab::distributed {

struct PowerSGDState : CommHookState {
  explicit PowerSGDState(std::shared_ptr<ProcessGroup> process_group, uint64_t random_seed = 0);

  // Options (PyTorch's names and defaults); the same on every rank.
  int64_t matrix_approximation_rank = 1;  // r: columns of P and Q
  int64_t start_powerSGD_iter = 1000;     // plain all-reduce for the first iterations
  double min_compression_rate = 2;        // compress only when n*m > rate * (n + m) * r
  bool use_error_feedback = true;         // add what compression lost to the next gradient
  bool warm_start = true;                 // start each power iteration from the last Q
  double orthogonalization_epsilon = 0;   // added to column norms in Gram-Schmidt

  // Iterations seen so far (counted on each iteration's last bucket).
  int64_t iter = 0;

  // What one bucket carries from one iteration to the next.
  struct BucketMemory {
    std::vector<const void*> params;  // which parameters the bucket held (a rebuild changes it)
    Tensor error;                     // error feedback: local input minus what was applied
    Tensor p, q;                      // every compressed matrix's P and Q, back to back
  };
  std::map<size_t, BucketMemory> memory;  // by bucket index
  Generator rng;                          // draws the first Q: the same on every rank

  void maybe_increase_iter(const GradBucket& bucket) {
    if (bucket.is_last()) ++iter;
  }
};

// The hook: plain all-reduce while iter < start_powerSGD_iter, then PowerSGD. One all-reduce for
// the bucket's uncompressed tensors and one for all its P's is issued at once; all the Q's follow
// in one more all-reduce when the Reducer waits for the bucket.
FuturePtr powerSGD_hook(PowerSGDState& state, GradBucket& bucket);

// The same algorithm written one matrix at a time, every all-reduce waited for on the spot:
// 2 all-reduces per matrix plus one per uncompressed tensor, no overlap with backward. For
// reading and for checking powerSGD_hook (they give the same gradients).
FuturePtr powerSGD_hook_naive(PowerSGDState& state, GradBucket& bucket);

// Gram-Schmidt on the columns of a 2-D tensor, in place: afterwards they are orthonormal (a
// column that is zero, or becomes zero, stays zero instead of dividing by 0).
void orthogonalize_(const Tensor& matrix, double epsilon = 0);

}  // namespace ddplab::distributed
