// Lab 8: PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) as a DDP communication hook. The
// three functions the student writes (starter/, graded by grader/grader.cpp against hand-computed
// cases and the library's distributed::powerSGD_hook); solution/ is the course staff's version.
// The helpers at the end are given (helpers.cpp): they are plumbing, not the lesson.
// Handout: README.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "ddp/comm_hook.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace lab8 {

using ddplab::Generator;
using ddplab::Tensor;
namespace distributed = ddplab::distributed;

// Part 1. Gram-Schmidt on the columns of the 2-D float tensor `matrix`, in place, left to right:
// divide column k by (its norm + epsilon), then subtract its component from every later column.
// Afterwards the columns are orthonormal and the first k columns span what the first k spanned
// before. A column whose norm is 0 (or becomes 0: it depended on the earlier ones) must stay 0,
// even with epsilon = 0: never divide by zero.
void orthogonalize_(const Tensor& matrix, double epsilon);

// What PowerSGD keeps for one compressed gradient from one training step to the next.
struct MatrixMemory {
  Tensor error;  // n x m: what the last step dropped from this rank's input (error feedback)
  Tensor q;      // m x r: the last step's averaged Q (warm start); r is the rank of compression
};

// Part 2. One PowerSGD step for one gradient M, on every rank at once. `m` is this rank's local
// gradient seen as an n x m float32 matrix (a view into the bucket: write the result into it);
// all communication goes through all_reduce_mean(comm, ...) below, which counts the bytes:
//   M += memory.error                  error feedback: add back what the last step dropped
//   orthogonalize_(memory.q)           warm start from the last step's Q, made orthonormal
//   P = M Q                            n x r
//   P = mean of P over the ranks       all-reduce #1: n r numbers
//   orthogonalize_(P)
//   Q = M^T P                          m x r
//   Q = mean of Q over the ranks       all-reduce #2: m r numbers; now Q = M_avg^T P
//   memory.error = M - P Q^T           what this step drops, added back next step
//   M = P Q^T                          the result: the same on every rank
//   memory.q = Q                       kept for the next step
// `epsilon` is passed to orthogonalize_.
void powersgd_step(distributed::CommHookState& comm, const Tensor& m, MatrixMemory& memory,
                   double epsilon);

// The hook's state (PyTorch's PowerSGDState, cut down). The same options on every rank.
struct PowerSGDState : distributed::CommHookState {
  explicit PowerSGDState(std::shared_ptr<distributed::ProcessGroup> process_group,
                         uint64_t random_seed = 0)
      : CommHookState(std::move(process_group)), rng(random_seed) {}

  int64_t matrix_approximation_rank = 1;  // r
  int64_t start_powerSGD_iter = 10;       // plain averaging for the first steps
  double min_compression_rate = 2;        // see compression_rank below
  double orthogonalization_epsilon = 0;   // passed to orthogonalize_

  int64_t iter = 0;  // training steps seen: +1 on each step's last bucket (bucket.is_last())
  // By parameter (GradBucket::parameters()[i].impl_ptr().get()), so that it survives the
  // Reducer's rebuild of its buckets after the first step.
  std::map<const void*, MatrixMemory> memory;
  Generator rng;  // draws the first Q of each matrix: the same seed on every rank
};

// Part 3. The communication hook (register it with DDP::register_comm_hook(state,
// lab8::powersgd_hook)). It averages the bucket over the ranks and returns it, completed:
//   - while state.iter < start_powerSGD_iter: the whole buffer with one all_reduce_mean;
//   - then, for each gradient of the bucket, in order: compression_rank(...) == 0: one
//     all_reduce_mean of it as it is; otherwise one powersgd_step on its as_matrix() view with
//     that parameter's memory. The gradients of the bucket that have no memory yet get theirs
//     from one call of new_memories (in bucket order) before the first powersgd_step.
//   - on the bucket that is_last(), ++state.iter.
distributed::FuturePtr powersgd_hook(PowerSGDState& state, distributed::GradBucket& bucket);

// --- Given (helpers.cpp) ---------------------------------------------------------------------

// Divides `t` by the world size and all-reduces (sums) it through `comm`, which adds its bytes to
// comm.bytes_all_reduced; returns when the sum is in `t`.
void all_reduce_mean(distributed::CommHookState& comm, const Tensor& t);

// A gradient as the n x m matrix PowerSGD compresses: n = size(0), m = the rest (a conv weight
// [out, in, kh, kw] becomes out x in*kh*kw). A view: writing it writes the gradient.
Tensor as_matrix(const Tensor& grad);

// The rank at which PowerSGD compresses `grad`, or 0 when it is sent as it is: vectors (biases,
// BatchNorm weights) and matrices that would not shrink enough, (n + m) r * min_compression_rate
// >= n m, where r = min(n, m, matrix_approximation_rank). The library's rule.
int64_t compression_rank(const Tensor& grad, int64_t matrix_approximation_rank,
                         double min_compression_rate);

// First-step memories for the gradients `grads`, compressed at `ranks`: zero errors, and Q's
// (m x r each) drawn from `rng` in ONE normal draw for all of them back to back, as
// distributed::powerSGD_hook draws a bucket's Q's (so your hook can be compared with it). Every
// rank's rng has the same seed, so every rank starts from the same Q's.
std::vector<MatrixMemory> new_memories(Generator& rng, const std::vector<Tensor>& grads,
                                       const std::vector<int64_t>& ranks);

}  // namespace lab8
